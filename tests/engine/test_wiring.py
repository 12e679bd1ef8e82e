"""Recipe → plain arguments (agentrl.engine.wiring): pure functions, no Ray."""

from __future__ import annotations

from pathlib import Path

from agentrl.config import validate_recipe
from agentrl.engine import wiring
from agentrl.engine.generation.generator import VllmGenerator
from agentrl.engine.generation.http_generator import HttpGenerator


def recipe(**sections):
    return validate_recipe({"model": {"path": "unused"}, **sections})


def test_learner_kwargs_for_rl_and_sft(tmp_path):
    r = recipe(
        learner={"lr": 2e-5, "warmup_steps": 3, "max_steps": 10, "lr_schedule": "cosine", "num_ranks": 2, "torch_threads": 1},
        algo={"updates_per_batch": 2, "kl_coef": 0.1},
        sft={"steps": 50, "lr": 1e-3, "warmup_steps": 5, "lr_schedule": "linear", "torch_threads": 2},
        rollout={"temperature": 0.7},
    )
    rl = wiring.learner_kwargs(r, model="/ckpt/weights", tokenizer="/start", run_dir=tmp_path)
    assert (rl["lr"], rl["warmup_steps"], rl["lr_schedule"], rl["total_steps"]) == (2e-5, 3, "cosine", 20)
    assert rl["world_size"] == 2 and rl["updates_per_batch"] == 2 and rl["objective"].kl_coef == 0.1
    # a resume starts from a checkpoint; the KL anchor and the tokenizer stay the RL starting point
    assert (rl["model"], rl["reference_model"], rl["tokenizer"]) == ("/ckpt/weights", "/start", "/start")
    assert rl["temperature"] == 0.7
    assert rl["audit_path"] == str(tmp_path / "audit" / "learner.jsonl")
    assert not {"rank", "master_addr", "master_port"} & rl.keys()  # the learner group adds them
    sft = wiring.learner_kwargs(r, model="/start", tokenizer=None, run_dir=tmp_path, stage="sft")
    assert (sft["lr"], sft["warmup_steps"], sft["lr_schedule"], sft["total_steps"], sft["torch_threads"]) == (1e-3, 5, "linear", 50, 2)
    assert sft["objective"].kl_coef == 0.0 and sft["updates_per_batch"] == 1 and sft["temperature"] == 1.0
    assert sft["tokenizer"] == "/start"


def test_engine_settings_pass_tensor_parallelism_and_limits_through():
    r = recipe(generator={"tensor_parallel_size": 2, "num_gpus": 2, "max_num_seqs": 64, "weight_sync": "nccl"})
    s = wiring.engine_settings(r, model="/m", tokenizer="/t")
    assert s.extra == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp", "max_num_seqs": 64}
    assert (s.model, s.tokenizer, s.weight_transfer) == ("/m", "/t", "nccl")
    assert wiring.engine_settings(recipe(), model="/m", tokenizer=None).extra == {}


def test_the_cpu_engine_processes_reach_the_engine_and_one_process_holds_one_worker():
    import pytest

    # auto: one process for an engine of one worker, vLLM's two where it has several
    assert wiring.engine_settings(recipe(), model="/m", tokenizer=None).cpu_engine_processes == 1
    tp = recipe(generator={"tensor_parallel_size": 2, "num_gpus": 2})
    assert wiring.engine_settings(tp, model="/m", tokenizer=None).cpu_engine_processes == 2
    ranks = recipe(generator={"cpu_threads_bind": "0|1"})
    assert wiring.engine_settings(ranks, model="/m", tokenizer=None).cpu_engine_processes == 2
    two = recipe(generator={"cpu_engine_processes": 2})
    assert wiring.engine_settings(two, model="/m", tokenizer=None).cpu_engine_processes == 2
    one = recipe(generator={"cpu_engine_processes": 1})
    assert wiring.engine_settings(one, model="/m", tokenizer=None).cpu_engine_processes == 1
    with pytest.raises(Exception, match="cpu_engine_processes = 1 holds one model worker"):
        recipe(generator={"cpu_engine_processes": 1, "tensor_parallel_size": 2, "num_gpus": 2})
    with pytest.raises(Exception, match="cpu_engine_processes"):
        recipe(generator={"cpu_engine_processes": 3})


def test_worker_kwargs_bound_episodes_by_the_model_length(tmp_path):
    r = recipe(rollout={"max_episode_tokens": 4096}, generator={"max_model_len": 1024}, sandbox={"type": "bubblewrap", "preload": ["math"]})
    w = wiring.worker_kwargs(r, tokenizer="/t", run_dir=tmp_path)
    e = w["episodes"]
    assert e.max_episode_tokens == 1024 and e.tokenizer == "/t"
    assert e.sandbox_kind == "bubblewrap" and e.sandbox_kwargs["preload"] == ["math"]
    assert w["audit_path"] == str(tmp_path / "audit" / "episodes.jsonl")
    assert "generators" not in w


def test_generator_actor_picks_the_backend(tmp_path):
    settings = wiring.engine_settings(recipe(), model=str(tmp_path), tokenizer=None)
    vllm = wiring.generator_actor(recipe(generator={"num_cpus": 2}), settings, 3, 0, tmp_path / "logs")
    assert vllm.cls is VllmGenerator and vllm.options["num_cpus"] == 2 and vllm.kwargs["version"] == 3
    env = vllm.options["runtime_env"]
    assert env["env_vars"]["AGENTRL_ACTOR_LOG"] == str((tmp_path / "logs" / "generator-0.log").resolve())
    assert wiring.ray_init_kwargs(recipe())["runtime_env"]["worker_process_setup_hook"] == "agentrl.engine.common.cluster.redirect_actor_output"
    http = recipe(generator={"backend": "http", "urls": ["http://a:1", "http://b:2"]})
    spec = wiring.generator_actor(http, settings, 0, 1, tmp_path / "logs")
    assert spec.cls is HttpGenerator and spec.args == ("http://b:2",)
    assert spec.kwargs["load"] == str(Path(tmp_path).resolve())  # a local folder is loaded into the server
    assert wiring.generator_count(http) == 2


def test_loop_and_ledger_settings():
    r = recipe(learner={"max_steps": 7, "timeout_s": 100}, rollout={"episode_timeout_s": 50, "num_workers": 3}, generator={"timeout_s": 10},
               checkpoint={"every_steps": 2}, eval={"every_steps": 5})
    s = wiring.loop_settings(r)
    assert (s.max_steps, s.checkpoint_every, s.eval_every, s.stuck_timeout_s) == (7, 2, 5, 50 + 100 + 2 * 10)
    assert wiring.ledger_kwargs(r, 12) == {"num_rows": 12, "group_size": r.rollout.group_size, "max_lost_in_a_row": 16}


def test_ray_init_sizes_a_local_cluster_or_joins_one():
    assert wiring.ray_init_kwargs(recipe(ray={"address": "auto"}))["address"] == "auto"
    local = wiring.ray_init_kwargs(recipe(generator={"num_generators": 2, "num_cpus": 1.5}, learner={"num_ranks": 2, "num_cpus": 1}))
    assert local["num_cpus"] >= 2 * 1.5 + 2 and "address" not in local


def test_critic_kwargs_and_gae_settings_for_ppo():
    r = recipe(algo={"advantage": "gae", "gae_gamma": 0.99, "gae_lambda": 0.9, "normalize_advantages": False},
               critic={"lr": 1e-3, "num_ranks": 2, "value_clip": 0.3, "updates_per_batch": 2},
               learner={"num_cpus": 1, "num_ranks": 1})
    kw = wiring.critic_kwargs(r, model="/start")
    assert (kw["model"], kw["lr"], kw["world_size"], kw["value_clip"], kw["updates_per_batch"]) == ("/start", 1e-3, 2, 0.3, 2)
    g = wiring.gae_settings(r)
    assert (g.gamma, g.lam, g.normalize) == (0.99, 0.9, False)
    assert wiring.critic_kwargs(recipe(algo={"advantage": "gae"}, critic={"model": "/value"}), model="/start")["model"] == "/value"
    # the local Ray cluster counts the critic's CPUs
    assert wiring.ray_init_kwargs(r)["num_cpus"] == wiring.ray_init_kwargs(recipe(learner={"num_cpus": 1, "num_ranks": 1}))["num_cpus"] + 2
