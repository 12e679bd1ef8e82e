"""A first GPU run's check of colocated placement on one GPU with real Ray, without vLLM
(docs/retool.md, "Never run on a GPU", items 2 and 8), runnable on a GPU machine that has torch,
transformers and Ray but neither vLLM nor the model's weights.

It reserves what a colocated run reserves (:class:`~agentrl.engine.training.placement.SharedPlacement`:
one bundle of ``{GPU: 1}`` per pair, half of it to each actor), starts learner rank 0 in it
through :class:`~agentrl.engine.training.learner_group.LearnerGroup` (a Ray actor, the batch
through Ray's object store, as a run does) with a recipe's learner settings on a randomly
initialised model of the recipe's architecture, and a *neighbour* actor where generator 0 would
be (the generator's own Ray options, :meth:`SharedPlacement.generator_options`). A third actor
with no GPU stands for a CPU critic. Then it records:

- what each actor sees: ``CUDA_VISIBLE_DEVICES``, ``ray.get_gpu_ids()``, the device
  :func:`~agentrl.engine.common.devices.resolve_device` picks, the GPU's UUID (learner and
  neighbour must see the same GPU; the CPU actor must pick the CPU);
- the GPU's used memory as the neighbour's process sees it (``torch.cuda.mem_get_info``, the whole
  device) and ``nvidia-smi``'s per-process figures: after set-up, after a step, after
  ``offload_states`` (what vLLM would get back while it generates), after ``reload_states``;
- two learner steps through the group (the call's seconds against the rank's own ``train_s``);
- a CUDA IPC handover of a real parameter shard from the learner rank to the neighbour as vLLM's
  ``ipc`` weight-transfer engine does it (``torch.multiprocessing.reductions.reduce_tensor`` in the
  trainer, handles keyed by the GPU's UUID, ``rebuild_cuda_tensor`` with the receiver's device
  index in the worker): the neighbour's checksum must equal the learner's.

It prints one line per finding and writes them as JSON (``--out``). Run on the GPU::

    python benchmarks/gpu_colocated_check.py --out gpu_colocated_check.json

On a CPU machine the same command checks the script itself with a small ``--config`` (no GPU:
no IPC and no memory figures; the placement asks Ray for no GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_learner_check import GIB, make_rows, recipe_path, write_random_model  # noqa: E402


class Neighbour:
    """A Ray actor that looks at the GPU from its own process (where generator 0 would run)."""

    def look(self) -> dict[str, Any]:
        """What this process sees: devices, the choice of :func:`resolve_device`, used memory."""
        import ray
        import torch

        from agentrl.engine.common.devices import resolve_device

        choice = resolve_device()
        seen: dict[str, Any] = {
            "pid": os.getpid(),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "on_gpu": choice.on_gpu, "cuda_index": choice.cuda_index, "reason": choice.reason,
        }
        if choice.on_gpu:
            free, total = torch.cuda.mem_get_info(choice.cuda_index)
            seen["uuid"] = str(torch.cuda.get_device_properties(choice.cuda_index).uuid)
            seen["device_used_gib"] = (total - free) / GIB
        return seen

    def receive(self, handle: dict[str, Any]) -> dict[str, Any]:
        """Rebuild the learner's tensor from its IPC handle as vLLM's ``ipc`` engine does (the
        handle of this GPU's UUID, the device index replaced by this process's) and sum it."""
        import torch
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        from agentrl.engine.common.devices import resolve_device

        index = resolve_device().cuda_index
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        if uuid not in handle["by_uuid"]:
            return {"error": f"no handle for this GPU {uuid}; the learner's: {list(handle['by_uuid'])}"}
        args = list(handle["by_uuid"][uuid])
        args[6] = index
        t0 = time.monotonic()
        tensor = rebuild_cuda_tensor(*args)
        total = float(torch.sum(tensor, dtype=torch.float64).item())  # no float64 copy of the tensor
        return {"sum": total, "shape": list(tensor.shape), "dtype": str(tensor.dtype), "rebuild_s": time.monotonic() - t0}


def share_a_shard(learner: Any) -> dict[str, Any]:
    """Run inside the learner actor (``__ray_call__``): the IPC handle of its largest parameter's
    local shard, copied to bfloat16 as the handover sends it, and that copy's sum."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    params = [p for p in learner.trained_module().parameters()]
    p = max(params, key=lambda q: q.numel())
    local = p.to_local() if hasattr(p, "to_local") else p
    copy = local.detach().to(torch.bfloat16).contiguous()
    learner._ipc_keepalive = copy  # the receiver maps this memory: it must outlive the call
    _, args = reduce_tensor(copy)
    uuid = str(torch.cuda.get_device_properties(copy.device).uuid)
    return {"by_uuid": {uuid: args}, "sum": float(torch.sum(copy, dtype=torch.float64).item()), "shape": list(copy.shape),
            "device": str(copy.device)}


def learner_looks(learner: Any) -> dict[str, Any]:
    """Run inside the learner actor: what its process sees and where its parameters are."""
    import ray
    import torch

    seen = {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": [str(i) for i in ray.get_gpu_ids()], "device": str(learner.device),
            "param_devices": sorted({str(p.device) for p in learner.trained_module().parameters()})}
    if learner.device.type == "cuda":
        seen["uuid"] = str(torch.cuda.get_device_properties(learner.device).uuid)
        seen["allocated_gib"] = torch.cuda.memory_allocated(learner.device) / GIB
    return seen


def smi() -> list[dict[str, Any]]:
    """``nvidia-smi``'s compute processes: pid and used MiB ([] without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [{"pid": int(a), "used_mib": int(b)} for a, b in (line.split(",") for line in out.splitlines() if "," in line)]


async def check(args: argparse.Namespace, report: dict[str, Any]) -> None:
    import ray
    import torch

    from agentrl.config import load_recipe
    from agentrl.engine.common.cluster import new_actor
    from agentrl.engine.training.learner import Learner
    from agentrl.engine.training.learner_group import LearnerGroup
    from agentrl.engine.training.placement import SharedPlacement
    from agentrl.engine.wiring import learner_kwargs

    cuda = torch.cuda.is_available()
    t0 = time.monotonic()
    ray.init(num_cpus=8, include_dashboard=False, num_gpus=torch.cuda.device_count() if cuda else 0)
    report["ray_init_s"] = time.monotonic() - t0
    report["cluster"] = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    recipe = load_recipe(recipe_path(args.recipe), args.set)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        report["model_write_s"] = write_random_model(ROOT / args.config, model_dir)
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
        rows = make_rows(args.rows, args.min_len, args.max_len, vocab, seed=0)
        report["tokens"] = sum(len(r["tokens"]) for r in rows)
        kwargs = learner_kwargs(recipe, model=str(model_dir), tokenizer=None, run_dir=Path(tmp) / "run")
        kwargs["audit_path"] = None
        lc, g = recipe.learner, recipe.generator
        if cuda:
            shared = SharedPlacement(1, lc.num_cpus + g.num_cpus, {}, 120).with_learner_cpus(lc.num_cpus)
            neighbour_opts = shared.generator_options(0, g.num_cpus)
        else:  # the script's own check on a CPU machine: the same calls, no GPU asked for
            from agentrl.engine.training.placement import LearnerPlacement, learner_bundles

            shared = LearnerPlacement(learner_bundles(1, lc.num_cpus, 0.0, {}), 120)
            neighbour_opts = {"num_cpus": 0}
        report["learner_options"] = {k: v for k, v in shared.options(0).items() if k != "scheduling_strategy"}
        report["neighbour_options"] = {k: v for k, v in neighbour_opts.items() if k != "scheduling_strategy"}
        neighbour = new_actor(Neighbour, neighbour_opts)
        cpu_actor = new_actor(Neighbour, {"num_cpus": 0, "num_gpus": 0})
        report["cpu_actor"] = ray.get(cpu_actor.look.remote(), timeout=120)
        group = LearnerGroup(num_ranks=1, factory=lambda rank, kw, opts: new_actor(Learner, opts, **kw),
                             placement=lambda: shared, timeout_s=900, placement_timeout_s=120)
        report["neighbour_before"] = ray.get(neighbour.look.remote(), timeout=120)
        t1 = time.monotonic()
        setup = await group.start(kwargs)
        report["setup_s"] = time.monotonic() - t1
        report["setup"] = {k: str(v) for k, v in setup[0].items() if k in ("backend", "device", "parameters", "mixed_precision")}
        rank = group.handles[0]
        report["learner"] = ray.get(rank.__ray_call__.remote(learner_looks), timeout=120)
        report["after_setup"] = {"neighbour": ray.get(neighbour.look.remote(), timeout=60), "smi": smi()}
        behaviour = (await group.call("compute_logprobs", rows, what="log-probs"))[0]
        batch = [{**r, "behaviour_logprobs": lp} for r, lp in zip(rows, behaviour)]
        report["steps"] = []
        for step in range(2):
            t2 = time.monotonic()
            metrics = (await group.call("train_step", batch, what=f"step {step + 1}"))[0]
            report["steps"].append({"call_s": time.monotonic() - t2, "loss": metrics.get("loss"),
                                    **{k: v for k, v in metrics.items() if k.endswith("_s")}})
        report["after_step"] = {"neighbour": ray.get(neighbour.look.remote(), timeout=60), "smi": smi(),
                                "learner": ray.get(rank.__ray_call__.remote(learner_looks), timeout=60)}
        if cuda:
            handle = ray.get(rank.__ray_call__.remote(share_a_shard), timeout=120)
            got = ray.get(neighbour.receive.remote(handle), timeout=120)
            report["ipc"] = {"sent": {k: v for k, v in handle.items() if k != "by_uuid"}, "received": got}
            ray.get(rank.__ray_call__.remote(lambda learner: setattr(learner, "_ipc_keepalive", None)), timeout=60)
        for what in ("offload_states", "reload_states"):
            seconds = (await group.call(what, what=what))[0]
            report[what] = {"s": seconds, "neighbour": ray.get(neighbour.look.remote(), timeout=60), "smi": smi(),
                            "learner": ray.get(rank.__ray_call__.remote(learner_looks), timeout=60)}
        await group.stop()
        if isinstance(shared, SharedPlacement):
            shared.close()  # the shared reservation outlives the learner group (its release() keeps it)
        else:
            shared.release()
    ray.shutdown()


def verdict(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each finding: ``ok`` and the figures it rests on."""
    out: dict[str, dict[str, Any]] = {}
    learner, neighbour, cpu = report.get("learner", {}), report.get("neighbour_before", {}), report.get("cpu_actor", {})
    out["cpu actor picks the CPU"] = {"ok": cpu.get("on_gpu") is False, "reason": cpu.get("reason")}
    out["steps trained"] = {"ok": len(report.get("steps", [])) == 2, "steps": report.get("steps")}
    if "ipc" not in report:
        return out
    out["same GPU for learner and neighbour"] = {
        "ok": learner.get("uuid") is not None and learner.get("uuid") == neighbour.get("uuid"),
        "learner": learner.get("CUDA_VISIBLE_DEVICES"), "neighbour": neighbour.get("CUDA_VISIBLE_DEVICES")}
    sent, got = report["ipc"]["sent"], report["ipc"]["received"]
    out["ipc handover exact"] = {"ok": got.get("sum") == sent["sum"] and got.get("shape") == sent["shape"],
                                 "sent": sent["sum"], "received": got.get("sum", got.get("error"))}
    used = {k: report[k]["neighbour"]["device_used_gib"] for k in ("offload_states", "reload_states")}
    used["after_step"] = report["after_step"]["neighbour"]["device_used_gib"]
    out["offload frees the GPU for the neighbour"] = {"ok": used["offload_states"] < used["after_step"] - 1.0, **used}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="recipes/retool_math_1gpu.toml")
    p.add_argument("--config", default="benchmarks/configs/qwen2.5-1.5b-instruct.json",
                   help="the model architecture's config.json (randomly initialised)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override")
    p.add_argument("--out", default="gpu_colocated_check.json")
    args = p.parse_args(argv)
    report: dict[str, Any] = {"recipe": args.recipe, "config": args.config}
    try:
        asyncio.run(check(args, report))
    except Exception as exc:  # the findings so far are still written
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["verdict"] = verdict(report)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    for name, v in report["verdict"].items():
        print(f"{'ok  ' if v['ok'] else 'FAIL'} {name}: {json.dumps({k: x for k, x in v.items() if k != 'ok'}, default=str)}", flush=True)
    if "error" in report:
        print(f"FAIL error: {report['error']}", flush=True)
    return 0 if "error" not in report and all(v["ok"] for v in report["verdict"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
