"""What a checkpoint costs the training loop: written while the learner waits (``checkpoint.background
= false``) against written in the background while the next step trains (the default).

One learner rank (FSDP2 over gloo, as a run's), in this process, on a model (the tiny one by
default, ``--model`` for a Hugging Face folder such as SmolLM2) in ``--dtype``. A *round* is what
the loop does around a checkpoint: save it, then train the next step (and, in the background
arm, put the checkpoint in place after that step, as the loop does). Each arm's round is timed
as a whole, so that the background write's competition with the step for the CPU and the disk
is in the figure, not only the seconds the save call held the loop:

- ``wait``: ``save_checkpoint(dir)`` then ``train_step``;
- ``background``: ``save_checkpoint(dir, background=True)``, ``train_step``, ``finish_checkpoint()``;
- ``none``: ``train_step`` alone, the baseline: a round's cost of the checkpoint is its time less
  this one's.

Arms are interleaved in every repeat (the order rotating), ``--repeats`` times after one warm-up
round each; the table gives medians and the ratio of the checkpoint's cost (background / wait)
as the median of each repeat's own ratio. Every checkpoint goes to a fresh folder on the same
disk as the run's would (``--dir``, default a temporary folder under ``runs/``).

``--write`` puts the command, date, machine and table in ``benchmarks/RESULTS.md`` (key
``checkpoint <model> <dtype>``).

    .venv/bin/python benchmarks/checkpoint.py --repeats 5 --write
    .venv/bin/python benchmarks/checkpoint.py --model runs/models/smollm2-135m-instruct --dtype bfloat16 \
        --samples 16 --repeats 5 --write
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._measure import emit, run_header  # noqa: E402
from benchmarks.learner import free_port, make_batch  # noqa: E402

from agentrl.engine.training.learner import Learner  # noqa: E402

ARMS = ("none", "wait", "background")
"""The arms, in the order of the first repeat (later repeats rotate it)."""


def one_round(learner: Learner, arm: str, folder: Path, batch: list[dict]) -> dict[str, float]:
    """One round of ``arm`` (see the module docstring): its seconds as a whole (``round_s``), the
    seconds the save call held the loop (``save_s``), the step's (``step_s``) and the final
    wait for the background write (``finish_s``)."""
    t0 = time.perf_counter()
    if arm != "none":
        learner.save_checkpoint(str(folder), background=arm == "background")
    t1 = time.perf_counter()
    learner.train_step(batch)
    t2 = time.perf_counter()
    if arm == "background":
        learner.finish_checkpoint()
    t3 = time.perf_counter()
    if arm != "none":
        assert (folder / "trainer_state.json").is_file(), f"{arm}: no checkpoint at {folder}"
    return {"round_s": t3 - t0, "save_s": t1 - t0, "step_s": t2 - t1, "finish_s": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a Hugging Face folder instead of the tiny model")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the run's model.dtype")
    ap.add_argument("--samples", type=int, default=32, help="samples per step's batch")
    ap.add_argument("--max-len", type=int, default=256, help="longest sample, tokens")
    ap.add_argument("--budget", type=int, default=4096, help="micro-batch token budget")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary folder under runs/)")
    ap.add_argument("--write", action="store_true", help="put the command and table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.time()
    (REPO / "runs").mkdir(exist_ok=True)
    where = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir=REPO / "runs"))
    where.mkdir(parents=True, exist_ok=True)
    try:
        model = args.model
        if model is None:
            from agentrl.envs.corpus import tokenizer_corpus
            from agentrl.envs.data import load_rows
            from agentrl.models.tiny import build_tiny_model

            rows = load_rows("synthetic:calc", limit=500)
            model = str(build_tiny_model(where / "tiny", tokenizer_corpus("agentrl/Calc-v0", rows)))
        from transformers import AutoConfig

        vocab = int(AutoConfig.from_pretrained(model).vocab_size)
        batch = make_batch(args.samples, args.max_len, vocab, seed=0)
        learner = Learner(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), model=model, lr=1e-5,
                          micro_batch_tokens=args.budget, torch_threads=args.threads, dtype=args.dtype)
        learner.setup()
        results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
        n = 0
        try:
            for rep in range(args.repeats + 1):  # the first repeat warms up (AdamW's state, page cache)
                order = ARMS[rep % len(ARMS):] + ARMS[: rep % len(ARMS)]
                for arm in order:
                    n += 1
                    folder = where / f"ckpt_{n:03d}"
                    r = one_round(learner, arm, folder, batch)
                    shutil.rmtree(folder, ignore_errors=True)
                    if rep:
                        results[arm].append(r)
                    print(f"repeat {rep}{' (warm-up)' if not rep else ''} {arm}: round {r['round_s']:.2f} s (save {r['save_s']:.2f}, "
                          f"step {r['step_s']:.2f}, finish {r['finish_s']:.2f})", flush=True)
        finally:
            learner.shutdown()
        size = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
    finally:
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in results[arm])

    cost = {arm: [r["round_s"] - b["round_s"] for r, b in zip(results[arm], results["none"])] for arm in ("wait", "background")}
    ratios = [bg / w for bg, w in zip(cost["background"], cost["wait"]) if w > 0]
    name = Path(model).name if args.model else "tiny_calc"
    lines = [
        run_header(started), "",
        f"One learner rank (FSDP2, gloo) in the benchmark's process on `{name}` ({size / 2**20:.0f} MiB of weights on disk) in "
        f"{args.dtype}, {args.threads} torch threads; a step trains {args.samples} samples of up to {args.max_len} tokens. "
        f"{args.repeats} repeats after a warm-up, arms interleaved (order rotating); medians. A round: the save, the next "
        "step, and (background) putting the checkpoint in place after it. The checkpoint's cost is a round's time less the "
        "same repeat's round without a checkpoint.", "",
        "| arm | round s | save call s | next step s | wait at the end s | the checkpoint's cost s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for arm in ARMS:
        c = statistics.median(cost[arm]) if arm in cost else 0.0
        lines.append(f"| {arm} | {med(arm, 'round_s'):.2f} | {med(arm, 'save_s'):.2f} | {med(arm, 'step_s'):.2f} | "
                     f"{med(arm, 'finish_s'):.2f} | {c:.2f} |" if arm != "none" else
                     f"| {arm} (baseline) | {med(arm, 'round_s'):.2f} | – | {med(arm, 'step_s'):.2f} | – | – |")
    summary = "The checkpoint's cost in the background / waited for: " + (
        f"median of the repeats' ratios **{statistics.median(ratios):.2f}×** (range {min(ratios):.2f}–{max(ratios):.2f}, "
        f"{len(ratios)} of {len(cost['wait'])} repeats)" if ratios else
        "no ratio: the waited-for checkpoint cost nothing measurable (<= 0 s beside the noise) in every repeat")
    lines += ["", summary + "."]
    emit("\n".join(lines), f"checkpoint {name} {args.dtype}", args.write, section="Checkpoints in the background")


if __name__ == "__main__":
    main()
