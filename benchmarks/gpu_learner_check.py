"""A first GPU run's check of the learner rank (docs/retool.md, "Never run on a GPU", items 1, 2,
3, 5 and 8's ``learner.offload_states``), runnable on a GPU machine that has torch and
transformers but neither vLLM nor Ray nor the model's weights.

One learner rank (:class:`agentrl.engine.training.learner.Learner`, world size 1) is built from a
recipe's learner settings (:func:`agentrl.engine.wiring.learner_kwargs`, so the recipe's dtype,
micro-batch tokens, activation checkpointing and AdamW) on a model of the recipe's architecture,
randomly initialised from a ``config.json`` (no download: the memory and the code paths do not
depend on the weights' values). On random token rows of the lengths a run feeds it, two arms run
one after the other, each in a process of its own (a process holds one process group):

- ``offload``: step 1; the peak memory of that step against the dry run's plan
  (:func:`agentrl.placement_plan.memory_plan`); the log-probs of a few rows, every parameter and
  every AdamW moment; ``offload_states()`` (seconds, the memory left); ``reload_states()``
  (seconds); the same log-probs, parameters and moments again (they must be bit for bit what
  they were); offloaded again, then step 2 (the step brings the states back itself:
  ``learner_reload_s``); one version published in the serving dtype (seconds, bytes);
- ``plain``: steps 1 and 2 without offloading; step 2's loss, gradient norm and the final
  log-probs must match the ``offload`` arm's.

It prints one line per finding and writes them all as JSON (``--out``). Run on the GPU::

    python benchmarks/gpu_learner_check.py --recipe recipes/retool_math_1gpu.toml \
        --config benchmarks/configs/qwen2.5-1.5b-instruct.json --out gpu_learner_check.json

On this CPU the same command with a small ``--config`` and ``--rows``/``--max-len`` checks the
script itself (the offload is a no-op on the CPU).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_random_model(config_path: Path, folder: Path) -> float:
    """A Hugging Face folder at ``folder`` holding a randomly initialised model of
    ``config_path``'s architecture, in bfloat16 (built on the GPU when there is one). Seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.monotonic()
    config = AutoConfig.for_model(**json.loads(config_path.read_text()))
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    return time.monotonic() - t0


def make_rows(n: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows of random tokens, lengths spread from ``min_len`` to ``max_len`` (the longest
    exactly ``max_len``, the one that sets a micro-batch's activation peak); the first quarter of
    each row is prompt (loss mask 0); advantages +1/-1 alternately."""
    rng = random.Random(seed)
    lengths = [max_len] + [rng.randint(min_len, max_len) for _ in range(n - 1)]
    rows = []
    for i, length in enumerate(lengths):
        prompt = max(1, length // 4)
        rows.append({
            "tokens": [rng.randrange(vocab) for _ in range(length)],
            "loss_mask": [0] * prompt + [1] * (length - prompt),
            "advantage": 1.0 if i % 2 == 0 else -1.0,
        })
    return rows


def digest(tensors: list[Any]) -> list[float]:
    """One float64 sum per tensor (a DTensor's local shard): equal lists mean equal tensors here,
    since the check compares a tensor with itself after a round trip."""
    import torch

    out = []
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        out.append(float(local.detach().double().sum().item()) + float(local.detach().double().abs().sum().item()))
        del local
    return out


def states(learner: Any) -> tuple[list[Any], list[Any]]:
    """The parameters AdamW updates (FSDP2's sharded ones: after a forward pass alone the root
    module registers its unsharded ones until the next reshard) and its moments (``exp_avg``,
    ``exp_avg_sq``)."""
    params = [p for g in learner.optimizer.param_groups for p in g["params"]]
    moments = [v for st in learner.optimizer.state.values() for k, v in sorted(st.items()) if k != "step"]
    return params, moments


def memory() -> dict[str, float]:
    """CUDA memory now, GiB: allocated by torch, reserved by its caching allocator (zeros on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {"allocated_gib": 0.0, "reserved_gib": 0.0}
    return {"allocated_gib": torch.cuda.memory_allocated() / GIB, "reserved_gib": torch.cuda.memory_reserved() / GIB}


def run_arm(arm: str, kwargs: dict[str, Any], rows: list[dict[str, Any]], probe: int, out: str) -> None:
    """One arm in this (spawned) process; its findings go to ``out`` as JSON."""
    import torch

    from agentrl.engine.training.learner import Learner

    found: dict[str, Any] = {"arm": arm}
    learner = Learner(rank=0, master_addr="127.0.0.1", master_port=free_port(), **kwargs)
    t0 = time.monotonic()
    found["setup"] = {k: v for k, v in learner.setup().items() if k in ("backend", "device", "parameters", "mixed_precision")}
    found["setup"]["device"] = str(learner.device)
    found["setup_s"] = time.monotonic() - t0
    found["after_setup"] = memory()
    behaviour = learner.compute_logprobs(rows)
    batch = [{**r, "behaviour_logprobs": lp} for r, lp in zip(rows, behaviour)]
    probe_rows = rows[:probe]

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    found["step1"] = learner.train_step(batch)
    found["step1_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0
    found["step1_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB if cuda else 0.0
    found["after_step1"] = memory()

    if arm == "offload":
        before_lp = learner.compute_logprobs(probe_rows)
        params, moments = states(learner)
        before_p, before_m = digest(params), digest(moments)
        param_ids = [id(p) for p in params]
        found["moment_bytes"] = sum(m.numel() * m.element_size() for m in moments)
        del params, moments  # no reference of this check may keep the device copies alive
        found["offload_s"] = learner.offload_states()
        found["after_offload"] = memory()
        found["param_devices_offloaded"] = sorted({str(p.device) for p in learner.trained_module().parameters()})
        found["reload_s"] = learner.reload_states()
        found["after_reload"] = memory()
        params_after, moments_after = states(learner)
        learner.trained_module().reshard()  # the module's registered parameters: the sharded ones
        found["same_parameter_objects"] = param_ids == [id(p) for p in params_after] == [
            id(p) for p in learner.trained_module().parameters() if p.requires_grad]
        found["parameters_equal"] = digest(params_after) == before_p
        found["moments_equal"] = digest(moments_after) == before_m
        del params_after, moments_after
        after_lp = learner.compute_logprobs(probe_rows)
        found["logprobs_equal_after_reload"] = after_lp == before_lp
        # more round trips, as the loop makes one a step: the first pays for the host memory
        found["cycles"] = []
        for _ in range(2):
            off = learner.offload_states()
            left = memory()["allocated_gib"]
            found["cycles"].append({"offload_s": off, "allocated_gib": left, "reload_s": learner.reload_states()})
        learner.offload_states()  # as the loop leaves it while vLLM generates; step 2 brings it back
        found["offloaded_before_step2"] = learner.offloaded
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    found["step2"] = learner.train_step(batch)
    # step 2 is the steady state: AdamW's moments exist during its backward pass (step 1 makes them)
    found["step2_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0
    found["final_logprobs"] = learner.compute_logprobs(probe_rows)
    if arm == "offload":
        with tempfile.TemporaryDirectory() as tmp:
            t1 = time.monotonic()
            folder = learner.publish(str(Path(tmp) / "v2"), serving_dtype=True)
            found["publish_s"] = time.monotonic() - t1
            found["publish_bytes"] = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
    learner.shutdown()
    Path(out).write_text(json.dumps(found))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="recipes/retool_math_1gpu.toml")
    p.add_argument("--config", default="benchmarks/configs/qwen2.5-1.5b-instruct.json",
                   help="the model architecture's config.json (randomly initialised)")
    p.add_argument("--rows", type=int, default=24, help="rows in the batch")
    p.add_argument("--min-len", type=int, default=512)
    p.add_argument("--max-len", type=int, default=8192, help="the longest row (the recipe's max_episode_tokens)")
    p.add_argument("--probe", type=int, default=4, help="rows whose log-probs are compared")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override")
    p.add_argument("--arms", default="offload,plain", help="comma-separated: offload, plain (the twin without offload)")
    p.add_argument("--out", default="gpu_learner_check.json")
    args = p.parse_args(argv)

    import torch

    from agentrl.config import load_recipe
    from agentrl.engine.wiring import learner_kwargs
    from agentrl.placement_plan import memory_plan

    recipe = load_recipe(ROOT / args.recipe if not Path(args.recipe).is_absolute() else args.recipe, args.set)
    cuda = torch.cuda.is_available()
    device_gib = torch.cuda.get_device_properties(0).total_memory / GIB if cuda else float(recipe.placement.gpu_memory_gib or 80)
    report: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu", "device_gib": device_gib,
        "recipe": args.recipe, "config": args.config, "rows": args.rows, "max_len": args.max_len,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        report["model_write_s"] = write_random_model(ROOT / args.config, model_dir)
        plan = memory_plan(load_recipe(recipe_path(args.recipe), [*args.set, f"model.path={model_dir}"]), device_gib)
        if plan is not None:
            report["plan"] = {"parameters": plan.parameters, "learner_gib": plan.learner, "generator_gib": plan.generator,
                              "peak_gib": plan.peak, "lines": plan.lines()}
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
        rows = make_rows(args.rows, args.min_len, args.max_len, vocab, seed=0)
        report["tokens"] = sum(len(r["tokens"]) for r in rows)
        kwargs = learner_kwargs(recipe, model=str(model_dir), tokenizer=None, run_dir=Path(tmp) / "run")
        kwargs["audit_path"] = None
        ctx = mp.get_context("spawn")
        for arm in args.arms.split(","):
            out = Path(tmp) / f"{arm}.json"
            proc = ctx.Process(target=run_arm, args=(arm, kwargs, rows, args.probe, str(out)))
            proc.start()
            proc.join(timeout=900)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=30)
            if proc.exitcode != 0 or not out.is_file():
                report[arm] = {"error": f"the {arm} arm exited with status {proc.exitcode}"}
                continue
            report[arm] = json.loads(out.read_text())
    report["verdict"] = verdict(report)
    Path(args.out).write_text(json.dumps(report, indent=1))
    for line in summary(report):
        print(line, flush=True)
    return 0 if all(v["ok"] for v in report["verdict"].values()) else 1


def recipe_path(recipe: str) -> Path:
    """``recipe`` relative to the repository unless absolute."""
    return Path(recipe) if Path(recipe).is_absolute() else ROOT / recipe


def verdict(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each check's finding: ``{"ok": bool, "what": words}``."""
    off, plain = report.get("offload", {}), report.get("plain")
    v: dict[str, dict[str, Any]] = {}
    if "step1" not in off or (plain is not None and "step1" not in plain):
        return {"arms": {"ok": False, "what": f"{off.get('error', 'no offload arm')} {(plain or {}).get('error', '')}".strip()}}
    cuda = report["cuda"] is not None
    v["backend"] = {"ok": off["setup"]["backend"] == ("cpu:gloo,cuda:nccl" if cuda else "gloo"),
                    "what": f"backend {off['setup']['backend']} on {off['setup']['device']}, mixed precision {off['setup']['mixed_precision']}"}
    plan = report.get("plan")
    if plan is not None and cuda:
        peak = max(off["step1_peak_allocated_gib"], off.get("step2_peak_allocated_gib", 0.0))
        v["memory"] = {"ok": peak <= report["device_gib"] - plan["generator_gib"],
                       "what": (f"peak {off['step1_peak_allocated_gib']:.1f} GiB allocated in step 1 "
                                f"({off['step1_peak_reserved_gib']:.1f} reserved), {off.get('step2_peak_allocated_gib', 0.0):.1f} in step 2, against the "
                                f"plan's learner {plan['learner_gib']:.1f} GiB + activations; vLLM's share is "
                                f"{plan['generator_gib']:.1f} of {report['device_gib']:.1f} GiB")}
    if cuda:
        left = off["after_offload"]["allocated_gib"]
        lefts = [left] + [c["allocated_gib"] for c in off["cycles"]]
        v["offload_frees"] = {"ok": max(lefts) < 0.05 * max(off["after_step1"]["allocated_gib"], 1e-9) + 0.5,
                              "what": (f"offload {off['offload_s']:.2f} s: {off['after_step1']['allocated_gib']:.1f} -> {left:.2f} GiB "
                                       f"allocated; reload {off['reload_s']:.2f} s; then offload/reload " + ", ".join(
                                           f"{c['offload_s']:.2f}/{c['reload_s']:.2f} s" for c in off["cycles"]))}
    v["round_trip_exact"] = {"ok": off["same_parameter_objects"] and off["parameters_equal"] and off["moments_equal"]
                             and off["logprobs_equal_after_reload"],
                             "what": (f"same Parameter objects {off['same_parameter_objects']}, parameters equal {off['parameters_equal']}, "
                                      f"moments equal {off['moments_equal']}, log-probs equal {off['logprobs_equal_after_reload']}")}
    if plain is not None:
        def rel(key: str, step: str) -> float:
            return abs(off[step][key] - plain[step][key]) / max(abs(plain[step][key]), 1e-12)

        # step 1 runs the same code on the same inputs in both arms: what differs there is the
        # GPU's own run-to-run noise (atomics in the backward pass), the floor for step 2
        pairs = zip(off.get("final_logprobs", []), plain.get("final_logprobs", []))  # a record may leave them out
        d_lp = max((abs(a - b) for ra, rb in pairs for a, b in zip(ra, rb)), default=0.0)
        v["matches_plain"] = {"ok": rel("loss", "step2") < 1e-2 and rel("grad_norm", "step2") < 1e-2,
                              "what": (f"step 2 after an offload against no offload: loss rel. diff {rel('loss', 'step2'):.2e}, "
                                       f"grad-norm rel. diff {rel('grad_norm', 'step2'):.2e}, final log-probs max abs diff "
                                       f"{d_lp:.2e} (noise floor: step 1's grad-norm rel. diff {rel('grad_norm', 'step1'):.2e}, "
                                       f"the same code on the same inputs); step 2 reloaded in "
                                       f"{off['step2'].get('learner_reload_s', 0.0):.2f} s")}
    v["publish"] = {"ok": off["publish_bytes"] > 0,
                    "what": f"a version in the serving dtype: {off['publish_bytes'] / 1e9:.2f} GB in {off['publish_s']:.2f} s"}
    return v


def summary(report: dict[str, Any]) -> list[str]:
    """The report in lines."""
    lines = [f"{report['device_name']} ({report['device_gib']:.1f} GiB), torch {report['torch']}, "
             f"{report['tokens']} tokens in {report['rows']} rows (longest {report['max_len']})"]
    for arm in ("offload", "plain"):
        a = report.get(arm) or {}
        if "step1" in a:
            s1 = a["step1"]
            lines.append(f"{arm}: setup {a['setup_s']:.1f} s; step 1 {s1['train_s']:.2f} s "
                         f"({s1['trained_tokens'] / max(s1['train_s'], 1e-9):.0f} trained tok/s, forward/backward "
                         f"{s1.get('step_forward_backward_s', 0.0):.2f} s, optimizer {s1.get('step_optimizer_s', 0.0):.2f} s); "
                         f"step 2 {a['step2']['train_s']:.2f} s")
    for line in report.get("plan", {}).get("lines", []):
        lines.append(f"plan: {line}")
    for name, v in report["verdict"].items():
        lines.append(f"{'ok  ' if v['ok'] else 'FAIL'} {name}: {v['what']}")
    return lines


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
