"""benchmarks/trl_peer.py. The aggregation (issue 33): per-seed ratios, medians over seeds, the
goal check, and the per-step splits and RL-loop clock read from run records, on made-up runs.
The recipe generality (issue 34, SmolLM2 against TRL): settings and GRPOConfig read from the
recipe, the results block and goal per recipe, the SFT command, and where a turn ends on
SmolLM2's tokenizer (in HF ``generate`` with a 1-layer random model, and in TRL's rollout with a
stand-in for TRL's generation; skipped without runs/models/smollm2-135m-instruct). No training;
one test imports TRL (about 10-20 s) to check that it accepts the config."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "trl_peer.py"
_spec = importlib.util.spec_from_file_location("trl_peer", _PATH)
assert _spec is not None and _spec.loader is not None
peer = importlib.util.module_from_spec(_spec)
sys.modules["trl_peer"] = peer  # dataclasses look their module up by name
_spec.loader.exec_module(peer)


def _run(seed: int, side: str, rl_s: float, curve: list[tuple[int, float, float]] = (), steps: int = 120, command_s: float = 100.0):
    return peer.Run(seed=seed, side=side, steps=steps, rl_s=rl_s, command_s=command_s, episodes_per_step=32,
                    curve=[{"step": st, "s": s, "accuracy": a} for st, s, a in curve])


TRL_CURVE = [(0, 0.0, 0.37), (20, 16.0, 0.62), (40, 30.0, 0.60)]  # final 0.60, first reached at 16 s


def test_ratios_and_their_median_are_agentrl_over_trl_per_seed() -> None:
    # TRL: 3840 episodes in 96 s = 40/s every seed; agentrl: 60/s, 48/s, 56/s
    runs = [_run(s, "TRL", 96.0, TRL_CURVE) for s in (0, 1, 2)]
    runs += [_run(0, "agentrl", 64.0, [(0, 0, 0.37), (20, 10.0, 0.61)]), _run(1, "agentrl", 80.0, [(0, 0, 0.37), (20, 12.0, 0.55)]),
             _run(2, "agentrl", 3840 / 56, [(0, 0, 0.37), (20, 15.0, 0.6)])]
    assert runs[0].samples_per_s == pytest.approx(40.0)
    goal = peer.check_goal(runs)
    assert goal.ratios == pytest.approx({0: 1.5, 1: 1.2, 2: 1.4})
    assert goal.median_ratio == pytest.approx(1.4)
    assert goal.speed_met
    # seed 0: 10 s < 16 s; seed 1: never reaches 0.60; seed 2: 15 s < 16 s -> 2 of 3
    assert [r.agentrl_sooner for r in goal.races] == [True, False, True]
    assert goal.races[1].agentrl_s is None and goal.races[0].trl_s == 16.0 and goal.races[0].target == 0.60
    assert goal.accuracy_met and goal.met is True
    text = "\n".join(peer.goal_lines(goal))
    assert "**met**" in text and "1.40x" in text and "sooner in 2 of 3 seeds" in text


def test_the_goal_is_not_met_when_either_part_fails() -> None:
    slow = [_run(s, "TRL", 96.0, TRL_CURVE) for s in (0, 1, 2)]
    slow += [_run(s, "agentrl", 3840 / r, [(0, 0, 0.37), (20, 5.0, 0.7)]) for s, r in ((0, 48.0), (1, 50.0), (2, 60.0))]
    goal = peer.check_goal(slow)
    assert goal.median_ratio == pytest.approx(1.25) and not goal.speed_met
    assert goal.accuracy_met and goal.met is False
    assert "**not met**" in "\n".join(peer.goal_lines(goal))
    # fast, but reaching TRL's final accuracy later (or at the same second) in half the seeds: not more than half
    late = [_run(s, "TRL", 96.0, TRL_CURVE) for s in (0, 1)]
    late += [_run(0, "agentrl", 48.0, [(0, 0, 0.37), (20, 16.0, 0.6)]), _run(1, "agentrl", 48.0, [(0, 0, 0.37), (20, 8.0, 0.6)])]
    goal = peer.check_goal(late)
    assert goal.speed_met and [r.agentrl_sooner for r in goal.races] == [False, True]
    assert goal.accuracy_met is False and goal.met is False


def test_without_evaluations_the_goal_is_undecided() -> None:
    runs = [_run(0, "TRL", 96.0), _run(0, "agentrl", 48.0)]
    goal = peer.check_goal(runs)
    assert goal.speed_met and goal.accuracy_met is None and goal.met is None
    with pytest.raises(ValueError):
        peer.check_goal([_run(0, "TRL", 96.0), _run(1, "agentrl", 48.0)])  # no seed with both sides


def test_side_medians_over_seeds() -> None:
    runs = [_run(0, "agentrl", 64.0, [(0, 0, 0.3), (20, 50.0, 0.65)], command_s=200.0),
            _run(1, "agentrl", 80.0, [(0, 0, 0.3), (20, 40.0, 0.55)], command_s=260.0),
            _run(2, "agentrl", 96.0, [(0, 0, 0.3), (20, 30.0, 0.61)], command_s=220.0)]
    m = peer.summarise(runs, "agentrl", threshold=0.6)
    assert m.samples_per_s == pytest.approx(48.0)  # 60, 48, 40
    assert m.command_s == 220.0 and m.final_accuracy == pytest.approx(0.61)
    assert m.to_threshold_s == pytest.approx(40.0) and m.reached == 2  # median of 50 and 30; seed 1 never reached
    with pytest.raises(ValueError):
        peer.summarise(runs, "TRL", threshold=0.6)


def test_mean_curve_keeps_the_steps_every_seed_evaluated() -> None:
    runs = [_run(0, "TRL", 96.0, [(0, 0.0, 0.4), (20, 10.0, 0.6), (40, 20.0, 0.7)]), _run(1, "TRL", 96.0, [(0, 0.0, 0.2), (20, 14.0, 0.5)])]
    assert peer.mean_curves(runs, "TRL") == [{"step": 0, "s": 0.0, "accuracy": pytest.approx(0.3)},
                                            {"step": 20, "s": 12.0, "accuracy": pytest.approx(0.55)}]


def test_trl_split_takes_per_step_differences_of_the_cumulative_clock() -> None:
    per_step = [{"step": 1, "train_s": 1.0, "generate_s": 0.5, "env_s": 0.1},
                {"step": 2, "train_s": 3.0, "generate_s": 1.7, "env_s": 0.3},
                {"step": 3, "train_s": 4.2, "generate_s": 2.3, "env_s": 0.4}]
    split = peer.trl_split(per_step)  # steps 1.0, 2.0, 1.2; generate 0.5, 1.2, 0.6; env 0.1, 0.2, 0.1
    assert split["step"] == pytest.approx(1.2) and split["HF generate"] == pytest.approx(0.6)
    assert split["environment (sandbox)"] == pytest.approx(0.1)
    assert split["rest (loss, backward, optimiser, TRL)"] == pytest.approx(0.5)  # 0.4, 0.6, 0.5


def _agentrl_records() -> list[dict]:
    return [
        {"kind": "eval", "time": 5.0, "version": 0, "eval_s": 4.0, "accuracy": 0.3},
        {"kind": "event", "time": 6.0, "loop_start": True, "message": "RL loop started at version 0"},
        {"kind": "step", "time": 8.0, "step": 1, "train_s": 1.0, "publish_s": 0.2, "update_stall_s": 0.1, "learner_busy_s": 1.5},
        {"kind": "step", "time": 10.0, "step": 2, "train_s": 1.2, "publish_s": 0.3, "update_stall_s": 0.1, "learner_busy_s": 1.8},
        {"kind": "eval", "time": 16.0, "version": 2, "eval_s": 5.0, "accuracy": 0.5},
        {"kind": "step", "time": 18.0, "step": 3, "train_s": 1.1, "publish_s": 0.2, "update_stall_s": 0.3, "learner_busy_s": 1.6},
        {"kind": "utilisation", "time": 19.0, "rl_wall_s": 13.0, "generator_busy_fraction": 0.9, "learner_busy_fraction": 0.4},
        {"kind": "event", "time": 19.5, "message": "checkpoint step_3 (0.4 s)"},
        {"kind": "eval", "time": 25.0, "version": 3, "eval_s": 5.0, "accuracy": 0.6},  # the final one: after the loop
    ]


def test_in_run_checkpoints_reads_both_event_forms(tmp_path) -> None:
    lines = [*_agentrl_records(), {"kind": "event", "time": 30.0, "message": "checkpoint step_000006 (0.7 s; written in the background, 0.0 s waited for at the end)"},
             {"kind": "event", "time": 31.0, "message": "checkpoint step_000002 was dropped"}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    n, seconds = peer.in_run_checkpoints(tmp_path)
    assert n == 2 and seconds == pytest.approx(0.4 + 0.7)


def test_agentrl_rl_clock_takes_out_only_the_evaluations_inside_the_loop() -> None:
    rl_s, steps = peer.agentrl_rl_s(_agentrl_records())
    assert rl_s == pytest.approx(13.0 - 5.0) and steps == 3


def test_agentrl_split_reads_the_logged_step_fields_and_leaves_evaluations_out_of_the_interval() -> None:
    split = peer.agentrl_split(_agentrl_records())
    # intervals 6->8, 8->10, 10->18 minus the 5 s evaluation: 2, 2, 3
    assert split["step"] == pytest.approx(2.0)
    assert split["learner train"] == pytest.approx(1.1) and split["publish weights"] == pytest.approx(0.2)
    assert split["generator update stall"] == pytest.approx(0.1)
    assert split["rest: episodes (generation, sandbox), waiting"] == pytest.approx(0.5)  # 2-1.5, 2-1.8, 3-1.6
    assert "handover (generator sleep, colocated)" not in split and "batch transfer" not in split  # not logged: not invented
    assert split["generator busy"] == 0.9 and split["learner busy"] == 0.4


def test_sides_alternate_and_seeds_parse() -> None:
    assert [peer.order(i)[0] for i in range(4)] == ["TRL", "agentrl", "TRL", "agentrl"]
    assert peer.parse_seeds("0, 1,2") == [0, 1, 2]
    for bad in ("0,0", "", "a"):
        with pytest.raises(ValueError):
            peer.parse_seeds(bad)


def test_reuse_reads_a_finished_run_only_when_it_was_run_with_the_same_settings(tmp_path: Path) -> None:
    import argparse
    import json

    args = argparse.Namespace(steps=120, save_every=20, no_eval=False, sft="runs/tiny_calc/sft", reuse=True,
                              recipe="recipes/tiny_calc.toml", dtype="float32")
    (tmp_path / "trl.bench.json").write_text(json.dumps({"command_s": 1.0, "steps": 120, "save_every": 20, "no_eval": False,
                                                         "sft": "runs/tiny_calc/sft"}))
    assert peer.ensure_run(args, "TRL", 0, tmp_path, first=True) is False  # read, not run
    (tmp_path / "trl.bench.json").write_text(json.dumps({"command_s": 1.0, "steps": 2, "save_every": 2, "no_eval": False,
                                                         "sft": "runs/tiny_calc/sft"}))
    with pytest.raises(SystemExit, match="other settings"):  # a 2-step smoke is never read as a 120-step run
        peer.ensure_run(args, "TRL", 0, tmp_path, first=True)


# ------------------------------------------------------------------ general over the recipe (issue 34, SmolLM2 against TRL)

ROOT = Path(__file__).resolve().parents[2]


def _recipe(name: str, *overrides: str):
    from agentrl.config import load_recipe

    return load_recipe(ROOT / "recipes" / f"{name}.toml", list(overrides))


def test_settings_come_from_the_recipe() -> None:
    tiny, smol = peer.peer_settings(_recipe("tiny_calc")), peer.peer_settings(_recipe("smol_calc"))
    assert (tiny.episodes_per_step, tiny.prompts_per_step, tiny.group_size, tiny.lr) == (32, 8, 4, 1e-4)
    assert (smol.episodes_per_step, smol.prompts_per_step, smol.group_size, smol.lr) == (16, 4, 4, 2e-5)
    assert smol.stops == ("</code>",) and smol.max_new_tokens == 48 and smol.max_turns == 3 and smol.eval_limit == 128
    changed = peer.peer_settings(_recipe("smol_calc", "learner.batch_size=24", "rollout.group_size=8", "rollout.max_new_tokens=64",
                                         "env.kwargs={max_turns=2}", "eval.limit=64", 'rollout.stop=["</python>"]'))
    assert (changed.episodes_per_step, changed.prompts_per_step, changed.max_new_tokens, changed.max_turns, changed.eval_limit,
            changed.stops) == (24, 3, 64, 2, 64, ("</python>",))


def test_the_grpo_config_is_the_recipes_and_the_tiny_one_is_unchanged() -> None:
    tiny = peer.grpo_config_kwargs(_recipe("tiny_calc"), "float32")
    # what train_trl passed TRL before the script read the recipe (SAMPLES_PER_STEP = 32 and the tiny recipe's values)
    assert {k: tiny[k] for k in ("per_device_train_batch_size", "num_generations", "learning_rate", "lr_scheduler_type", "warmup_steps",
                                 "max_completion_length", "epsilon", "epsilon_high", "beta", "loss_type", "scale_rewards", "bf16",
                                 "gradient_checkpointing", "temperature")} == {
        "per_device_train_batch_size": 32, "num_generations": 4, "learning_rate": 1e-4, "lr_scheduler_type": "constant",
        "warmup_steps": 0, "max_completion_length": 48, "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "loss_type": "dapo",
        "scale_rewards": "group", "bf16": False, "gradient_checkpointing": False, "temperature": 1.0}
    smol = peer.grpo_config_kwargs(_recipe("smol_calc", "learner.warmup_steps=3"), "bfloat16")
    assert smol["per_device_train_batch_size"] == 16 and smol["learning_rate"] == 2e-5 and smol["bf16"] is True
    assert smol["lr_scheduler_type"] == "constant_with_warmup" and smol["warmup_steps"] == 3
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        peer.grpo_config_kwargs(_recipe("smol_calc"), "float16")


@pytest.mark.parametrize("override, what", [('learner.lr_schedule="cosine"', "lr_schedule"), ('algo.advantage="rloo"', "advantage"),
                                            ('algo.loss_agg="seq-mean-token-sum"', "loss_agg"), ("algo.updates_per_batch=2", "updates_per_batch")])
def test_a_recipe_trl_cannot_train_alike_is_refused(override: str, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        peer.peer_settings(_recipe("smol_calc", override))


def test_trl_accepts_the_config() -> None:
    from trl import GRPOConfig  # the test extra installs TRL (scripts/setup.sh)

    for name, n in (("tiny_calc", 32), ("smol_calc", 16)):
        config = GRPOConfig(output_dir="/tmp/trl_peer_test_config", max_steps=2, report_to="none",
                            **peer.grpo_config_kwargs(_recipe(name), "float32"))
        assert config.generation_batch_size == n and config.num_generations == 4 and not config.gradient_checkpointing


def test_the_results_block_differs_per_recipe_and_both_coexist(tmp_path: Path) -> None:
    from _measure import write_block

    assert peer.result_key("tiny_calc") == "trl_peer" and peer.result_key("smol_calc") == "trl_peer smol_calc"
    assert peer.peer_settings(_recipe("smol_calc")).key == "trl_peer smol_calc"
    # a bfloat16 comparison stands beside its recipe's float32 one
    assert peer.result_key("smol_calc", "bfloat16") == "trl_peer smol_calc bfloat16"
    assert peer.result_key("smol_calc", "float32") == "trl_peer smol_calc"
    doc = tmp_path / "RESULTS.md"
    doc.write_text("## A peer: TRL's GRPOTrainer\n\nprose\n\n## Next\n")
    write_block("trl_peer", "tiny 1", path=str(doc), section="A peer: TRL's GRPOTrainer")
    write_block("trl_peer smol_calc", "smol 1", path=str(doc), section="A peer: TRL's GRPOTrainer")
    write_block("trl_peer", "tiny 2", path=str(doc), section="A peer: TRL's GRPOTrainer")
    text = doc.read_text()
    assert "tiny 2" in text and "smol 1" in text and "tiny 1" not in text and text.index("smol 1") < text.index("## Next")


def test_the_goal_per_recipe() -> None:
    assert peer.peer_settings(_recipe("tiny_calc")).goal == peer.TINY_GOAL
    smol = peer.peer_settings(_recipe("smol_calc")).goal
    assert smol == peer.REAL_MODEL_GOAL and smol.speedup == 1.5 and smol.within == pytest.approx(2 / 3)
    trl = [_run(s, "TRL", 96.0, [(0, 0.0, 0.4), (10, 30.0, 0.8)]) for s in (0, 1, 2)]  # 40 samples/s, final 0.8 at 30 s
    ours = [_run(0, "agentrl", 60.0, [(0, 0.0, 0.4), (10, 20.0, 0.8)]),  # 64/s; 20 s <= 2/3 of 30 s
            _run(1, "agentrl", 60.0, [(0, 0.0, 0.4), (10, 21.0, 0.8)]),  # 21 s: sooner than TRL, but not within 2/3
            _run(2, "agentrl", 64.0, [(0, 0.0, 0.4), (10, 25.0, 0.8)])]  # 60/s
    goal = peer.check_goal(trl + ours, smol)
    assert goal.median_ratio == pytest.approx(1.6) and goal.speed_met
    assert [r.agentrl_sooner for r in goal.races] == [True, False, False] and goal.accuracy_met is False
    assert "Goal (issue 34)" in "\n".join(peer.goal_lines(goal))
    tiny = peer.check_goal(trl + ours)  # issue 33's rule: less wall-clock, 1.3x
    assert [r.agentrl_sooner for r in tiny.races] == [True, True, True] and tiny.met is True


def test_defaults_follow_the_recipe_and_the_dtype_is_given_to_agentrl_only_for_auto() -> None:
    import argparse

    def filled(name: str, *overrides: str) -> argparse.Namespace:
        args = argparse.Namespace(steps=None, save_every=None, sft=None, out=None, dtype=None, recipe=f"recipes/{name}.toml")
        peer.fill_defaults(args, _recipe(name, *overrides))
        return args

    # a recipe that names its dtype (smol_calc asks for "auto" since bfloat16 on CPUs, so it is named here)
    tiny, smol = filled("tiny_calc"), filled("smol_calc", 'model.dtype="float32"')
    assert (tiny.steps, tiny.save_every, tiny.sft, tiny.out, tiny.dtype) == (120, 20, "runs/tiny_calc/sft", "runs/bench_trl_peer", "float32")
    assert (smol.steps, smol.save_every, smol.sft, smol.out, smol.dtype) == (20, 5, "runs/smol_calc/sft", "runs/bench_trl_peer_smol_calc",
                                                                           "float32")
    assert peer.dtype_overrides(smol) == []
    auto = filled("smol_calc")  # the recipe's own "auto": resolved on this machine, given to agentrl's runs
    assert auto.dtype in ("float32", "bfloat16") and peer.dtype_overrides(auto) == [f'model.dtype="{auto.dtype}"']


def test_the_sft_command_stops_after_the_sft_stage_and_writes_the_checkpoint_asked_for() -> None:
    import shlex

    cmd = peer.sft_command("recipes/smol_calc.toml", "runs/smol_calc/sft")
    words = shlex.split(cmd)
    assert words[:5] == ["flock", "/tmp/agentrl-heavy.lock", ".venv/bin/agentrl", "train", "recipes/smol_calc.toml"]
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    recipe = _recipe("smol_calc", *sets)
    assert recipe.mode == "sft" and recipe.sft.steps == 10
    assert Path(recipe.run_dir) / "sft" == Path("runs/smol_calc/sft")  # the controller's run_dir.sft


def test_the_intro_says_the_recipes_numbers() -> None:
    import argparse

    args = argparse.Namespace(seeds="0,1,2", recipe="recipes/smol_calc.toml", sft="runs/smol_calc/sft", steps=20, save_every=10,
                              out="runs/bench_trl_peer_smol", dtype="float32")
    text = peer.intro(peer.peer_settings(_recipe("smol_calc")), args, "1.16.0")
    assert "20 optimiser steps of 16 episodes (4 prompts x 4)" in text and "lr 2e-05" in text and "128 problems" in text
    assert "32 episodes" not in text and "`recipes/smol_calc.toml` (`smol_calc`)" in text


class _PieceTokenizer:
    """A tokenizer over a fixed list of pieces (greedy longest match), enough for stop handling."""

    def __init__(self, pieces: list[str], eos: str = "<|im_end|>") -> None:
        self.pieces = pieces
        self.eos_token, self.eos_token_id = eos, pieces.index(eos)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        while text:
            best = max((p for p in self.pieces if text.startswith(p)), key=len)
            ids.append(self.pieces.index(best))
            text = text[len(best):]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids)


def test_a_multi_token_stop_is_a_string_and_a_single_token_stop_an_eos_id() -> None:
    split = _PieceTokenizer(["<|im_end|>", "</", "code", ">", ">\n", "x", "=", "1", "\n", "y"])
    stops = peer.turn_stops(split, ("</code>",))
    assert stops.eos_ids == (0,) and stops.strings == ("</code>",)  # not the unknown id convert_tokens_to_ids gave
    whole = _PieceTokenizer(["<|im_end|>", "</code>", "x", "=", "1", "\n"])
    assert peer.turn_stops(whole, ("</code>",)) == peer.TurnStops(eos_ids=(0, 1), strings=())
    # the turn keeps the token that completes the string (here `>\n`, as vLLM keeps it), nothing after (HF's padding)
    ids = split.encode("x=1\n</code>\ny") + [0, 0]
    assert split.decode(ids[: peer.end_of_turn(ids, split, stops.strings)]) == "x=1\n</code>\n"
    assert peer.end_of_turn(split.encode("x=1</"), split, stops.strings) == 4  # no stop: all kept
    assert peer.end_of_turn(ids, split, ()) == len(ids)  # no multi-token stop (the tiny tokenizer): untouched


def test_smollm2_stops_at_code_end_in_hf_generate(smol_model) -> None:
    """SmolLM2's tokenizer writes ``</code>`` with three tokens: HF ``generate`` (the call TRL's
    ``_generate_single_turn`` makes) stops that sequence there and pads it with ``<|im_end|>``
    (SmolLM2's pad token), and :func:`end_of_turn` cuts the padding, so the turn ends with
    ``</code>`` as agentrl's does. A 1-layer random model; the tokens are forced."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

    tok = AutoTokenizer.from_pretrained(smol_model)
    stops = peer.turn_stops(tok, ("</code>",))
    assert stops.eos_ids == (tok.eos_token_id,) and stops.strings == ("</code>",)
    turns = [tok.encode("x = 1\n</code>", add_special_tokens=False), tok.encode("print(2)\nprint(3)\n", add_special_tokens=False)]
    width = max(map(len, turns)) + 3

    class Force(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            k = input_ids.shape[1] - 1  # one prompt token
            out = torch.full_like(scores, -1e9)
            for row, turn in enumerate(turns):
                out[row, turn[k] if k < len(turn) else tok.encode("y", add_special_tokens=False)[0]] = 0.0
            return out

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    peer.stop_on_strings(model, tok, stops.strings)
    out = model.generate(torch.tensor([[1], [1]]), max_new_tokens=width, do_sample=False, use_cache=True,
                         logits_processor=LogitsProcessorList([Force()]), pad_token_id=tok.pad_token_id, eos_token_id=list(stops.eos_ids))
    first, second = out[0, 1:].tolist(), out[1, 1:].tolist()
    assert first[: len(turns[0])] == turns[0] and first[len(turns[0])] == tok.pad_token_id  # stopped, then padded
    assert len(second) == width and second[: len(turns[1])] == turns[1]  # the other row ran on
    assert first[: peer.end_of_turn(first, tok, stops.strings)] == turns[0]
    assert peer.end_of_turn(second, tok, stops.strings) == len(second)


def test_trls_rollout_ends_a_smollm2_turn_at_code_end_as_agentrl_does(smol_model) -> None:
    """:class:`CalcRollout` (TRL's ``rollout_func``) with SmolLM2's tokenizer and a stand-in for
    TRL's ``_generate_single_turn`` that returns what HF ``generate`` does when a sequence stops
    at ``</code>`` in a batch: the turn, then padding (``<|im_end|>``). The turn must end at
    ``</code>``, the interpreter must run it, and only the model's tokens are trained on."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from agentrl.envs import make_env
    from agentrl.envs.data import load_rows

    tok = AutoTokenizer.from_pretrained(smol_model)
    recipe = _recipe("smol_calc", 'sandbox.type="unsafe-local"', "sandbox.preload=null")
    rows = load_rows("synthetic:calc", limit=2, seed=0)
    env = make_env(recipe.env.id, **recipe.env.kwargs)
    prompts = [env.unwrapped.initial_messages(r) for r in rows]
    stops = peer.turn_stops(tok, tuple(recipe.rollout.stop))
    turns = {0: [f"<code>print({r['question'].removeprefix('Compute ').rstrip('.')})</code>" for r in rows],
             1: [f"\\boxed{{{r['answer']}}}" for r in rows]}
    calls: list[int] = []

    class Trainer:
        state = SimpleNamespace(global_step=0)

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
            texts = turns[len(calls)]
            calls.append(len(prompt_ids))
            ids = [tok.encode(t, add_special_tokens=False) for t in texts]
            width = max(map(len, ids)) + 4
            if len(calls) == 1:  # HF pads a stopped row with the pad token; TRL keeps it up to the first EOS
                return [x + [tok.pad_token_id] for x in ids], None
            return [x + [tok.eos_token_id] for x in ids], None

    rollout = peer.CalcRollout(recipe, tok, rows, stops.strings)
    try:
        out = rollout(prompts, Trainer())
    finally:
        rollout.close()
    assert calls == [2, 2] and out["env_reward"] == [1.0, 1.0]
    for completion, mask, first, row in zip(out["completion_ids"], out["env_mask"], turns[0], rows):
        n = len(tok.encode(first, add_special_tokens=False))
        assert tok.decode(completion[:n]) == first and mask[:n] == [1] * n  # the turn, ending at </code>, trained on
        assert mask[n] == 0  # what follows is the template's glue, not HF's padding kept as the model's token
        glue = completion[n: n + mask[n:].index(1)]
        assert row["answer"] in tok.decode(glue)  # the interpreter ran the turn's code
        assert tok.decode(completion[n + len(glue):]) == f"\\boxed{{{row['answer']}}}<|im_end|>" and mask[-1] == 1


def test_samples_per_second_count_the_recipes_episodes_per_step() -> None:
    run = peer.Run(seed=0, side="TRL", steps=20, rl_s=40.0, command_s=60.0, episodes_per_step=16)
    assert run.samples_per_s == pytest.approx(8.0)  # smol_calc: 16 episodes a step, not the tiny task's 32


def test_agentrl_trains_every_step_from_the_sft_checkpoint_in_the_resolved_dtype() -> None:
    import argparse

    from agentrl.config import parse_override

    args = argparse.Namespace(sft="runs/smol_calc/sft", steps=20, save_every=10, no_eval=False, dtype="bfloat16", recipe_dtype="auto")
    sets = dict((".".join(k), v) for k, v in map(parse_override, peer.agentrl_overrides(args, 2)))
    assert sets["seed"] == 2 and sets["sft.steps"] == 0 and sets["learner.max_steps"] == 20 and sets["eval.every_steps"] == 10
    assert sets["model.path"] == str(ROOT / "runs/smol_calc/sft") and sets["model.dtype"] == "bfloat16"
    assert sets["learner.max_degenerate_steps"] == 0  # as TRL: no early end on steps without signal
    recipe = _recipe("smol_calc", *peer.agentrl_overrides(args, 2))
    assert recipe.learner.max_steps == 20 and recipe.model.dtype == "bfloat16"
