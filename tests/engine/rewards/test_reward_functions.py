"""The user's reward functions (``[reward] functions``): loaded from ``module:function`` with
errors naming the recipe key, called with the episode's completion, messages, row and
environment reward (sync or async), weighted into the reward beside the judge and the reward
model, and every failure (a raise, a non-number, NaN, a timeout) an infrastructure failure kept
out of the loss, as for the judge."""

from __future__ import annotations

import sys
import textwrap

import anyio
import pytest

from agentrl.engine.loop.batching import BatchSettings, batch_samples
from agentrl.engine.rewards.functions import RewardFunction, RewardFunctionSpec, function_specs, load_reward_function
from agentrl.engine.rewards.judge import LLMJudge
from agentrl.engine.rewards.reward_model import ScriptedRewardModel
from agentrl.engine.rewards.scoring import EpisodeScorer, RewardSettings
from agentrl.engine.testing import ScriptedGenerator
from agentrl.errors import ConfigError
from agentrl.models.loading import load_tokenizer
from tests.engine.rewards.test_judge import ROW, SETTINGS, _episode

USER_REWARDS = '''
import asyncio
import time

seen = []


def brevity(completion):
    """1 for an answer of at most 12 characters, else 0."""
    return float(len(completion) <= 12)


async def mentions_answer(completion, row):
    await asyncio.sleep(0)
    return 1.0 if row["answer"] in completion else 0.0


def everything(**episode):
    seen.append(episode)
    return 0.25


def integer(completion):
    return 2


def broken(completion):
    raise ValueError("no answer to grade")


def text(completion):
    return "good"


def boolean(completion):
    return True


def nan(completion):
    return float("nan")


def sleepy(completion):
    time.sleep(3)
    return 1.0


async def async_sleepy(completion):
    await asyncio.sleep(30)
    return 1.0


def wants_prompts(prompts, completions):
    return [0.0]


not_a_function = 3
'''


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    """A user's module ``user_rewards`` on ``sys.path`` (as the CLI puts the recipe's directory)."""
    (tmp_path / "user_rewards.py").write_text(USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_rewards", None)
    import user_rewards

    yield user_rewards
    sys.modules.pop("user_rewards", None)


def _fn(name: str, weight: float = 1.0, timeout_s: float = 5.0) -> RewardFunction:
    return RewardFunction(function_specs([(f"user_rewards:{name}", weight, timeout_s)])[0])


ANSWERED = "<|im_start|>user\nCompute 12*34+5.<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------- loading
@pytest.mark.parametrize(("ref", "why"), [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz': ModuleNotFoundError"),
    ("user_rewards:missing", "module 'user_rewards' has no attribute 'missing'"),
    ("user_rewards:not_a_function", "'not_a_function' is a int, not a function"),
    ("user_rewards:wants_prompts", "it requires 'prompts', which a reward function is never given"),
    ("user_rewards", "expected 'module:function'"),
])
def test_a_function_that_does_not_load_is_a_config_error_naming_the_key(user_rewards, ref, why):
    with pytest.raises(ConfigError) as err:
        load_reward_function(ref, "reward.functions[2].fn")
    assert str(err.value).startswith(f"reward.functions[2].fn: {ref!r}: ") and why in str(err.value), str(err.value)


def test_specs_name_their_key_and_a_metric_of_their_own():
    specs = function_specs([("a:brevity", 0.5, 9.0), ("b:brevity", 1.0, 60.0), ("a:polite", 2.0, 60.0)])
    assert [s.key for s in specs] == ["reward.functions[0].fn", "reward.functions[1].fn", "reward.functions[2].fn"]
    assert [s.metric for s in specs] == ["fn/brevity", "fn/brevity#2", "fn/polite"]
    assert specs[0] == RewardFunctionSpec("a:brevity", 0.5, 9.0, "reward.functions[0].fn", "fn/brevity")


def test_a_function_is_given_only_what_it_asks_for(user_rewards):
    assert _fn("brevity").wants == ("completion",)
    assert _fn("mentions_answer").wants == ("completion", "row") and _fn("mentions_answer").is_async
    assert _fn("everything").wants == ("completion", "messages", "row", "env_reward")


# ---------------------------------------------------------------------- the combination
def test_functions_combine_with_env_judge_and_reward_model_by_weight(tiny_calc_model, user_rewards):
    tok = load_tokenizer(str(tiny_calc_model))
    gen = ScriptedGenerator(tok, lambda prompt, s: "Score: 10" if "413" in prompt.split("A: ")[-1].split("Ref:")[0] else "Score: 5")
    rm = ScriptedRewardModel(lambda item: 0.5)
    functions = [_fn("brevity", 0.5), _fn("mentions_answer", 2.0), _fn("everything", -4.0)]
    scorer = EpisodeScorer(
        RewardSettings(env_weight=1.0, judge_weight=0.5, rm_weight=0.25, functions=tuple(f.spec for f in functions)),
        tokenizer=tok, judge=LLMJudge(SETTINGS, tok, gen.generate), reward_model=rm, functions=functions,
    )
    assert scorer.wants_messages
    right = _episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=1.0, sample=0)
    wrong = _episode(tok, ANSWERED, [("the answer is \\boxed{999}<|im_end|>", "")], reward=0.0, sample=1)
    conversation = [{"role": "user", "content": "Compute 12*34+5."}, {"role": "assistant", "content": "\\boxed{413}"}]
    right.info["messages"] = conversation
    for t in (right, wrong):
        anyio.run(scorer.score, t, ROW)
    # env 1 + judge 0.5*1 + rm 0.25*0.5 + brevity 0.5*1 + mentions 2*1 + everything -4*0.25
    assert right.reward == pytest.approx(1.0 + 0.5 + 0.125 + 0.5 + 2.0 - 1.0)
    assert wrong.reward == pytest.approx(0.0 + 0.25 + 0.125 + 0.0 + 0.0 - 1.0)
    assert right.metrics["fn/brevity"] == 1.0 and right.metrics["fn/mentions_answer"] == 1.0 and wrong.metrics["fn/brevity"] == 0.0
    # the episode as the function saw it: the last turn, the conversation, the row, the environment's reward
    first = user_rewards.seen[0]
    assert first == {"completion": "\\boxed{413}", "messages": conversation, "row": ROW, "env_reward": 1.0}
    assert "messages" not in right.info  # consumed: the conversation does not travel on with the episode
    _, stats = batch_samples([[right, wrong]], BatchSettings())
    assert stats["fn/brevity_mean"] == 0.5 and stats["fn/everything_mean"] == 0.25 and stats["reward_failures_batch"] == 0


def test_functions_alone_make_the_scorer_active_and_an_int_counts(tiny_calc_model, user_rewards):
    tok = load_tokenizer(str(tiny_calc_model))
    functions = [_fn("integer", 0.5)]
    scorer = EpisodeScorer(RewardSettings(functions=tuple(f.spec for f in functions)), tokenizer=tok, functions=functions)
    assert scorer.active and not scorer.wants_messages
    t = _episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=1.0)
    anyio.run(scorer.score, t, ROW)
    assert t.status == "ok" and t.reward == pytest.approx(1.0 + 0.5 * 2)


def test_the_scorer_loads_the_functions_of_its_settings(tiny_calc_model, user_rewards):
    tok = load_tokenizer(str(tiny_calc_model))
    scorer = EpisodeScorer(RewardSettings(functions=function_specs([("user_rewards:brevity", 3.0, 5.0)])), tokenizer=tok)
    t = _episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=0.0)
    anyio.run(scorer.score, t, ROW)
    assert t.reward == 3.0


# ---------------------------------------------------------------------- failures
@pytest.mark.parametrize(("name", "why"), [
    ("broken", "reward function user_rewards:broken raised ValueError: no answer to grade (at "),
    ("text", "reward function user_rewards:text returned 'good' (str); expected a float"),
    ("boolean", "reward function user_rewards:boolean returned True (bool); expected a float"),
    ("nan", "reward function user_rewards:nan returned nan, not a finite number"),
    ("sleepy", "reward function user_rewards:sleepy: no value within 0.3 s (reward.functions[0].timeout_s)"),
    ("async_sleepy", "reward function user_rewards:async_sleepy: no value within 0.3 s (reward.functions[0].timeout_s)"),
])
def test_a_function_failure_is_an_infra_failure_counted_and_never_a_zero_reward(tiny_calc_model, user_rewards, name, why):
    tok = load_tokenizer(str(tiny_calc_model))
    good_fns = [_fn("brevity")]
    ok_scorer = EpisodeScorer(RewardSettings(functions=tuple(f.spec for f in good_fns)), tokenizer=tok, functions=good_fns)
    bad_fns = [_fn("brevity"), _fn(name, timeout_s=0.3)]
    scorer = EpisodeScorer(RewardSettings(functions=tuple(f.spec for f in bad_fns)), tokenizer=tok, functions=bad_fns)
    good = [_episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=1.0, sample=i) for i in range(2)]
    failed = _episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=1.0, sample=2)
    for t in good:
        anyio.run(ok_scorer.score, t, ROW)
    anyio.run(scorer.score, failed, ROW)
    assert failed.status == "infra_failure" and not failed.trainable
    assert failed.info["reward_failure"] == f"fn/{name}" and failed.info["error"].startswith(why), failed.info["error"]
    assert failed.reward == 1.0  # left as the environment gave it: no 0 was written
    assert failed.metrics["fn/brevity"] == 1.0  # the parts that were computed are kept for inspection
    assert failed.info["text"]  # decoded for samples.jsonl
    samples, stats = batch_samples([[*good, failed]], BatchSettings())
    assert stats["reward_failures_batch"] == 1 and stats["infra_failures_batch"] == 1
    assert {s["id"] for s in samples} == {"g/0", "g/1"}  # the failed episode never reaches the loss


def test_a_function_and_the_judge_failing_together_are_both_named(tiny_calc_model, user_rewards):
    tok = load_tokenizer(str(tiny_calc_model))
    fns = [_fn("broken")]
    scorer = EpisodeScorer(RewardSettings(judge_weight=1.0, functions=tuple(f.spec for f in fns)), tokenizer=tok,
                           judge=LLMJudge(SETTINGS, tok, ScriptedGenerator(tok, lambda p, s: "no score").generate), functions=fns)
    t = _episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=1.0)
    anyio.run(scorer.score, t, ROW)
    assert t.status == "infra_failure" and t.info["reward_failure"] == "judge, fn/broken"
    assert "judge: no score" in t.info["error"] and "user_rewards:broken raised ValueError" in t.info["error"]


def test_untrainable_episodes_are_not_given_to_the_functions(tiny_calc_model, user_rewards):
    tok = load_tokenizer(str(tiny_calc_model))
    fns = [_fn("everything")]
    scorer = EpisodeScorer(RewardSettings(functions=tuple(f.spec for f in fns)), tokenizer=tok, functions=fns)
    t = _episode(tok, "q", [("a", "")], reward=0.0, status="infra_failure")
    t.info["messages"] = [{"role": "user", "content": "q"}]
    anyio.run(scorer.score, t, ROW)
    assert user_rewards.seen == [] and t.reward == 0.0 and "messages" not in t.info


# ---------------------------------------------------------------------- in the rollout worker
def test_rollout_worker_gives_functions_the_conversation_and_evaluation_does_not_score(tiny_calc_model, user_rewards):
    """The rollout keeps the conversation (prompt messages, the model's turns, the environment's
    answers) for a function that asks for it; evaluation groups (``score=False``) keep the
    environment's reward alone."""
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.engine.rewards.scoring_bundle import ScoringSettings
    from agentrl.sandbox.testing import FakeSandbox

    tok = load_tokenizer(str(tiny_calc_model))
    turns = iter(["<code>12*34+5</code>", "\\boxed{413}"] * 10)
    gen = ScriptedGenerator(tok, lambda prompt, s: next(turns))
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()},
            sandbox_kind=None, sandbox_kwargs={}, sampling={}, max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        scoring=ScoringSettings(reward=RewardSettings(functions=function_specs([("user_rewards:everything", 2.0, 5.0)]))),
        generators=[gen], max_concurrent_episodes=1, generate_timeout_s=10,
    )
    [t] = anyio.run(worker.run_group, ROW, 0, "g0", 1)
    assert t.status == "ok" and t.metrics["fn/everything"] == 0.25 and t.reward == pytest.approx(t.metrics["env_reward"] + 0.5)
    [seen] = user_rewards.seen
    assert [m["role"] for m in seen["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert seen["messages"][1] == {"role": "user", "content": "Compute 12*34+5."}  # the prompt
    assert seen["messages"][2:] == [
        {"role": "assistant", "content": "<code>12*34+5</code>"},
        {"role": "tool", "content": "<interpreter>\n413\n</interpreter>"},  # the environment's answer
        {"role": "assistant", "content": "\\boxed{413}"},
    ]
    assert seen["completion"] == "\\boxed{413}" and seen["row"] == ROW and seen["env_reward"] == t.metrics["env_reward"]
    assert "messages" not in t.info
    evaluated = anyio.run(lambda: worker.run_group(ROW, 1, "eval1", 1, {"temperature": 0.0}, score=False))
    assert "fn/everything" not in evaluated[0].metrics and len(user_rewards.seen) == 1


def test_a_rollout_worker_refuses_a_function_that_does_not_load_when_it_starts(tiny_calc_model):
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.engine.rewards.scoring_bundle import ScoringSettings

    with pytest.raises(ConfigError, match=r"reward.functions\[0\].fn: 'nowhere_xyz:f': cannot import module 'nowhere_xyz'"):
        RolloutWorker(
            episodes=EpisodeSettings(
                tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={}, sandbox_kind=None, sandbox_kwargs={},
                sampling={}, max_new_tokens=16, max_episode_tokens=512, seed=0,
            ),
            scoring=ScoringSettings(reward=RewardSettings(functions=function_specs([("nowhere_xyz:f", 1.0, 5.0)]))),
            generators=[], max_concurrent_episodes=1, generate_timeout_s=10,
        )


def test_the_docs_example_runs_as_written(tiny_calc_model, tmp_path, monkeypatch):
    """docs/rewards.md's reward functions module, loaded as the recipe beside it names it."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "rewards.md").read_text()
    code = re.search(r"<!-- example: reward-functions -->\s*```python\n(.*?)```", doc, re.DOTALL)
    toml = re.search(r"<!-- example: reward-functions-recipe -->\s*```toml\n(.*?)```", doc, re.DOTALL)
    assert code and toml, "docs/rewards.md lost its reward functions example"
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(code.group(1)))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    from agentrl.config import validate_recipe
    from agentrl.engine import wiring

    import tomllib

    recipe = validate_recipe({"model": {"path": str(tiny_calc_model)}, **tomllib.loads(toml.group(1))})
    settings = wiring.reward_kwargs(recipe)["reward"]
    assert len(settings.functions) >= 2
    tok = load_tokenizer(str(tiny_calc_model))
    scorer = EpisodeScorer(settings, tokenizer=tok)
    short = _episode(tok, ANSWERED, [("\\boxed{413}<|im_end|>", "")], reward=1.0, sample=0)
    long = _episode(tok, ANSWERED, [("Let me think. " * 20 + "\\boxed{413}<|im_end|>", "")], reward=1.0, sample=1)
    for t in (short, long):
        anyio.run(scorer.score, t, ROW)
    assert short.status == long.status == "ok"
    assert short.reward > long.reward  # the example prefers the shorter of two right answers
    sys.modules.pop("my_rewards", None)


def test_an_agent_episode_gives_its_last_conversation_and_the_models_reply(tiny_calc_model):
    """``messages`` of an agent episode: the newest conversation's messages, then the reply the
    model gave to its last call (what the agent acted on)."""
    from agentrl.engine.common.interfaces import Generation
    from agentrl.engine.episodes.chat_segments import ChatRecorder, Reply

    tok = load_tokenizer(str(tiny_calc_model))
    recorder = ChatRecorder(tok)
    assert recorder.last_conversation() == []
    asked = [{"role": "user", "content": "Compute 12*34+5."}]
    call = recorder.begin(asked, None)
    ids = tok.encode("\\boxed{413}", add_special_tokens=False)
    reply = Reply(message={"role": "assistant", "content": "\\boxed{413}"}, generation=Generation(ids, [0.0] * len(ids), [0] * len(ids), "stop"),
                  text="\\boxed{413}", special_suffix="")
    recorder.finish(call, [reply])
    assert recorder.last_conversation() == [*asked, {"role": "assistant", "content": "\\boxed{413}"}]
