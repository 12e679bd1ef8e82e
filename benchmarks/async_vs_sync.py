"""Async (bounded staleness) against sync (on-policy) RL: wall-clock for the same samples.

Runs ``agentrl train`` on the same recipe (``--recipe``, default ``recipes/tiny_calc.toml``, with
``--model``, default an untrained tiny model: no SFT, no evaluation), seed and number of learner steps (hence the same number of trained
samples) in ``sync`` mode (``max_staleness = 0``: generate a batch, train, update, repeat) and in
``async`` mode with each ``--staleness`` bound (default 1, 2 and 4). Each repeat runs every mode
once, one after the other, so the modes are interleaved and drift of the machine hits them alike.

For each mode it prints min / median / max over ``--repeats`` (default 5) of the RL-loop
wall-clock (first step started to last step done, engine start-up excluded) and of samples/s;
the medians of the mean staleness and of the busy fractions of the generator (a request in
flight) and the learner (training or writing weights) from the run's ``utilisation`` record; and
the speed-up vs sync as the median (and min / max) of the per-repeat ratios
``samples/s of the mode ÷ samples/s of sync in the same repeat``: a ratio within one repeat
cancels the drift between repeats, a ratio of medians would not. The default of 5 repeats
makes each median a real middle run with two on either side (with 2 it is just their mean).

Three arms: ``sync`` and ``async`` run with ``placement.mode = "separate"`` (the learner with
the recipe's torch threads beside vLLM), ``colocated`` with ``placement.mode = "colocated"``
(on-policy; generation and training take turns, each with every core: the learner's torch threads
are the machine's cores). ``--no-colocated``
leaves that arm out.

``--split`` gives generation and training CPU cores of their own (not the colocated arm, which
takes every core by design), the same in every mode: the
generator actor and vLLM's engine processes on core 0 (``generator.cpu_affinity``, vLLM's
OpenMP threads bound there too), the learner on core 1 (``learner.cpu_affinity``, one torch
thread), the rollout worker and its sandboxes with the generator (``rollout.cpu_affinity``), and
the controller (this command's ``agentrl train``, Ray's own processes) on core 1 (``taskset``):
on a 2-core machine the nearest thing to a generation device and a training device. Each run's
processes are checked on ``/proc`` to really be on their cores.

``--sweep KEY=V1,V2,...`` repeats the comparison at each value of one recipe key that moves the
balance between generation and training (``algo.updates_per_batch``: optimizer passes over each
batch, so training cost grows while generation stays the same), and prints, beside each measured
speed-up, what the simple model predicts from the same repeat's sync run: sync ≈ gen + train,
async ≈ max(gen, train), so speed-up ≈ (g + t) / max(g, t), with g and t the generator's and the
learner's busy time in sync (each busy fraction × the sync wall-clock).

The same text is printed and, with ``--write``, put in ``benchmarks/RESULTS.md`` in a marked
block of its own (key ``async_vs_sync`` plus the ``--set`` overrides; first written at the end of
the "async vs sync" section, the prose around it is written by people): the exact command, the
date span, the machine, repeats, steps and the table.

    .venv/bin/python benchmarks/async_vs_sync.py --steps 20 --repeats 5 --write
    .venv/bin/python benchmarks/async_vs_sync.py --steps 20 --staleness 1 2 --set rollout.group_size=8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _measure import run_header, emit

from agentrl.cli import train_command

REPO = Path(__file__).resolve().parents[1]

Config = tuple[str, int]
"""A mode and its ``algo.max_staleness``: ``("sync", 0)``, ``("colocated", 0)`` or ``("async", bound)``."""

Run = dict[str, float]
"""One ``agentrl train`` run, as :func:`run_once` measures it."""


#: ``--split``: the recipe overrides that give generation core 0 and training core 1.
SPLIT = [
    "generator.cpu_affinity=[0]", 'generator.cpu_threads_bind="0"',
    "learner.cpu_affinity=[1]", "learner.torch_threads=1",
    "rollout.cpu_affinity=[0]",
]
#: ``--split``: the core of the controller (``taskset``; Ray's processes inherit it).
SPLIT_CONTROLLER = "1"


def run_once(
    mode: str, staleness: int, steps: int, model: Path, workdir: Path, extra: list[str], split: bool = False,
    recipe: Path = REPO / "recipes" / "tiny_calc.toml",
) -> Run:
    """Train ``steps`` learner steps in ``mode`` with ``algo.max_staleness = staleness`` and read
    the run's ``metrics.jsonl``. Returns ``wall_s`` (RL loop: loop start to the last step's
    record, seconds), ``samples`` (trained samples, all steps), ``samples_per_s``,
    ``mean_staleness`` (versions a trained token lagged behind the learner, sample-weighted mean),
    ``gen_busy`` and ``learner_busy`` (fractions 0..1 of the loop from the ``utilisation``
    record)."""
    run_dir = workdir / f"{mode}-{staleness}-{len(list(workdir.iterdir()))}"
    colocated = mode == "colocated"
    split = split and not colocated  # colocated gives each phase every core, by design
    cmd = train_command(
        str(recipe), str(run_dir), str(model),
        f"mode={'sync' if mode == 'sync' else 'async'}", f"placement.mode={'colocated' if colocated else 'separate'}",
        f"algo.max_staleness={staleness}", "sft.steps=0", "eval.limit=0", f"learner.max_steps={steps}",
        "learner.max_degenerate_steps=0",  # an untrained model: no reward, every step degenerate; throughput is what is measured
        *(SPLIT if split else []), *extra,
    )
    if split:
        cmd = ["taskset", "-c", SPLIT_CONTROLLER, *cmd]
    out_path, err_path = workdir / f"{run_dir.name}.out", workdir / f"{run_dir.name}.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        child = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, text=True)
        placement = _watch_placement(child) if split else {}
        child.wait(timeout=3600)
    proc = subprocess.CompletedProcess(cmd, child.returncode, out_path.read_text(), err_path.read_text())
    if proc.returncode:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = next(r["time"] for r in recs if r.get("loop_start"))
    steps_ = [r for r in recs if r["kind"] == "step"]
    samples = sum(r["samples"] for r in steps_)
    wall = steps_[-1]["time"] - start
    stale = sum(int(k) * v for r in steps_ for k, v in r["staleness_hist"].items()) / max(1, samples)
    util = next(r for r in recs if r["kind"] == "utilisation")
    if split and not placement.get("ok"):
        raise SystemExit(f"--split: the processes were not on their cores: {placement}")
    return {
        "wall_s": wall, "samples": samples, "samples_per_s": samples / wall, "mean_staleness": stale,
        "gen_busy": util["generator_busy_fraction"], "learner_busy": util["learner_busy_fraction"],
    }


def _watch_placement(proc: subprocess.Popen[str], within_s: float = 600.0) -> dict[str, object]:
    """While ``proc`` (an ``agentrl train``) runs, find its generator (vLLM engine core), learner
    and rollout processes on ``/proc`` (by their Ray actor names in the command line, or vLLM's
    process title) and read their CPU affinity every few seconds until it ends (the last reading
    counts: Ray may start a worker before it becomes an actor and is pinned). ``ok``: each found,
    each on its cores."""
    import os

    want = {"generator": {0}, "learner": {1}, "rollout": {0}}
    seen: dict[str, set[int]] = {}
    deadline = time.monotonic() + within_s
    while proc.poll() is None and time.monotonic() < deadline:  # the last look counts
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cpus = os.sched_getaffinity(int(pid))
            except OSError:
                continue
            if "EngineCor" in comm or "EngineCore" in cmdline:
                seen["generator"] = cpus
            elif "ray::Learner" in cmdline:
                seen["learner"] = cpus
            elif "ray::RolloutWorker" in cmdline:
                seen["rollout"] = cpus
        time.sleep(3.0)
    ok = len(seen) == len(want) and all(seen[k] == v for k, v in want.items())
    return {"ok": ok, **{k: sorted(v) for k, v in seen.items()}}


def speedups(results: dict[Config, list[Run]], base: Config = ("sync", 0)) -> dict[Config, list[float]]:
    """Per config, its speed-up over ``base`` in each repeat: ``samples/s ÷ base's samples/s``
    in the same repeat (> 1: faster than ``base``; the same as ``base wall ÷ wall`` when both
    trained the same samples). Repeat ``i`` of every config is paired with repeat ``i`` of
    ``base``."""
    ref = [r["samples_per_s"] for r in results[base]]
    return {c: [r["samples_per_s"] / b for r, b in zip(rs, ref, strict=True)] for c, rs in results.items()}


def _spread(values: list[float], fmt: str) -> str:
    """``min / median / max`` of ``values``, each formatted with ``fmt``."""
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def format_table(results: dict[Config, list[Run]], steps: int) -> str:
    """The Markdown table of ``results`` (config -> one :data:`Run` per repeat, repeats in order,
    ``("sync", 0)`` among them): one row per config in the order given, with min / median / max
    of wall-clock and samples/s, medians of mean staleness and busy fractions, and the speed-up
    vs sync as median (min–max) of the per-repeat ratios (:func:`speedups`)."""
    ups = speedups(results)
    samples = sorted({int(r["samples"]) for rs in results.values() for r in rs})
    same = f"{samples[0]} samples per run" if len(samples) == 1 else f"{samples[0]}–{samples[-1]} samples per run (not all equal)"
    lines = [
        (
            f"{steps} learner steps, {same}; min / median / max over the repeats; busy fractions and staleness are "
            "medians; speed-up vs sync is the median (min–max) of the per-repeat ratios of samples/s."
        ),
        "",
        (
            "| mode | max_staleness | RL wall-clock s (min / med / max) | samples/s (min / med / max) | mean staleness | "
            "generator busy | learner busy | speed-up vs sync (median, min–max) |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (mode, s), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("mean_staleness", "gen_busy", "learner_busy")}
        up = ups[(mode, s)]
        lines.append(
            f"| {mode} | {s} | {_spread([r['wall_s'] for r in rs], '.1f')} | {_spread([r['samples_per_s'] for r in rs], '.1f')} | "
            f"{med['mean_staleness']:.2f} | {med['gen_busy']:.0%} | {med['learner_busy']:.0%} | "
            f"{statistics.median(up):.2f}x ({min(up):.2f}–{max(up):.2f}) |"
        )
    return "\n".join(lines)


def format_block(results: dict[Config, list[Run]], args: argparse.Namespace, started: float) -> str:
    """What is printed and what ``--write`` puts in RESULTS.md: :func:`run_header` (the exact
    command, the span from ``started``, a ``time.time()`` value, to now, and the machine), the
    setup and repeats, then :func:`format_table`."""
    head = (
        f"{run_header(started)}. `{Path(args.recipe).resolve().relative_to(REPO)}` with "
        f"{'`' + str(args.model) + '`' if args.model else 'an untrained tiny model'} (no SFT, no evaluation), same "
        f"seed in every run; {args.repeats} repeats, each running every mode once, interleaved. RL wall-clock runs from "
        "the first step's start to the last step's end (engine start-up excluded); the busy fractions come from the "
        "run's `utilisation` record (generator: at least one request in flight; learner: training or writing the new "
        "version)."
    )
    if args.split:
        head += (
            " **Split CPU sets** (`--split`): generator and vLLM's engine processes on core 0 (its OpenMP threads "
            "bound there), rollout worker and sandboxes on core 0, learner on core 1 (one torch thread), controller and "
            "Ray's processes on core 1 (`taskset`), the same in every mode; each run's placement checked on /proc."
        )
    return head + "\n\n" + format_table(results, args.steps)


def model_speedup(sync: Run) -> float:
    """The simple model's speed-up of async over this sync run: (g + t) / max(g, t), where g and t
    are the busy fractions of the generator and the learner (the wall-clock cancels)."""
    g, t = sync["gen_busy"], sync["learner_busy"]
    return (g + t) / max(g, t, 1e-9)


def format_sweep(key: str, points: dict[str, dict[Config, list[Run]]], staleness: int) -> str:
    """One row per value of ``key``: sync's and async's median samples/s, the busy fractions in
    sync, the measured speed-up (median and range of per-repeat ratios) and the simple model's
    (median of the per-repeat predictions)."""
    lines = [
        f"Sweep of `{key}` (async at max_staleness {staleness}); busy fractions are sync's medians; model: "
        "(g + t) / max(g, t) from each repeat's sync run.",
        "",
        f"| {key} | sync samples/s | async samples/s | sync: generator busy | sync: learner busy | "
        "speed-up measured (median, min–max) | speed-up model (median) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for value, results in points.items():
        sync, asy = results[("sync", 0)], results[("async", staleness)]
        ups = speedups(results)[("async", staleness)]
        lines.append(
            f"| {value} | {statistics.median(r['samples_per_s'] for r in sync):.1f} | "
            f"{statistics.median(r['samples_per_s'] for r in asy):.1f} | "
            f"{statistics.median(r['gen_busy'] for r in sync):.0%} | {statistics.median(r['learner_busy'] for r in sync):.0%} | "
            f"{statistics.median(ups):.2f}x ({min(ups):.2f}–{max(ups):.2f}) | "
            f"{statistics.median(model_speedup(r) for r in sync):.2f}x |"
        )
    return "\n".join(lines)


def build_tiny(out: Path, shape: str) -> Path:
    """An untrained tiny model of the given shape (``KEY=V,...`` of ``TinyModelSpec``), its
    tokenizer trained on 500 Calc rows (as the tests' tiny model)."""
    from agentrl.envs.corpus import tokenizer_corpus
    from agentrl.envs.data import load_rows
    from agentrl.models.tiny import TinyModelSpec, build_tiny_model

    fields = dict(item.split("=", 1) for item in shape.split(","))
    spec = TinyModelSpec(**{k.strip(): int(v) for k, v in fields.items()})
    return Path(build_tiny_model(out, tokenizer_corpus("agentrl/Calc-v0", load_rows("synthetic:calc", limit=500)), spec))


def block_key(extra: list[str], args: argparse.Namespace | None = None) -> str:
    """The RESULTS.md block this run's ``--write`` replaces: ``async_vs_sync`` plus the
    ``--set`` overrides and, when given, the recipe's and the model's folder names (runs with
    other overrides, recipes or models get blocks of their own)."""
    named = []
    if args is not None and args.recipe.name != "tiny_calc.toml":
        named.append(f"--recipe {args.recipe.name}")
    if args is not None and args.model:
        named.append(f"--model {Path(args.model).name}")
    if args is not None and getattr(args, "tiny", None):
        named.append(f"--tiny {args.tiny}")
    return " ".join(["async_vs_sync", *named, *extra])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="learner steps per run (same in every mode)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of every mode, interleaved (min / median / max over them)")
    ap.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4], help="max_staleness bounds of the async runs (each >= 1)")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra recipe override (section.key=value), every run")
    ap.add_argument("--sweep", metavar="KEY=V1,V2,...", help="compare sync and async (the first --staleness) at each value of one recipe key")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "tiny_calc.toml", help="the recipe every run trains (default: tiny_calc)")
    ap.add_argument("--model", help="model folder (default: a fresh untrained tiny model)")
    ap.add_argument("--tiny", metavar="KEY=V,...", help="build the untrained tiny model with this shape, e.g. "
                    "hidden_size=256,num_layers=4,num_heads=4,num_kv_heads=2,intermediate_size=1024 (a heavier learner step: balance)")
    ap.add_argument("--no-colocated", dest="colocated", action="store_false",
                    help="leave out the colocated arm (generation and training take turns, each with every core)")
    ap.add_argument("--split", action="store_true", help="generation on core 0, training on core 1 (see the module docstring)")
    ap.add_argument("--write", action="store_true", help="put the command, date, machine and table in benchmarks/RESULTS.md (a block of its own)")
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 1:
        raise SystemExit("--repeats and --steps must be at least 1")
    if any(s < 1 for s in args.staleness):
        raise SystemExit("--staleness bounds must be >= 1 (0 is sync, which always runs)")
    extra = list(args.extra)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model:
            model = Path(args.model).resolve()
        elif args.tiny:
            model = build_tiny(work / "model", args.tiny)
        else:
            model = work / "model"
            subprocess.run([sys.executable, "-m", "agentrl.cli", "model", "init", "tiny", str(model)], check=True, cwd=REPO, capture_output=True)
        (work / "runs").mkdir()
        configs: list[Config] = [("sync", 0), *([("colocated", 0)] if args.colocated else []), *(("async", s) for s in dict.fromkeys(args.staleness))]
        if args.sweep:
            key, _, values = args.sweep.partition("=")
            if not key or not values:
                raise SystemExit("--sweep takes KEY=V1,V2,...")
            configs = [configs[0], configs[-len(dict.fromkeys(args.staleness))]]
            points: dict[str, dict[Config, list[Run]]] = {v: {c: [] for c in configs} for v in values.split(",")}
            for _ in range(args.repeats):  # every value and mode once per repeat, interleaved
                for value, results in points.items():
                    for mode, s in configs:
                        results[(mode, s)].append(run_once(mode, s, args.steps, model, work / "runs", [*extra, f"{key}={value}"], args.split, args.recipe))
            text = format_block(next(iter(points.values())), args, started).split("\n\n")[0]
            text += "\n\n" + format_sweep(key, points, configs[1][1])
            for value, results in points.items():
                text += f"\n\n`{key}={value}`: " + format_table(results, args.steps)
            emit(text, block_key([*(["--split"] if args.split else []), f"--sweep {key}", *extra], args), args.write, section="async vs sync")
            return
        results: dict[Config, list[Run]] = {c: [] for c in configs}
        for _ in range(args.repeats):
            for mode, s in configs:
                results[(mode, s)].append(run_once(mode, s, args.steps, model, work / "runs", extra, args.split, args.recipe))
    text = format_block(results, args, started)
    emit(text, block_key([*(["--split"] if args.split else []), *extra], args), args.write, section="async vs sync")


if __name__ == "__main__":
    main()
