"""Sandbox benchmark: latency and throughput of every backend against plain-subprocess baselines.

Measures, in one run on this machine:

* per-execution latency (median, p90, p99 over all samples of several rounds; each round's median
  too) at concurrency 1, for trivial code and for code that imports sympy and solves an equation.
  The headline is measured **back to back** (``--gap-ms 0``, the default: the next execution
  starts as soon as the previous one returned). Beside it, in the same run and on the same
  sandbox, a **spaced** figure: a pause of ``--spaced-gap-ms`` (10 ms) before every execution,
  as a model turn separates an episode's tool calls. Both spacings are measured for every
  backend *and* for the baseline, in blocks that alternate from round to round, so each ratio
  (backend median / baseline median) compares executions under the same spacing;
* throughput (executions per second) of trivial code at concurrency 1, 4, 16 and 64 (that many
  callers at once; a backend's pool holds at most ``--pool-cap`` workers or containers, the other
  callers queue), with each execution's latency under that load and the machine's CPU per
  execution;

for: ``python -I -S -c`` in a fresh subprocess (the baseline: common practice, no isolation),
bubblewrap with one container per execution, bubblewrap with warm fork-server workers, and
``docker exec`` into pooled containers; ``docker run`` per execution as a second baseline
(latency only: it takes about a second). Every latency is wall clock around one ``await
sandbox.run(...)`` as the engine sees it. Sample counts are equal: in a latency table every
backend and the baseline get ``--runs`` (trivial) or ``--sympy-runs`` (sympy) measured
executions per round and spacing; in a throughput column every backend runs ``max(--total,
4 * concurrency)`` executions. Optionally (``--leak-check N``) runs N warm executions including
timeouts and daemonizing code and counts the processes left behind.

Usage::

    .venv/bin/python benchmarks/sandbox.py --write            # the full run, ~6 min on 2 cores (est.)
    .venv/bin/python benchmarks/sandbox.py --quick            # smoke run, under a minute
    .venv/bin/python benchmarks/sandbox.py --leak-check 10000 --write
    .venv/bin/python benchmarks/sandbox.py --quick --backends bubblewrap-exec bubblewrap-warm  # no docker

``--write`` puts the command line, date, machine, rounds and sample counts and the tables in the
``<!-- sandbox:begin -->`` ... ``<!-- sandbox:end -->`` block of ``benchmarks/RESULTS.md``
(:func:`_measure.write_block`; the first time at the end of the ``## sandbox`` section); the
prose around the block is written by people and left alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _measure import busy_cpu_s, quantile, run_header, emit  # noqa: E402
from agentrl.sandbox import BubblewrapSandbox  # noqa: E402
from agentrl.sandbox._layout import base_python  # noqa: E402

SITE = sysconfig.get_paths()["purelib"]
TRIVIAL = "print(1)"
SYMPY = "import sympy\nx = sympy.Symbol('x')\nprint(sympy.solve(x**2 - 5*x + 6, x))\n"
EXPECTED = {"trivial": "1\n", "sympy": "[2, 3]\n"}
WORKLOADS = {"trivial": TRIVIAL, "sympy": SYMPY}
BACKENDS = ["subprocess", "bubblewrap-exec", "bubblewrap-warm", "docker-exec"]
"""Backends in the throughput tables; ``subprocess`` is the baseline."""
#: A/B variants of the bubblewrap modes: without the system-call filter, without cgroups, and
#: (warm) without lean workers (every execution forked from a worker that preloaded numpy and sympy).
VARIANTS = {
    "-noseccomp": ("no seccomp filter", {"seccomp": False}),
    "-nocgroups": ("no cgroups", {"cgroups": False}),
    "-nolean": ("no lean workers", {"lean_workers": False}),
}
LATENCY_BACKENDS = [
    *BACKENDS, "docker-run",
    *(f"bubblewrap-{mode}{v}" for mode in ("exec", "warm") for v in VARIANTS if not (mode == "exec" and v == "-nolean")),
]
"""Backends in the latency tables (``docker-run``, a second baseline, is too slow for throughput;
the variants (:data:`VARIANTS`) are the A/B of what the filter, the cgroups and the lean workers
cost or gain: ask for them with ``--backends``)."""
DEFAULT_BACKENDS = [*BACKENDS, "docker-run"]
"""What a run measures unless ``--backends`` says otherwise."""
THROUGHPUT_BACKENDS = [k for k in LATENCY_BACKENDS if k != "docker-run"]
"""Backends in the throughput tables."""
LABELS = {
    "subprocess": "`python -I -S -c` subprocess (baseline)",
    "bubblewrap-exec": "bubblewrap, one container per execution",
    "bubblewrap-warm": "bubblewrap, warm fork server",
    "docker-exec": "docker exec, pooled containers",
    "docker-run": "`docker run` per execution (baseline 2)",
}
for _kind in LATENCY_BACKENDS:
    for _suffix, (_what, _kw) in VARIANTS.items():
        if _kind.endswith(_suffix):
            LABELS[_kind] = f"{LABELS[_kind.removesuffix(_suffix)]}, {_what}"


# --------------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: bool
    stdout: str


class Subprocess:
    """The baseline: a fresh ``python -I -S -c`` per execution (sympy found via sys.path)."""

    def __init__(self, limit: int) -> None:
        self.python = base_python()
        self.limiter = anyio.CapacityLimiter(limit)

    async def run(self, code: str) -> Outcome:
        if "sympy" in code:
            code = f"import sys; sys.path.append({SITE!r})\n" + code
        async with self.limiter:
            proc = await anyio.run_process(
                [self.python, "-I", "-S", "-c", code], check=False, env={"PATH": "/usr/bin:/bin"}
            )
        return Outcome(proc.returncode == 0, proc.stdout.decode())

    async def aclose(self) -> None:
        pass


class DockerRun:
    """The second baseline: ``docker run --rm`` of the sandbox image per execution."""

    def __init__(self) -> None:
        from agentrl.sandbox.docker import DockerSandbox

        self.sb = DockerSandbox(max_concurrency=1)

    async def run(self, code: str) -> Outcome:
        sb = self.sb
        volumes = [f"{h}:{d['bind']}:ro" for h, d in sb._binds.items()]
        argv = ["docker", "run", "--rm", "--network", "none", "--read-only", "--user", "65534:65534",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp",
                "--memory", f"{sb.container_memory_mb}m", "--pids-limit", str(sb.max_processes + 16),
                *[a for v in volumes for a in ("-v", v)], sb.image,
                sb._python, "-I", "-S", "-c",
                f"import sys; sys.path.extend({sb._site_inside!r})\n" + code]
        proc = await anyio.run_process(argv, check=False)
        return Outcome(proc.returncode == 0, proc.stdout.decode())

    async def aclose(self) -> None:
        await self.sb.aclose()


async def make(kind: str, pool: int) -> Any:
    if kind == "subprocess":
        return Subprocess(pool)
    options: dict[str, Any] = {}
    for suffix, (_what, kw) in VARIANTS.items():
        if kind.endswith(suffix):
            options.update(kw)
            kind = kind.removesuffix(suffix)
    if kind == "bubblewrap-exec":
        return BubblewrapSandbox(warm=False, max_concurrency=pool, timeout_s=60, **options)
    sb: Any
    if kind == "bubblewrap-warm":
        sb = BubblewrapSandbox(warm=True, max_concurrency=pool, timeout_s=60, **options)
        await sb.start()  # every measured execution is served warm
        return sb
    if kind == "docker-exec":
        from agentrl.sandbox.docker import DockerSandbox

        sb = DockerSandbox(max_concurrency=pool, timeout_s=60)
        await sb.start()
        return sb
    if kind == "docker-run":
        return DockerRun()
    raise ValueError(kind)


async def run_checked(sb: Any, code: str, expected: str) -> float:
    t0 = time.perf_counter()
    r = await sb.run(code)
    elapsed = time.perf_counter() - t0
    if not r.ok or r.stdout != expected:
        raise RuntimeError(f"{type(sb).__name__}: unexpected result {r!r}")
    return elapsed


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------


@dataclass
class Latency:
    """Latency samples of one backend, workload and spacing: ``samples`` (seconds, every measured
    execution of every round) and ``round_medians`` (seconds, the median of each round)."""

    samples: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)

    def q(self, p: float) -> float:
        """The ``p`` quantile (0..1) of the samples, seconds."""
        return quantile(self.samples, p)

    @property
    def median(self) -> float:
        """Median of all samples, seconds."""
        return statistics.median(self.samples)


async def measure_latency(kind: str, workload: str, rounds: int, runs: int, gaps_ms: list[float]) -> dict[float, Latency]:
    """Latency of ``kind`` at concurrency 1 under each spacing in ``gaps_ms`` (the pause before
    every execution, ms; 0: back to back, not even an event-loop sleep), all on one sandbox.

    One unmeasured warm-up execution (page cache, first container), then ``rounds`` rounds; in
    each round one block per spacing, the order of the blocks rotating from round to round so
    that no spacing always comes first. A block is one unmeasured execution after the block's
    pause (so the first measured execution also follows one at that spacing), then ``runs``
    measured executions, each after the pause. Returns, per spacing, a :class:`Latency` of
    exactly ``rounds * runs`` samples."""
    lat = {g: Latency() for g in gaps_ms}
    code, expected = WORKLOADS[workload], EXPECTED[workload]
    sb = await make(kind, 1)
    try:
        await run_checked(sb, code, expected)  # warm-up: page cache, first container
        for r in range(rounds):
            k = r % len(gaps_ms)
            for gap in gaps_ms[k:] + gaps_ms[:k]:
                times = []
                for i in range(runs + 1):
                    if gap > 0:
                        await anyio.sleep(gap / 1000)
                    t = await run_checked(sb, code, expected)
                    if i > 0:  # the first execution of a block is its lead-in, not counted
                        times.append(t)
                lat[gap].samples += times
                lat[gap].round_medians.append(statistics.median(times))
    finally:
        await sb.aclose()
    return lat


@dataclass
class Load:
    """Executions per second with ``concurrency`` callers, each execution's latency (s), and the
    machine's busy CPU time per execution (s: every process, the benchmark's own included)."""

    rate: float
    latencies: Latency
    cpu_s: float


def throughput_runs(total: int, concurrency: int) -> int:
    """Measured executions per throughput measurement at ``concurrency``: the same for every
    backend, at least ``total`` and at least 4 per caller."""
    return max(total, 4 * concurrency)


async def measure_throughput(kind: str, concurrency: int, total: int, pool_cap: int) -> Load:
    """``total`` executions of trivial code by ``concurrency`` callers at once, after
    ``2 * concurrency`` unmeasured warm-up executions by as many callers (the steady state: a
    pool member's first use, e.g. a warm worker's cgroup and first trees, is not measured), on a
    pool of at most ``pool_cap`` workers or containers."""
    sb = await make(kind, min(concurrency, pool_cap))
    try:
        lat = Latency()

        async def caller() -> None:
            for _ in todo:
                lat.samples.append(await run_checked(sb, TRIVIAL, "1\n"))

        todo = iter(range(2 * concurrency))
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(caller)
        lat.samples.clear()
        todo = iter(range(total))
        t0, cpu0 = time.perf_counter(), busy_cpu_s()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(caller)
        return Load(total / (time.perf_counter() - t0), lat, (busy_cpu_s() - cpu0) / total)
    finally:
        await sb.aclose()


async def leak_check(n: int, concurrency: int = 4) -> dict[str, Any]:
    """``n`` warm executions (1% run past a 0.2 s deadline, 1% leave daemons, 1% fork bombs);
    then count the host processes they left (by their name) after 5 s."""
    name = "agtleak" + uuid.uuid4().hex[:8]
    tag = f"import ctypes\nctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
    codes = {
        "timeout": tag + "import time\ntime.sleep(60)\n",
        "daemon": tag + "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                        "        import time\n        time.sleep(60)\n    os._exit(0)\n",
        "bomb": tag + "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                      "        pass\n",
        "plain": tag + "print(1)\n",
    }
    counts = dict.fromkeys(codes, 0)
    timed_out = 0
    sb = BubblewrapSandbox(warm=True, max_concurrency=concurrency, timeout_s=10)
    await sb.start()
    todo = iter(range(n))
    t0 = time.perf_counter()

    async def caller() -> None:
        nonlocal timed_out
        for i in todo:
            kind = "timeout" if i % 100 == 37 else "daemon" if i % 100 == 71 else (
                "bomb" if i % 100 == 99 else "plain")
            r = await sb.run(codes[kind], timeout_s=0.2 if kind in ("timeout", "bomb") else 10)
            counts[kind] += 1
            timed_out += r.timed_out

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(caller)
    elapsed = time.perf_counter() - t0
    stats = sb.stats
    await sb.aclose()
    await anyio.sleep(5)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _comm(p) == name[:15]]
    return {"executions": n, "counts": counts, "timed_out": timed_out, "seconds": elapsed,
            "left": len(left), "stats": stats}


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def fmt_ms(s: float) -> str:
    """Seconds ``s`` as milliseconds: one decimal below 100 ms, none above."""
    ms = s * 1000
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def host() -> str:
    """Host name, kernel and Python of this machine (bubblewrap and fork costs depend on them)."""
    return f"{platform.node()}: Linux {platform.release()}, Python {platform.python_version()}"


def spacing(gap_ms: float) -> str:
    """How far apart executions were: ``back to back`` for 0, else ``N ms apart``."""
    return "back to back" if gap_ms == 0 else f"{gap_ms:g} ms apart"


def gaps(args: argparse.Namespace) -> list[float]:
    """The spacings to measure latency under, ms: the headline's ``--gap-ms`` first, then
    ``--spaced-gap-ms`` unless it is negative or the same."""
    spaced = args.spaced_gap_ms
    return [args.gap_ms] + ([spaced] if spaced >= 0 and spaced != args.gap_ms else [])


def report(args: argparse.Namespace, lat: dict[tuple[str, str, float], Latency],
           thr: dict[tuple[str, int], Load], leaks: dict[str, Any] | None,
           started: float, load_start: float) -> str:
    """The results as Markdown, for the terminal and for the ``sandbox`` block of RESULTS.md.
    ``lat`` is keyed by (backend, workload, spacing in ms), ``thr`` by (backend, concurrency)."""
    head, *rest = gaps(args)
    spaced = rest[0] if rest else None
    runs = {"trivial": args.runs, "sympy": args.sympy_runs}
    lines = [
        f"{run_header(started)}. Host {host()}; load average {load_start:.1f} at the start.",
        "",
        "Latency of one execution at concurrency 1, wall clock around `await sandbox.run(code)`, ms. "
        f"Headline columns: executions {spacing(head)}"
        + (" (the next one starts as soon as the previous one returned)" if head == 0 else "")
        + "."
        + (f" Columns *spaced*: executions {spacing(spaced)} (in an episode a model turn separates two "
           "tool calls), measured in the same run on the same sandbox, in blocks that alternate with the "
           "headline's from round to round; the baseline is measured the same way, and the spaced ratio "
           "is against the baseline's spaced median." if spaced is not None else "")
        + f" Every backend and the baseline, the same counts: rounds {args.rounds}; measured executions "
        f"per round and spacing {args.runs} (trivial code), {args.sympy_runs} (sympy); after one unmeasured "
        "warm-up execution, and each block starts with one more unmeasured execution at its spacing. "
        "Ratio: median against the `python -I -S -c` baseline (< 1 is faster).",
        "",
    ]
    for workload in WORKLOADS:
        title = "trivial code (`print(1)`)" if workload == "trivial" else (
            "sympy (`import sympy`, `solve(x**2 - 5*x + 6)`)")
        cols = ["backend", "samples", "median", "p90", "p99", "round medians", "× baseline"]
        align = ["---", "---:", "---:", "---:", "---:", "---", "---:"]
        if spaced is not None:
            cols += [f"spaced {spaced:g} ms: median", "spaced: p90", "spaced: × baseline (spaced)"]
            align += ["---:", "---:", "---:"]
        lines += [f"**{title}**, {args.rounds} × {runs[workload]} executions per backend and spacing", "",
                  "| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]
        for kind in LATENCY_BACKENDS:
            entry = lat.get((kind, workload, head))
            if entry is None:
                continue
            base = lat.get(("subprocess", workload, head))
            cells = [LABELS[kind], str(len(entry.samples)), fmt_ms(entry.median), fmt_ms(entry.q(0.9)),
                     fmt_ms(entry.q(0.99)), ", ".join(fmt_ms(m) for m in entry.round_medians),
                     f"{entry.median / base.median:.2f}" if base else "—"]
            if spaced is not None:
                sp, sp_base = lat[(kind, workload, spaced)], lat.get(("subprocess", workload, spaced))
                cells += [fmt_ms(sp.median), fmt_ms(sp.q(0.9)), f"{sp.median / sp_base.median:.2f}" if sp_base else "—"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if thr:
        concs = sorted({c for _, c in thr})
        kinds = [k for k in THROUGHPUT_BACKENDS if any((k, c) in thr for c in concs)]

        def rate(kind: str, v: Load, c: int) -> str:
            b = thr.get(("subprocess", c))
            return f"{v.rate:.0f}" + (f" ({v.rate / b.rate:.1f}×)" if b and kind != "subprocess" else "")

        def latency(kind: str, v: Load, c: int) -> str:
            return f"{fmt_ms(v.latencies.q(0.5))} / {fmt_ms(v.latencies.q(0.99))}"

        def cpu(kind: str, v: Load, c: int) -> str:
            return f"{v.cpu_s * 1000:.1f}"

        counts = ", ".join(f"c={c}: {throughput_runs(args.total, c)}" for c in concs)
        for title, cell in (
            (f"Throughput of trivial code (executions/s) with that many callers at once; pools hold "
             f"at most {args.pool_cap} workers or containers; in brackets: × baseline. Every backend "
             f"and the baseline run the same number of measured executions ({counts}), after twice "
             "as many unmeasured warm-up executions as callers, by as many callers (every pool "
             "member's first use is not measured).", rate),
            ("Latency of each of those executions (ms, p50 / p99), under that load: a caller "
             "waits for a free worker, and on 2 cores for the CPU the others use.", latency),
            ("CPU the whole machine spent per execution in those runs (ms; /proc/stat, every "
             "process: the code, the sandbox's own processes, the kernel, this benchmark). On "
             "shared cores this is what an execution takes from everything else (vLLM, the learner). "
             "Where the load keeps every core busy (here from c=4 on), busy time equals cores x wall "
             "time, so this column is then cores / throughput, derived from the table above rather "
             "than a separate measurement; only at c=1, with idle time left, does it measure cost.", cpu),
        ):
            lines += [
                title,
                "",
                "| backend | " + " | ".join(f"c={c}" for c in concs) + " |",
                "| --- | " + " | ".join("---:" for _ in concs) + " |",
            ]
            for kind in kinds:
                cells = ["—" if thr.get((kind, c)) is None else cell(kind, thr[(kind, c)], c) for c in concs]
                lines.append(f"| {LABELS[kind]} | " + " | ".join(cells) + " |")
            lines.append("")
    targets = []
    warm_trivial = lat.get(("bubblewrap-warm", "trivial", head))
    if warm_trivial:
        p50 = warm_trivial.median * 1000
        sp = lat.get(("bubblewrap-warm", "trivial", spaced)) if spaced is not None else None
        targets.append(f"trivial code p50 ≤ 5 ms on warm bubblewrap: {p50:.1f} ms {spacing(head)} "
                       f"({'met' if p50 <= 5 else 'not met'}; fastest execution "
                       f"{min(warm_trivial.samples) * 1000:.1f} ms)"
                       + (f", {sp.median * 1000:.1f} ms {spacing(spaced)}" if sp and spaced is not None else ""))
    warm_sympy, base_sympy = lat.get(("bubblewrap-warm", "sympy", head)), lat.get(("subprocess", "sympy", head))
    if warm_sympy and base_sympy:
        x = base_sympy.median / warm_sympy.median
        text = (f"sympy ≥ 20× faster than a fresh interpreter: {x:.0f}× {spacing(head)} "
                f"({'met' if x >= 20 else 'not met'})")
        if spaced is not None:
            ws, bs = lat.get(("bubblewrap-warm", "sympy", spaced)), lat.get(("subprocess", "sympy", spaced))
            if ws and bs:
                text += f", {bs.median / ws.median:.0f}× {spacing(spaced)}"
        targets.append(text)
    warm16, base16 = thr.get(("bubblewrap-warm", 16)), thr.get(("subprocess", 16))
    if warm16 is not None and base16 is not None:
        x = warm16.rate / base16.rate
        targets.append(f"(issue 18) warm bubblewrap throughput at concurrency 16 ≥ 2× the baseline: "
                       f"{x:.2f}× ({'met' if x >= 2 else 'not met'})")
    if leaks:
        targets.append(f"{leaks['executions']} executions including timeouts leave zero processes: "
                       f"{leaks['left']} left ({'met' if leaks['left'] == 0 else 'not met'})")
    if targets:
        lines += ["Targets in this run: " + "; ".join(targets) + ".", ""]
    if leaks:
        lines += [
            f"Leak check: {leaks['executions']} warm executions at concurrency 4 "
            f"({leaks['counts']}; {leaks['timed_out']} ran into their deadline) in "
            f"{leaks['seconds']:.0f} s; processes left on the host 5 s later: **{leaks['left']}**. "
            f"Pool: {leaks['stats']}.",
            "",
        ]
    lines += [
        "Notes: the machine is shared (other jobs may run at nice 15 during the measurement; see "
        "the load averages). The warm fork server's fork helper forks each execution's process "
        "ahead of the request, so its latency is the code's own run time plus a few system calls; "
        "its cost moves to the background (the fork and, mostly, its copy-on-write page faults and "
        "teardown; see the CPU table), which bounds its throughput on 2 cores. A one-shot tree's namespaces "
        "are reused by later executions once its init has reset it (everything killed, fresh "
        "/tmp, /dev/shm and IPC namespace): no namespaces or init to create and tear down per execution. "
        "`docker exec` pays runc's process start plus a fresh interpreter per execution.",
    ]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    started, load_start = time.time(), os.getloadavg()[0]
    print(f"{host()}; load average {load_start:.1f}", flush=True)
    spacings = gaps(args)
    runs = {"trivial": args.runs, "sympy": args.sympy_runs}
    lat: dict[tuple[str, str, float], Latency] = {}
    thr: dict[tuple[str, int], Load] = {}
    for workload in WORKLOADS:
        for kind in [k for k in LATENCY_BACKENDS if k in args.backends]:
            t0 = time.perf_counter()
            by_gap = await measure_latency(kind, workload, args.rounds, runs[workload], spacings)
            for gap, value in by_gap.items():
                lat[(kind, workload, gap)] = value
            print(f"latency {workload:8s} {kind}: " + "; ".join(
                f"{spacing(g)}: median {fmt_ms(v.median)} ms p90 {fmt_ms(v.q(0.9))} ms ({len(v.samples)} samples)"
                for g, v in by_gap.items()) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    for c in args.concurrency:
        for kind in [k for k in THROUGHPUT_BACKENDS if k in args.backends]:
            t0 = time.perf_counter()
            value = await measure_throughput(kind, c, throughput_runs(args.total, c), args.pool_cap)
            thr[(kind, c)] = value
            print(f"throughput c={c:<3d} {kind}: {value.rate:.1f}/s, p50 {fmt_ms(value.latencies.q(0.5))} ms, "
                  f"p99 {fmt_ms(value.latencies.q(0.99))} ms, {len(value.latencies.samples)} executions "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    leaks = await leak_check(args.leak_check) if args.leak_check else None
    if leaks:
        print(f"leak check: {leaks}", flush=True)
    text = report(args, lat, thr, leaks, started, load_start)
    key = "sandbox" if args.backends == DEFAULT_BACKENDS else "sandbox " + " ".join(args.backends)  # others: a block of their own
    emit(text, key, args.write, section="sandbox")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="latency rounds per backend and workload")
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="pause before every execution in the headline latency table, ms (default 0: back to back)")
    p.add_argument("--spaced-gap-ms", type=float, default=10.0,
                   help="pause for the spaced latency columns, measured in the same run for every backend and "
                        "the baseline, ms (negative, or equal to --gap-ms: no spaced columns)")
    p.add_argument("--runs", type=int, default=40,
                   help="measured executions of trivial code per latency round and spacing, every backend")
    p.add_argument("--sympy-runs", type=int, default=12,
                   help="measured executions of the sympy code per latency round and spacing, every backend")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--total", type=int, default=120,
                   help="executions per throughput measurement, every backend (at least 4 per caller)")
    p.add_argument("--pool-cap", type=int, default=16, help="most workers/containers per pool")
    p.add_argument("--backends", nargs="+", default=DEFAULT_BACKENDS, choices=LATENCY_BACKENDS,
                   help="backends to measure (the subprocess baseline is always measured)")
    p.add_argument("--leak-check", type=int, default=0, metavar="N",
                   help="also run N warm executions and count leftovers")
    p.add_argument("--quick", action="store_true", help="small numbers, for a smoke run")
    p.add_argument("--write", action="store_true",
                   help="put the command, machine and tables in the sandbox block of benchmarks/RESULTS.md")
    args = p.parse_args()
    args.backends = [k for k in LATENCY_BACKENDS if k in args.backends or k == "subprocess"]
    if args.quick:
        args.rounds, args.runs, args.sympy_runs, args.total, args.concurrency = 1, 6, 2, 12, [1, 4]
    return args


if __name__ == "__main__":
    anyio.run(main, parse_args())
