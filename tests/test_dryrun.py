"""`agentrl check --dry-run`: the prompt check renders one prompt and measures it against the limits."""

from __future__ import annotations

from agentrl.config import validate_recipe
from agentrl.dryrun import dry_run


def lines_of(recipe: dict) -> tuple[bool, dict[str, str]]:
    out: list[str] = []
    ok = dry_run(validate_recipe(recipe), echo=out.append)
    return ok, {line.split()[1]: line for line in out}


def test_the_first_prompt_is_measured_against_the_episode_limit(tiny_calc_model):
    base = {"model": {"path": str(tiny_calc_model)}, "sandbox": {"type": "unsafe-local"}, "eval": {"limit": 0}}
    ok, lines = lines_of(base)
    assert ok and lines["prompt"].split()[0] == "ok" and "the first prompt is" in lines["prompt"]
    n = int(lines["prompt"].split("the first prompt is ")[1].split()[0])
    ok, lines = lines_of({**base, "rollout": {"max_episode_tokens": n - 1}})
    assert not ok and lines["prompt"].split()[0] == "error"
    assert f"the first prompt is {n} tokens" in lines["prompt"] and "before the model writes a token" in lines["prompt"]


def test_agents_and_models_still_to_be_built_are_not_rendered(tmp_path):
    ok, lines = lines_of({"model": {"path": str(tmp_path / "nothing"), "build": "tiny"}, "sandbox": {"type": "unsafe-local"}})
    assert f"not rendered: {tmp_path / 'nothing'} does not exist yet (the run builds it: tiny)" in lines["prompt"], lines["prompt"]
    ok, lines = lines_of({"model": {"path": str(tmp_path / "nothing"), "build": "tiny"}, "sandbox": {"type": "unsafe-local"},
                          "env": {"agent": "agentrl.envs.calc_agent:calc_agent"}})
    assert ok and "context_length_exceeded" in lines["prompt"]


def test_the_sandbox_line_says_which_limits_are_in_force(tiny_calc_model):
    """Root with cgroup v1 here: the bubblewrap sandbox bounds each execution tree with cgroups,
    under its filter; the line says both."""
    ok, lines = lines_of({"model": {"path": str(tiny_calc_model)}, "sandbox": {"type": "bubblewrap"}, "eval": {"limit": 0}})
    line = lines["sandbox"]
    assert line.split()[0] == "ok" and "allowlist filter" in line, line
    assert "limits: cgroup v1 (memory, pids, cpu) per execution tree" in line, line


def test_the_objective_line_names_the_estimator_and_the_critic(tmp_path):
    base = {"model": {"path": str(tmp_path / "to-build"), "build": "tiny"}, "sandbox": {"type": "unsafe-local"}, "eval": {"limit": 0}}
    _, lines = lines_of(base)
    assert "grpo advantages over groups of" in lines["objective"]
    _, lines = lines_of({**base, "algo": {"advantage": "gae"}, "critic": {"warmup_steps": 4}})
    assert "gae advantages per token" in lines["objective"] and "first 4 steps train the critic alone" in lines["objective"]
    assert "1 critic ranks" in lines["resources"]


def test_the_gpu_count_includes_a_separate_judge_and_the_reward_model(tmp_path):
    from agentrl.dryrun import _resources

    base = {"model": {"path": str(tmp_path / "to-build"), "build": "tiny"}, "sandbox": {"type": "unsafe-local"},
            "generator": {"num_gpus": 1, "num_cpus": 2}, "learner": {"num_gpus": 1, "num_cpus": 2}}
    _, plain = _resources(validate_recipe(base))
    assert plain.startswith("needs 2 GPUs"), plain
    rewards = {"judge": {"model": str(tmp_path / "judge"), "num_generators": 2, "num_gpus": 1, "num_cpus": 3},
               "model": {"path": str(tmp_path / "rm"), "num_gpus": 1, "num_cpus": 1}}
    _, line = _resources(validate_recipe({**base, "reward": rewards}))
    assert line.startswith("needs 5 GPUs"), line  # 1 generator + 1 learner rank + 2 judge generators + 1 reward model
    assert "2 judge generators, 1 reward-model actor" in line
    _, policy = _resources(validate_recipe({**base, "reward": {"judge": {"model": "policy", "num_gpus": 1}}}))
    assert policy.startswith("needs 2 GPUs"), policy  # the policy judges itself: no GPUs of its own


def test_a_colocated_gpu_recipe_needs_one_gpu_per_learner_rank_not_two(tmp_path):
    from agentrl.dryrun import _resources

    base = {"model": {"path": str(tmp_path / "to-build"), "build": "tiny"}, "sandbox": {"type": "unsafe-local"},
            "generator": {"num_gpus": 1, "num_generators": 2}, "learner": {"num_gpus": 1, "num_ranks": 2},
            "placement": {"mode": "colocated", "gpus_per_node": 2}}
    _, line = _resources(validate_recipe(base))
    assert line.startswith("needs 2 GPUs"), line  # generator i shares learner rank i's GPU
    _, apart = _resources(validate_recipe({**base, "placement": {"mode": "separate", "gpus_per_node": 4}}))
    assert apart.startswith("needs 4 GPUs"), apart
