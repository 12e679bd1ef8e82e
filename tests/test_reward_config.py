"""The recipe's ``[reward]`` section: validation in words, and what wiring makes of it."""

from pathlib import Path

import pytest

from agentrl.config import load_recipe
from agentrl.engine import wiring
from agentrl.engine.rewards.judge import JudgeSettings
from agentrl.engine.rewards.scoring import RewardSettings
from agentrl.errors import ConfigError

MINIMAL = '[model]\npath = "some/model"\n'


def recipe(tmp_path, *overrides: str, text: str = MINIMAL):
    p = tmp_path / "r.toml"
    p.write_text(text)
    return load_recipe(p, list(overrides))


def test_no_reward_section_means_the_environment_alone(tmp_path):
    r = recipe(tmp_path)
    assert r.reward.env_weight == 1.0 and r.reward.judge is None and r.reward.model is None
    assert wiring.reward_kwargs(r) == {} and wiring.judge_actors(r, tmp_path) == [] and wiring.reward_model_actor(r, tmp_path) is None


def test_a_policy_judge_and_a_reward_model(tmp_path):
    text = MINIMAL + """
[reward]
env_weight = 1.0

[reward.judge]
weight = 0.2
template = "Question: {question}\\nAnswer: {response}\\nScore (1-5):"
score_min = 1
score_max = 5
timeout_s = 30

[reward.model]
path = "runs/models/rm"
weight = 0.5
max_batch_size = 8
"""
    r = recipe(tmp_path, text=text)
    kw = wiring.reward_kwargs(r)
    assert kw["reward"] == RewardSettings(env_weight=1.0, judge_weight=0.2, rm_weight=0.5, rm_timeout_s=60.0)
    assert kw["judge"] == JudgeSettings(template=r.reward.judge.template, score_min=1, score_max=5, timeout_s=30)
    assert "judge_tokenizer" not in kw  # the policy judges: its own tokenizer
    assert wiring.judge_actors(r, tmp_path) == []  # ...and its own generators
    spec = wiring.reward_model_actor(r, tmp_path)
    assert spec.args == ("runs/models/rm",) and spec.kwargs["max_batch_size"] == 8 and spec.kwargs["device"] == "cpu"
    assert wiring.worker_kwargs(r, tokenizer="tok", run_dir=tmp_path)["scoring"].reward == kw["reward"]
    # the reward model's CPU is counted in the local cluster
    assert wiring.ray_init_kwargs(r)["num_cpus"] == wiring.ray_init_kwargs(recipe(tmp_path))["num_cpus"] + 1


def test_a_separate_judge_model_gets_frozen_generators(tmp_path):
    r = recipe(tmp_path, "reward.judge.model='judges/small'", "reward.judge.num_generators=2", "generator.weight_sync='gloo'")
    specs = wiring.judge_actors(r, tmp_path)
    assert len(specs) == 2
    settings = specs[0].args[0]
    assert settings.model == settings.tokenizer == "judges/small"
    assert settings.weight_transfer is None and settings.max_lora_rank is None  # never updated
    assert wiring.reward_kwargs(r)["judge_tokenizer"] == "judges/small"


@pytest.mark.parametrize(("override", "message"), [
    ("reward.judge.template='Rate {question}'", "template must contain {response} or {transcript}"),
    ("reward.judge.score_max=0", "score_max (0) must be greater than score_min (0)"),
    ("reward.judge.score_pattern='('", "score_pattern '(' is not a valid regex"),
    ("reward.judge.weight=inf", "reward.judge.weight: got inf (float); expected a finite number"),
    ("reward.env_weight=nan", "expected a finite number"),
    ("reward.model.weight=1", "reward.model.path: required key is missing"),
    ("reward.judge.timeout_s=0", "reward.judge.timeout_s"),
    ("reward.judge.colour='red'", "reward.judge.colour: unknown key"),
])
def test_bad_reward_sections_are_refused_in_words(tmp_path, override, message):
    with pytest.raises(ConfigError) as info:
        recipe(tmp_path, override)
    assert message in str(info.value)


def test_structured_judge_output_needs_vllm_generators(tmp_path):
    with pytest.raises(ConfigError, match="output_regex needs vLLM generators"):
        recipe(tmp_path, "reward.judge.output_regex='Score: [0-9]'", "generator.backend='http'", "generator.urls=['http://x']")


def test_the_judge_recipe_ships_and_uses_the_policy_judge():
    r = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny_calc_judge.toml")
    assert r.reward.judge is not None and r.reward.judge.model == "policy" and 0 < r.reward.judge.weight < r.reward.env_weight


def test_dry_run_says_how_the_reward_is_made(tmp_path, tiny_calc_model):
    from agentrl.dryrun import dry_run

    r = recipe(tmp_path, f"model.path='{tiny_calc_model}'", "reward.judge.weight=0.2", "sandbox.type='unsafe-local'",
               "data.limit=4", "eval.limit=0")
    lines: list[str] = []
    dry_run(r, echo=lines.append)
    (line,) = [x for x in lines if " reward " in x]
    assert line.split()[0] == "ok" and "reward = 1 * env_reward + 0.2 * judge_score" in line and "question" in line
    r = recipe(tmp_path, f"model.path='{tiny_calc_model}'", f"reward.model.path='{tmp_path}/missing'", "data.limit=4")
    lines = []
    dry_run(r, echo=lines.append)
    (line,) = [x for x in lines if " reward " in x]
    assert line.split()[0] == "error" and "no config.json there" in line


def test_a_separate_judge_takes_its_engine_from_its_own_model_and_gpus_not_the_policys(tmp_path):
    """The policy's engine (4-way tensor parallel, 16k context, 256 sequences, sleep mode) is not
    the judge's: a 2-GPU judge whose model knows 4,096 positions gets a 2-way engine of 4,096."""
    import json

    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 4096}))
    gpu = ("generator.num_gpus=4", "generator.tensor_parallel_size=4", "generator.max_model_len=16384",
           "generator.max_num_seqs=256", "generator.max_num_batched_tokens=16384", f"reward.judge.model='{judge}'")
    r = recipe(tmp_path, *gpu, "reward.judge.num_gpus=2")
    policy = wiring.engine_settings(r, model="policy", tokenizer=None)
    assert policy.extra["tensor_parallel_size"] == 4 and policy.max_model_len == 16384
    [spec] = wiring.judge_actors(r, tmp_path)
    s = spec.args[0]
    assert spec.options["num_gpus"] == 2
    assert s.extra == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}  # no policy batch sizes
    assert s.max_model_len == 4096 and not s.sleep_mode and s.weight_transfer is None and s.max_lora_rank is None
    half = wiring.judge_actors(recipe(tmp_path, *gpu, "reward.judge.num_gpus=0.5"), tmp_path)[0].args[0]
    assert half.extra == {} and half.gpu_memory_utilization == pytest.approx(policy.gpu_memory_utilization * 0.5)
    # a hub id (no local folder): the policy's context, which vLLM checks against the model at start
    hub = wiring.judge_actors(recipe(tmp_path, *gpu[:-1], "reward.judge.model='org/judge'", "reward.judge.num_gpus=1"), tmp_path)
    assert hub[0].args[0].max_model_len == 16384 and hub[0].args[0].extra == {}


@pytest.mark.parametrize(("overrides", "message"), [
    (("generator.num_gpus=1", "reward.judge.model='org/judge'"), "reward.judge.num_gpus = 0 beside GPU generators"),
    (("generator.num_gpus=1", "reward.judge.model='org/judge'", "reward.judge.num_gpus=1.5"), "must be a whole number"),
])
def test_a_judge_engine_that_cannot_run_is_refused_by_the_recipe_check(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        recipe(tmp_path, *overrides)
    recipe(tmp_path, "reward.judge.model='org/judge'")  # CPU generators: a CPU judge is fine
