"""Weight sync: one new version into a running vLLM engine, through disk against over gloo.

For each model size, one vLLM engine (in this process, started with the gloo weight-transfer
engine) takes ``--repeats`` updates each way, alternating:

* disk (``weight_sync = "disk"``, the default): the learner writes the version as a safetensors
  folder (``write_hf_folder``, atomic), then the generator pauses (mode ``keep``), reloads it in
  place and resumes;
* gloo (``weight_sync = "gloo"``): the trainer side broadcasts every parameter into the vLLM
  worker through vLLM's weight-transfer API, while the generator is paused.

* adapter (``[lora]``): the learner writes only a LoRA adapter (rank ``--lora-rank`` on every
  linear layer, as ``write_adapter_folder`` does) and a second engine, started with LoRA, adds it
  as a new adapter without pausing anything; its "stall" is the time the engine spent loading it.

One warm-up update each way comes first and is not counted. Reports medians of the whole update
(learner side + generator side) and of the generation stall (pause to resume), and their ratios;
forming the gloo group (the rendezvous, once per engine) is timed and reported on its own.
``medium`` is a randomly initialised Qwen2 of ~30 M parameters with the tiny model's tokenizer.
``--dtype bfloat16`` measures what a bfloat16 run sends: the engine serves bfloat16, each
version is written in bfloat16 (half the bytes) and the gloo broadcast carries bfloat16; the
trainer side keeps float32 weights, as the learner's master weights, and casts as it sends. Its
block stands beside the float32 one (the key ends in the dtype).
``--write`` puts the command, date, machine and table in ``benchmarks/RESULTS.md``, in a marked
block of its own (the prose around it is written by people).

    .venv/bin/python benchmarks/weight_sync.py --model runs/tiny_calc/sft --repeats 5 --lora-rank 16 --write
    .venv/bin/python benchmarks/weight_sync.py --model runs/models/smollm2-135m-instruct --sizes tiny --repeats 5 --write
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _measure import dtype_key, emit, run_header


def _medium(tiny: str, out: Path) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(tiny)
    cfg.update({"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64})
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return str(out)


async def _measure(model: str, repeats: int, scratch: Path, dtype: str = "float32") -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.engine.generation.weight_transfer import (
        LocalGeneratorClient,
        free_endpoint,
        model_source,
        trainer_connect,
    )
    from agentrl.models.hf_folder import write_hf_folder

    wire = getattr(torch, dtype)
    g = VllmGenerator(EngineSettings(model=model, dtype=dtype, max_model_len=512, kv_cache_gib=0.2, weight_transfer="gloo"), timeout_s=300)
    await g.start()
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    params = sum(p.numel() for p in hf.parameters())
    client = LocalGeneratorClient(g, asyncio.get_running_loop(), 300.0)
    address, port = free_endpoint()
    t0 = time.monotonic()
    engine = await asyncio.to_thread(
        trainer_connect, "gloo", rank=0, address=address, port=port, world_size=2, client=client,
        source=model_source(hf, wire), timeout_s=300.0,
    )
    rendezvous = time.monotonic() - t0
    rows: dict[str, list[float]] = {k: [] for k in ("disk_write", "disk_stall", "disk_total", "gloo_stall", "gloo_total")}
    version = 0
    for rep in range(repeats + 1):  # the first round is a warm-up, not counted
        version += 1
        t0 = time.monotonic()
        path = write_hf_folder(hf.state_dict(), hf.config, scratch / f"v{version}", dtype=None if dtype == "float32" else wire)
        write = time.monotonic() - t0
        stall = await g.update_weights(version, str(path))
        disk = {"disk_write": write, "disk_stall": stall, "disk_total": time.monotonic() - t0,
                "bytes": float(sum(f.stat().st_size for f in Path(path).iterdir()))}
        version += 1
        client.version = version
        t0 = time.monotonic()
        await asyncio.to_thread(engine.send_weights)
        gloo = {"gloo_total": time.monotonic() - t0, "gloo_stall": g.update_stalls_s[-1]}
        if rep == 0:
            continue
        for k, v in {**disk, **gloo}.items():
            rows.setdefault(k, []).append(v)
    check = await g.generate(list(range(5, 15)), {"max_tokens": 2, "temperature": 0.0})
    assert check.versions == [version, version]
    await g.shutdown()
    return {"params": params, "rendezvous": rendezvous, **{k: statistics.median(v) for k, v in rows.items()}}


async def _measure_adapter(model: str, repeats: int, scratch: Path, rank: int) -> dict[str, Any]:
    """Adapter updates of rank ``rank`` into a LoRA engine: write, load, total (medians), MB."""
    from transformers import AutoModelForCausalLM

    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.engine.training.lora import (
        LoraSettings,
        adapter_tensors,
        apply_lora,
        vllm_max_lora_rank,
        write_adapter_folder,
    )

    settings = LoraSettings(rank=rank, alpha=2.0 * rank)
    g = VllmGenerator(EngineSettings(model=model, max_model_len=512, kv_cache_gib=0.2, max_lora_rank=vllm_max_lora_rank(rank), max_loras=2), timeout_s=300)
    await g.start()
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), settings, model)
    inner = peft_model.base_model.model
    rows: dict[str, list[float]] = {"adapter_write": [], "adapter_stall": [], "adapter_total": []}
    size = 0.0
    for version in range(1, repeats + 2):  # the first is a warm-up, not counted
        with torch.no_grad():
            for name, p in inner.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0, 0.01)  # a new version
        t0 = time.monotonic()
        path = write_adapter_folder(adapter_tensors(inner.state_dict()), settings, model, scratch / f"a{version}")
        write = time.monotonic() - t0
        stall = await g.update_weights(version, str(path))
        total = time.monotonic() - t0
        size = float(sum(f.stat().st_size for f in Path(path).iterdir()))
        if version > 1:
            for k, v in (("adapter_write", write), ("adapter_stall", stall), ("adapter_total", total)):
                rows[k].append(v)
    check = await g.generate(list(range(5, 15)), {"max_tokens": 2, "temperature": 0.0})
    assert check.versions == [repeats + 1] * 2
    await g.shutdown()
    return {"adapter_bytes": size, **{k: statistics.median(v) for k, v in rows.items()}}


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="agentrl-wsync-") as tmp:
        scratch = Path(tmp)
        models = {"tiny": args.model}
        if "medium" in args.sizes:
            models["medium"] = _medium(args.model, scratch / "medium")
        results = {name: await _measure(models[name], args.repeats, scratch / name / "versions", args.dtype) for name in args.sizes}
        if args.lora_rank:
            for name in args.sizes:
                results[name].update(await _measure_adapter(models[name], args.repeats, scratch / name / "adapters", args.lora_rank))
    lines = [
        f"{run_header()}. One vLLM engine (CPU, {args.dtype}; versions written and sent in {args.dtype}); one warm-up update each way, "
        f"then {args.repeats} each way, alternating; medians, seconds. The gloo group is formed once per "
        "engine (its rendezvous is its own column, not in the totals).",
        "",
        "| model | parameters | MB per version on disk | disk: write | disk: stall | disk: total | gloo: rendezvous (once) | gloo: stall | gloo: total | total gloo/disk | stall gloo/disk |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        label = Path(args.model).name if name == "tiny" else name
        lines.append(
            f"| {label} | {r['params'] / 1e6:.1f} M | {r['bytes'] / 1e6:,.0f} | {r['disk_write']:.3f} | {r['disk_stall']:.3f} | "
            f"{r['disk_total']:.3f} | {r['rendezvous']:.2f} | {r['gloo_stall']:.3f} | {r['gloo_total']:.3f} | "
            f"{r['gloo_total'] / r['disk_total']:.2f} | {r['gloo_stall'] / r['disk_stall']:.2f} |"
        )
    if args.lora_rank:
        lines += [
            "",
            f"LoRA (rank {args.lora_rank}, every linear layer): the adapter alone is written and added to a LoRA engine as a new "
            "adapter; nothing is paused (requests in flight keep theirs). Its stall column is the time the engine spent "
            "loading the adapter.",
            "",
            "| model | MB per version | adapter: write | adapter: load (engine busy) | adapter: total | total adapter/disk | total adapter/gloo |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, r in results.items():
            label = Path(args.model).name if name == "tiny" else name
            lines.append(
                f"| {label} | {r['adapter_bytes'] / 1e6:,.1f} | {r['adapter_write']:.3f} | {r['adapter_stall']:.3f} | {r['adapter_total']:.3f} | "
                f"{r['adapter_total'] / r['disk_total']:.2f} | {r['adapter_total'] / r['gloo_total']:.2f} |"
            )
    text = "\n".join(lines)
    emit(text, dtype_key(f"weight_sync {' '.join(args.sizes)} {Path(args.model).name}", args.dtype), args.write)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder: size 'tiny' is this folder as it is (its tokenizer is reused for 'medium')")
    ap.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lora-rank", type=int, default=0, help="also measure LoRA adapter updates of this rank (0: no)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the engine's dtype and the dtype versions are written and sent in (the run's model.dtype)")
    ap.add_argument("--write", action="store_true", help="put the table and the command in benchmarks/RESULTS.md (a block of its own)")
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        raise SystemExit(f"{args.model}: not a folder")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
