"""The LLM judge and the reward scorer with doubles at the seams: score parsing, prompt rendering,
the weighted reward, and judge failures kept out of the loss (never a reward of 0)."""

from __future__ import annotations

import anyio
import pytest

from agentrl.engine.loop.batching import BatchSettings, batch_samples
from agentrl.engine.rewards.judge import (
    JudgeSettings,
    LLMJudge,
    judge_fields,
    parse_score,
    render_judge_prompt,
)
from agentrl.engine.rewards.reward_model import ScriptedRewardModel
from agentrl.engine.rewards.scoring import EpisodeScorer, RewardSettings
from agentrl.engine.testing import ScriptedGenerator
from agentrl.engine.common.trajectory import Trajectory
from agentrl.errors import RewardModelError
from agentrl.models.loading import load_tokenizer

ROW = {"question": "Compute 12*34+5.", "answer": "413"}
SETTINGS = JudgeSettings(template="Q: {question}\nA: {response}\nRef: {answer}\nScore 0-10:", timeout_s=2.0)


# ---------------------------------------------------------------------- pure pieces
@pytest.mark.parametrize(("text", "expected"), [
    ("Score: 7", 0.7),
    ("The answer is right. score = 10", 1.0),
    ("Score: 2 at first... on reflection Score: 8.5", 0.85),  # the last match counts
    ("Score:0", 0.0),
])
def test_parse_score_maps_the_range_to_unit_interval(text, expected):
    assert parse_score(text, JudgeSettings()) == pytest.approx(expected)


def test_parse_score_with_another_range_and_a_pattern_without_groups():
    s = JudgeSettings(score_pattern=r"-?\d+", score_min=-2, score_max=2)
    assert parse_score("verdict -1", s) == pytest.approx(0.25)


@pytest.mark.parametrize(("text", "why"), [
    ("I think it is good.", "no score in its answer"),
    ("", "no score in its answer"),
    ("Score: 12", "outside [0, 10]"),
    ("Score: -1", "outside [0, 10]"),
])
def test_parse_score_refuses_garbage_and_out_of_range_in_words(text, why):
    with pytest.raises(RewardModelError, match=r"^judge: ") as info:
        parse_score(text, JudgeSettings())
    assert why in str(info.value)


def test_render_fills_row_fields_and_episode_text_and_leaves_other_braces():
    text = render_judge_prompt("Q: {question} A: {response} (write \\boxed{x}; {unknown})", {"question": "2+2?", "response": "4"})
    assert text == "Q: 2+2? A: 4 (write \\boxed{x}; {unknown})"


def _episode(tok, prompt: str, turns: list[tuple[str, str]], reward: float = 1.0, status: str = "ok", sample: int = 0) -> Trajectory:
    """An episode of ``prompt`` then (model text, tool output) turns, token by token."""
    tokens = tok.encode(prompt, add_special_tokens=False)
    mask = [0] * len(tokens)
    for said, shown in turns:
        ids = tok.encode(said, add_special_tokens=False)
        tokens += ids
        mask += [1] * len(ids)
        obs = tok.encode(shown, add_special_tokens=False)
        tokens += obs
        mask += [0] * len(obs)
    n = len(tokens)
    return Trajectory(tokens=tokens, loss_mask=mask, behaviour_logprobs=[0.0] * n, versions=[0 if m else -1 for m in mask],
                      reward=reward, group_id="g", sample_index=sample, prompt_index=0, status=status)


def test_judge_fields_response_is_the_last_turn_transcript_everything_after_the_prompt(tiny_calc_model):
    tok = load_tokenizer(str(tiny_calc_model))
    t = _episode(tok, "<|im_start|>user\nCompute 12*34+5.<|im_end|>\n<|im_start|>assistant\n",
                 [("<code>12*34+5</code>", "\n413\n"), ("\\boxed{413}<|im_end|>", "")])
    fields = judge_fields(tok, t, ROW)
    assert fields["response"] == "\\boxed{413}"
    assert fields["transcript"].startswith("<code>12*34+5</code>") and "413" in fields["transcript"]
    assert "Compute" not in fields["transcript"]  # the prompt is the row's, not the transcript's
    assert fields["question"] == ROW["question"] and fields["answer"] == "413"


# ---------------------------------------------------------------------- the judge over a generator
def _judge_script(answer: str):
    def script(prompt: str, sampling: dict) -> str:
        assert "Q: Compute 12*34+5." in prompt and "Ref: 413" in prompt  # rendered, in the chat template
        assert sampling["temperature"] == 0.0 and sampling["max_tokens"] == SETTINGS.max_tokens
        return answer
    return script


def test_llm_judge_renders_with_the_chat_template_and_parses(tiny_calc_model):
    tok = load_tokenizer(str(tiny_calc_model))
    gen = ScriptedGenerator(tok, _judge_script("Score: 9"))
    judge = LLMJudge(SETTINGS, tok, gen.generate)
    score, text = anyio.run(judge.score, {**ROW, "response": "\\boxed{413}"})
    assert score == pytest.approx(0.9) and text == "Score: 9"
    prompt = tok.decode(gen.calls[0][0], skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>user\n") and prompt.rstrip().endswith("<|im_start|>assistant")


def test_structured_output_regex_goes_into_the_sampling():
    assert JudgeSettings(output_regex="Score: [0-9]").sampling()["structured_outputs"] == {"regex": "Score: [0-9]"}
    assert "structured_outputs" not in JudgeSettings().sampling()


# ---------------------------------------------------------------------- the scorer
def _group(tok, n: int = 3) -> list[Trajectory]:
    return [_episode(tok, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", [(f"\\boxed{{41{i}}}<|im_end|>", "")],
                     reward=float(i == 3), sample=i) for i in range(n)]


def test_reward_is_the_weighted_sum_and_the_parts_are_kept(tiny_calc_model):
    tok = load_tokenizer(str(tiny_calc_model))
    # the judge likes answers ending in 3 (score 10) and not the others (score 5)
    gen = ScriptedGenerator(tok, lambda prompt, s: "Score: 10" if "413" in prompt.split("A: ")[-1].split("Ref:")[0] else "Score: 5")
    rm = ScriptedRewardModel(lambda item: -2.0 if "413" in item[1]["content"] else 0.5)
    scorer = EpisodeScorer(RewardSettings(env_weight=2.0, judge_weight=0.5, rm_weight=0.25), tokenizer=tok,
                           judge=LLMJudge(SETTINGS, tok, gen.generate), reward_model=rm)
    group = _group(tok, 4)
    for t in group:
        anyio.run(scorer.score, t, ROW)
    by = {t.sample_index: t for t in group}
    assert by[3].reward == pytest.approx(2.0 * 1.0 + 0.5 * 1.0 + 0.25 * -2.0)
    assert by[0].reward == pytest.approx(2.0 * 0.0 + 0.5 * 0.5 + 0.25 * 0.5)
    assert by[3].metrics["env_reward"] == 1.0 and by[3].metrics["judge_score"] == 1.0 and by[3].metrics["rm_score"] == -2.0
    assert by[3].info["judge_answer"] == "Score: 10"
    # the reward model saw [user: the row's question, assistant: the model's last turn]
    assert rm.calls[0][0] == [{"role": "user", "content": ROW["question"]}, {"role": "assistant", "content": "\\boxed{410}"}]
    _, stats = batch_samples([group], BatchSettings())
    assert stats["reward_failures_batch"] == 0 and stats["judge_score_mean"] == pytest.approx((1.0 + 0.5 * 3) / 4)


class _SlowGenerator:
    async def generate(self, ids, params):
        await anyio.sleep(30)
        raise AssertionError("never answers in time")


class _BrokenGenerator:
    async def generate(self, ids, params):
        raise RuntimeError("actor died")


@pytest.mark.parametrize(("judge_gen", "why"), [
    ("slow", "judge: no answer within 0.2 s"),
    ("garbage", "judge: no score in its answer"),
    ("range", "judge: the score 11 is outside [0, 10]"),
    ("broken", "judge: the generator failed: RuntimeError: actor died"),
])
def test_a_judge_failure_is_an_infra_failure_counted_and_never_a_zero_reward(tiny_calc_model, judge_gen, why):
    tok = load_tokenizer(str(tiny_calc_model))
    settings = JudgeSettings(template=SETTINGS.template, timeout_s=0.2)
    gen = {
        "slow": _SlowGenerator().generate,
        "garbage": ScriptedGenerator(tok, lambda p, s: "looks fine to me").generate,
        "range": ScriptedGenerator(tok, lambda p, s: "Score: 11").generate,
        "broken": _BrokenGenerator().generate,
    }[judge_gen]
    scorer = EpisodeScorer(RewardSettings(judge_weight=1.0), tokenizer=tok, judge=LLMJudge(settings, tok, gen))
    good = _group(tok, 2)  # scored by a judge that works
    ok_scorer = EpisodeScorer(RewardSettings(judge_weight=1.0), tokenizer=tok,
                              judge=LLMJudge(settings, tok, ScriptedGenerator(tok, lambda p, s: "Score: 4").generate))
    failed = _episode(tok, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", [("\\boxed{413}<|im_end|>", "")], reward=1.0, sample=2)
    for t in good:
        anyio.run(ok_scorer.score, t, ROW)
    anyio.run(scorer.score, failed, ROW)
    assert failed.status == "infra_failure" and not failed.trainable
    assert failed.info["reward_failure"] == "judge" and failed.info["error"].startswith(why), failed.info["error"]
    assert failed.reward == 1.0  # left as the environment gave it: no 0 was written
    assert failed.info["text"]  # decoded for samples.jsonl
    samples, stats = batch_samples([[*good, failed]], BatchSettings())
    assert stats["reward_failures_batch"] == 1 and stats["infra_failures_batch"] == 1
    assert {s["id"] for s in samples} == {"g/0", "g/1"}  # the failed episode never reaches the loss


def test_a_reward_model_timeout_is_an_infra_failure(tiny_calc_model):
    tok = load_tokenizer(str(tiny_calc_model))
    scorer = EpisodeScorer(RewardSettings(rm_weight=1.0, rm_timeout_s=0.1), tokenizer=tok,
                           reward_model=ScriptedRewardModel(lambda item: 1.0, delay_s=5.0))
    (t,) = _group(tok, 1)
    anyio.run(scorer.score, t, ROW)
    assert t.status == "infra_failure" and t.info["reward_failure"] == "reward_model"
    assert t.info["error"] == "reward model: no score within 0.1 s"


def test_untrainable_episodes_are_not_scored(tiny_calc_model):
    tok = load_tokenizer(str(tiny_calc_model))
    gen = ScriptedGenerator(tok, lambda p, s: "Score: 10")
    scorer = EpisodeScorer(RewardSettings(judge_weight=1.0), tokenizer=tok, judge=LLMJudge(SETTINGS, tok, gen.generate))
    t = _episode(tok, "q", [("a", "")], reward=0.0, status="infra_failure")
    anyio.run(scorer.score, t, ROW)
    assert gen.calls == [] and t.reward == 0.0 and "judge_score" not in t.metrics


# ---------------------------------------------------------------------- in the rollout worker
def test_rollout_worker_judges_with_the_policy_generators_and_evaluation_does_not(tiny_calc_model):
    """``judge.model = "policy"``: the judge prompt goes to the generator the group played on;
    evaluation groups (``score=False``) keep the environment's reward alone."""
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.engine.rewards.scoring_bundle import ScoringSettings
    from agentrl.sandbox.testing import FakeSandbox

    tok = load_tokenizer(str(tiny_calc_model))

    def script(prompt: str, sampling: dict) -> str:
        return "Score: 6" if "Score 0-10:" in prompt else "\\boxed{413}"

    gen = ScriptedGenerator(tok, script)
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()},
            sandbox_kind=None, sandbox_kwargs={}, sampling={}, max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        scoring=ScoringSettings(reward=RewardSettings(env_weight=1.0, judge_weight=0.5), judge=SETTINGS),
        generators=[gen], max_concurrent_episodes=8, generate_timeout_s=10,
    )
    group = anyio.run(worker.run_group, ROW, 0, "g0", 2)
    assert [t.status for t in group] == ["ok", "ok"]
    for t in group:
        assert t.metrics["env_reward"] == 1.0 and t.metrics["judge_score"] == pytest.approx(0.6)
        assert t.reward == pytest.approx(1.0 + 0.5 * 0.6)
    judge_calls = [c for c in gen.calls if c[1].get("temperature") == 0.0 and "seed" not in c[1]]
    assert len(judge_calls) == 2 and len(gen.calls) == 4
    evaluated = anyio.run(lambda: worker.run_group(ROW, 1, "eval1", 1, {"temperature": 0.0}, score=False))
    assert evaluated[0].reward == 1.0 and "judge_score" not in evaluated[0].metrics
    assert len(gen.calls) == 5
