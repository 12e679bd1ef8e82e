"""``[placement]``: what ``auto`` picks on which cluster, what colocated changes in the run, the
memory plan of a colocated GPU, and the placements that cannot work (ConfigError naming keys)."""

import json
from pathlib import Path

import pytest

from agentrl.config import load_recipe
from agentrl.engine import wiring
from agentrl.errors import ConfigError
from agentrl.placement_plan import ClusterShape, apply_placement, memory_plan, model_parameters, plan_placement

MINIMAL = '[model]\npath = "some/model"\n[algo]\nmax_staleness = 2\n'
GPU = MINIMAL + "[generator]\nnum_gpus = 1\n[learner]\nnum_gpus = 1\n"

LAPTOP = ClusterShape(cpus=(8.0,), gpus=(0.0,))
TWO_CPU_NODES = ClusterShape(cpus=(8.0, 8.0), gpus=(0.0, 0.0))


def recipe(tmp_path, *overrides: str, text: str = MINIMAL):
    p = tmp_path / "r.toml"
    p.write_text(text)
    return load_recipe(p, list(overrides))


def test_auto_is_colocated_on_one_machine_without_gpus(tmp_path):
    r = recipe(tmp_path)
    plan = plan_placement(r, LAPTOP)
    assert plan.mode == "colocated" and "one machine without GPUs" in plan.reason
    assert plan.max_staleness == 0 and plan.torch_threads == 8 and plan.cpu_threads_bind == "all"
    assert any("max_staleness = 2 does not apply" in n for n in plan.notes)


def test_auto_is_separate_on_a_two_node_cluster(tmp_path):
    plan = plan_placement(recipe(tmp_path), TWO_CPU_NODES)
    assert plan.mode == "separate" and "2 nodes" in plan.reason and plan.max_staleness == 2


def test_auto_on_gpus_depends_on_whether_both_sides_fit_apart(tmp_path):
    r = recipe(tmp_path, text=GPU)
    one = plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,)))
    assert one.mode == "colocated" and one.on_gpu and "cannot hold" in one.reason
    two = plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(2.0,)))
    assert two.mode == "separate" and "hold generators and learner apart" in two.reason


def test_auto_with_http_generators_is_separate(tmp_path):
    r = recipe(tmp_path, 'generator.backend="http"', 'generator.urls=["http://x:8000"]')
    assert plan_placement(r, LAPTOP).mode == "separate"


def test_an_explicit_mode_wins_over_what_auto_would_pick(tmp_path):
    assert plan_placement(recipe(tmp_path, 'placement.mode="separate"'), LAPTOP).mode == "separate"
    assert plan_placement(recipe(tmp_path, 'placement.mode="colocated"'), TWO_CPU_NODES).mode == "colocated"


def test_colocated_recipe_is_on_policy_and_gives_each_phase_every_core(tmp_path):
    r = recipe(tmp_path, "rollout.group_size=4", "learner.batch_size=8")
    assert r.max_staleness == 2
    placed = apply_placement(r, plan_placement(r, LAPTOP))
    assert placed.placement.mode == "colocated" and placed.max_staleness == 0
    assert placed.learner.torch_threads == 8 and placed.sft.torch_threads == 8
    assert placed.generator.cpu_threads_bind == "all"
    settings = wiring.loop_settings(placed)
    assert settings.colocated and settings.sleep_level == 1  # CPUs: the engine processes are stopped
    assert wiring.queue_kwargs(placed)["max_staleness"] == 0
    assert wiring.learner_kwargs(placed, model="m", tokenizer=None, run_dir=tmp_path)["torch_threads"] == 8


def test_what_the_recipe_sets_itself_is_kept_colocated(tmp_path):
    r = recipe(tmp_path, "learner.torch_threads=3", 'generator.cpu_threads_bind="0-1"', "sft.torch_threads=5")
    placed = apply_placement(r, plan_placement(r, LAPTOP))
    assert placed.learner.torch_threads == 3 and placed.generator.cpu_threads_bind == "0-1" and placed.sft.torch_threads == 5


def test_colocated_cores_are_split_between_learner_and_critic_ranks(tmp_path):
    r = recipe(tmp_path, 'algo.advantage="gae"', "learner.num_ranks=2")
    plan = plan_placement(r, LAPTOP)
    assert plan.torch_threads == 8 // 3 and plan.critic_threads == 8 // 3
    placed = apply_placement(r, plan)
    assert placed.critic_settings.torch_threads == 2


def test_separate_changes_nothing(tmp_path):
    r = recipe(tmp_path)
    placed = apply_placement(r, plan_placement(r, TWO_CPU_NODES))
    assert placed.placement.mode == "separate" and placed.max_staleness == 2 and placed.learner.torch_threads == 1
    assert not wiring.loop_settings(placed).colocated


def test_colocated_on_gpus_sleeps_the_generators(tmp_path):
    r = recipe(tmp_path, text=GPU)
    placed = apply_placement(r, plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,))))
    assert wiring.loop_settings(placed).sleep_level == 2 and wiring.engine_settings(placed, model="m", tokenizer=None).sleep_mode
    lora = recipe(tmp_path, "lora.rank=8", text=GPU)
    placed = apply_placement(lora, plan_placement(lora, ClusterShape(cpus=(16.0,), gpus=(1.0,))))
    assert wiring.loop_settings(placed).sleep_level == 1  # the base weights stay


def test_ipc_weight_sync_places_colocated_on_gpus_and_is_refused_elsewhere(tmp_path):
    two_gpus = ClusterShape(cpus=(16.0,), gpus=(2.0,))
    ipc = recipe(tmp_path, 'generator.weight_sync="ipc"', text=GPU)
    plan = plan_placement(ipc, two_gpus)  # room to hold them apart, but IPC needs them together
    assert plan.mode == "colocated" and "ipc" in plan.reason
    assert plan_placement(recipe(tmp_path, 'placement.mode="colocated"', 'generator.weight_sync="ipc"', text=GPU), two_gpus).mode == "colocated"
    with pytest.raises(ConfigError, match='weight_sync = "ipc" needs each generator on its learner rank.s GPU'):
        plan_placement(recipe(tmp_path, 'placement.mode="separate"', 'generator.weight_sync="ipc"', text=GPU), two_gpus)
    with pytest.raises(ConfigError, match='weight_sync = "ipc" is CUDA IPC.*no GPUs'):
        plan_placement(recipe(tmp_path, 'generator.weight_sync="ipc"'), LAPTOP)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (['generator.backend="http"', 'generator.urls=["http://x:8000"]'], "generator.backend"),
        (["generator.num_generators=2"], "generator.num_generators (2) must equal learner.num_ranks (1)"),
        (["generator.num_gpus=2", "generator.tensor_parallel_size=2"], "tensor_parallel_size must be 1"),
        (['generator.weight_sync="nccl"'], 'weight_sync = "nccl"'),
        (["learner.num_ranks=2", "generator.num_generators=2"], "needs 2 GPUs"),
    ],
)
def test_impossible_colocated_placements_are_config_errors_naming_the_keys(tmp_path, overrides, words):
    r = recipe(tmp_path, 'placement.mode="colocated"', *overrides, text=GPU)
    with pytest.raises(ConfigError, match="placement.mode") as err:
        plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,)))
    assert words in str(err.value)


def test_model_parameters_counts_a_qwen2_config():
    # Qwen2.5-0.5B-Instruct's config.json: 494,032,768 parameters on its model card
    cfg = {"hidden_size": 896, "num_hidden_layers": 24, "vocab_size": 151936, "intermediate_size": 4864,
           "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}
    n = model_parameters(cfg)
    assert abs(n - 494_032_768) / 494_032_768 < 0.01  # biases of q/k/v are left out


def test_memory_plan_refuses_a_7b_full_finetune_on_one_80gb_gpu(tmp_path):
    r = recipe(tmp_path, 'model.path="Qwen/Qwen2.5-7B-Instruct"', 'placement.mode="colocated"', text=GPU)
    with pytest.raises(ConfigError, match=r"does not fit") as err:
        plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,), gpu_memory_gib=80.0))
    assert "learner rank: 113.5 GiB" in str(err.value) and "generator.gpu_memory_utilization" in str(err.value)


def test_memory_plan_of_a_local_model_fits_and_is_printed(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 1536, "num_hidden_layers": 28, "vocab_size": 151936,
                                                    "intermediate_size": 8960, "num_attention_heads": 12,
                                                    "num_key_value_heads": 2, "tie_word_embeddings": True}))
    r = recipe(tmp_path, f'model.path="{folder}"', "generator.gpu_memory_utilization=0.3", text=GPU)
    plan = plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,), gpu_memory_gib=80.0))
    assert plan.memory is not None and plan.memory.fits()
    assert 1.4e9 < plan.memory.parameters < 1.6e9 and plan.memory.generator == pytest.approx(24.0)
    assert any("peak:" in line and "of 80 GiB" in line for line in plan.lines())
    assert memory_plan(r, 80.0) == plan.memory


def test_dry_run_prints_the_placement(tmp_path):
    from agentrl.dryrun import _placement

    status, detail = _placement(recipe(tmp_path, text=GPU))
    assert status == "elsewhere" and "placement.gpus_per_node" in detail
    status, detail = _placement(recipe(tmp_path, "placement.gpus_per_node=1", "placement.gpu_memory_gib=80", text=GPU))
    assert status == "ok" and detail.startswith("colocated (auto: 1 GPU(s)")


def test_cluster_shape_from_ray_nodes_counts_alive_nodes_only():
    nodes = [{"Alive": True, "Resources": {"CPU": 4.0, "GPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 4.0}},
             {"Alive": True, "Resources": {"CPU": 2.0}}]
    shape = ClusterShape.from_ray_nodes(nodes)
    assert shape.nodes == 2 and shape.total_gpus == 2.0 and shape.cpus == (4.0, 2.0)


def test_retool_math_1gpu_recipe_plans_colocated_on_one_80gb_gpu():
    r = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "retool_math_1gpu.toml")
    plan = plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,), gpu_memory_gib=80.0))
    assert plan.mode == "colocated" and plan.memory is not None and plan.memory.fits()
    # its versions go by CUDA IPC: the handover's staging buffer is in the plan
    m = plan.memory
    assert r.generator.weight_sync == "ipc" and m.handover == 1.0 and m.weights == pytest.approx(m.parameters * 2 / 2**30)
    assert m.peak >= m.learner + m.weights + m.handover
    assert any(line.startswith("ipc handover: 1.0 GiB") for line in m.lines())


def test_an_offloading_learner_leaves_vllm_the_gpu_and_is_refused_where_nothing_is_shared(tmp_path):
    one_gpu = ClusterShape(cpus=(16.0,), gpus=(1.0,), gpu_memory_gib=80.0)
    recipe_path = Path(__file__).resolve().parents[1] / "recipes" / "retool_math_1gpu.toml"
    kept = plan_placement(load_recipe(recipe_path), one_gpu).memory
    off = plan_placement(load_recipe(recipe_path, ["learner.offload_states=true"]), one_gpu).memory
    assert kept.peak == pytest.approx(kept.generator + kept.learner)  # vLLM awake beside the learner's states
    # offloaded: vLLM alone, the learner's step alone (vLLM asleep), or the handover; the step is the largest
    # here (the H100's steady-state step held 28.3 GiB, vLLM reserves 28.0)
    assert off.peak == pytest.approx(max(off.generator, off.learner + off.activations, off.learner + off.weights + off.handover))
    assert off.peak == pytest.approx(off.learner + off.activations) and off.peak < kept.peak
    assert "in host memory while vLLM generates" in off.lines()[1]
    placed = apply_placement(load_recipe(recipe_path, ["learner.offload_states=true"]), plan_placement(load_recipe(recipe_path), one_gpu))
    assert wiring.loop_settings(placed).offload_learner
    with pytest.raises(ConfigError, match="learner.offload_states.*no GPUs"):
        plan_placement(recipe(tmp_path, "learner.offload_states=true"), LAPTOP)
    with pytest.raises(ConfigError, match="learner.offload_states is for colocated placement"):
        plan_placement(recipe(tmp_path, 'placement.mode="separate"', "learner.offload_states=true", text=GPU), one_gpu)


def test_step_working_set_adds_its_parts():
    from agentrl.placement_plan import STEP_SLACK_BYTES, step_working_set

    cfg = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 3, "vocab_size": 100, "tie_word_embeddings": True}
    one_layer = 10 * (6 * 8 + 4 * 16) * 2
    logits = 3 * 4 * 100 * 4
    with_ckpt = step_working_set(cfg, micro_batch_tokens=10, logprob_chunk_tokens=4, checkpointing=True, compute_bytes=2)
    assert with_ckpt == 3 * 10 * 8 * 2 + one_layer + 100 * 8 * 2 + logits + STEP_SLACK_BYTES
    without = step_working_set(cfg, micro_batch_tokens=10, logprob_chunk_tokens=4, checkpointing=False, compute_bytes=2)
    assert without == 3 * one_layer + 100 * 8 * 2 + logits + STEP_SLACK_BYTES
    untied = step_working_set({**cfg, "tie_word_embeddings": False}, micro_batch_tokens=10, logprob_chunk_tokens=4,
                              checkpointing=True, compute_bytes=2)
    assert untied - with_ckpt == 100 * 8 * 2  # the output projection is a second matrix


RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "records" / "gpu"


@pytest.mark.parametrize(("record", "overrides"), [
    ("h100_qwen7b_lora_r2_per_layer.json",
     ['model.path="Qwen/Qwen2.5-7B-Instruct"', "lora.rank=64", 'generator.weight_sync="disk"']),
    ("h100_qwen1.5b_full_r3_per_layer_fused.json", []),
    # the steady state (step 2: AdamW's moments exist during the backward pass)
    ("h100_qwen7b_lora_r3_steady_state.json",
     ['model.path="Qwen/Qwen2.5-7B-Instruct"', "lora.rank=64", 'generator.weight_sync="disk"']),
    ("h100_qwen1.5b_full_r4_steady_state.json", []),
])
def test_the_plan_of_the_one_gpu_recipe_is_above_what_an_h100_measured(record, overrides):
    """The dry run's learner line plus its step estimate against the peak a step held on an H100
    (benchmarks/gpu_learner_check.py, the same recipe's learner settings): not below it (the plan
    would promise room that is not there) and not far above it (it would refuse runs that fit)."""
    measured = json.loads((RECORDS / record).read_text())
    root = Path(__file__).resolve().parents[1]
    r = load_recipe(root / "recipes" / "retool_math_1gpu.toml", overrides)
    plan = memory_plan(r, measured["device_gib"])
    arms = [measured[arm] for arm in ("offload", "plain") if arm in measured]
    peak = max(max(a["step1_peak_allocated_gib"], a.get("step2_peak_allocated_gib", 0.0)) for a in arms)
    planned = plan.learner + plan.activations
    assert peak <= planned, (peak, planned)
    if overrides:  # LoRA: the moments are tiny, the plan counts no full fine-tune's states
        assert planned <= 1.15 * peak, (peak, planned)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (['algo.advantage="gae"', "critic.num_gpus=1"], "critic.num_ranks * critic.num_gpus = 1"),
        (['reward.judge.model="some/judge"', "reward.judge.num_gpus=0.5"], "reward.judge.num_generators * reward.judge.num_gpus = 0.5"),
        (['reward.model.path="some/rm"', "reward.model.num_gpus=1"], "reward.model.num_gpus = 1"),
    ],
)
def test_colocated_gpu_actors_beside_the_pairs_need_gpus_of_their_own(tmp_path, overrides, key):
    """A critic, a separate judge or a reward model on GPUs is placed apart from the colocated
    generator/learner pairs: on one GPU it cannot be placed, and the check says so naming its keys
    instead of the run waiting for a GPU that never comes; with a second GPU it is placed."""
    r = recipe(tmp_path, 'placement.mode="colocated"', *overrides, text=GPU)
    with pytest.raises(ConfigError, match="placement.mode") as err:
        plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(1.0,)))
    assert key in str(err.value) and "the cluster has 1" in str(err.value)
    assert plan_placement(r, ClusterShape(cpus=(16.0,), gpus=(2.0,))).mode == "colocated"
    # the policy as judge and a CPU critic need no GPU of their own
    assert plan_placement(recipe(tmp_path, 'placement.mode="colocated"', 'reward.judge.model="policy"', text=GPU),
                          ClusterShape(cpus=(16.0,), gpus=(1.0,))).mode == "colocated"
    cpu_critic = recipe(tmp_path, 'placement.mode="colocated"', 'algo.advantage="gae"', "critic.allow_cpu=true", text=GPU)
    assert plan_placement(cpu_critic, ClusterShape(cpus=(16.0,), gpus=(1.0,))).mode == "colocated"


@pytest.mark.parametrize("value", ["everything", "0-", "1;2", "all,0"])
def test_a_cpu_threads_bind_vllm_cannot_read_is_refused_naming_the_key(tmp_path, value):
    with pytest.raises(ConfigError, match="cpu_threads_bind"):
        recipe(tmp_path, f'generator.cpu_threads_bind="{value}"')


@pytest.mark.parametrize("value", ["auto", "all", "nobind", "0-1", "0,2", "0-3|4-7"])
def test_every_binding_vllm_or_agentrl_reads_is_accepted(tmp_path, value):
    assert recipe(tmp_path, f'generator.cpu_threads_bind="{value}"').generator.cpu_threads_bind == value
