"""Measurements the benchmarks share: the machine's busy CPU time, quantiles of samples, peak
memory; and how they write results: the command-and-machine header line of a run
(:func:`run_header`) and a marked block of ``benchmarks/RESULTS.md`` (:func:`write_block`)."""

from __future__ import annotations

import os
import shlex
import sys
import time


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: user, nice,
    system, irq, softirq, steal). The difference over a pass is what the pass cost every process
    together (the benchmark, vLLM's engine processes, sandbox processes, the kernel)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``: the sample at rank ``round(q * (n - 1))`` of the
    sorted values; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of process ``pid`` now, bytes (``/proc/<pid>/status``, VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Highest resident memory of this process while the ``with`` block runs, sampled by a thread
    every ``interval_s``: ``peak`` (bytes) and ``rise`` (peak minus the resident memory at entry:
    what the block itself needed at its worst moment)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        import threading

        self.interval_s = interval_s
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> "PeakRSS":
        self.start = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def rise(self) -> int:
        return self.peak - self.start


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
"""The results file every benchmark's ``--write`` updates."""


def machine() -> str:
    """One line about this machine: CPUs, memory, load average when the line is made."""
    with open("/proc/meminfo") as f:
        mem_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, {mem_kb / 2**20:.0f} GiB; load average {load} at the end"


def command_line() -> str:
    """The command this process was started with, as typed in the repository root: the
    interpreter (relative to the repository when it lies inside it, e.g. ``.venv/bin/python``),
    the script (``benchmarks/<name>.py``) and every argument of ``sys.argv``, shell-quoted."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def rel(path: str) -> str:
        absolute = os.path.abspath(path)
        return os.path.relpath(absolute, root) if absolute.startswith(root + os.sep) else path

    return " ".join(shlex.quote(a) for a in [rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


def run_header(started: float | None = None) -> str:
    """``Command: `<command_line()>` (<date>; <machine()>)``, no final full stop: the first line
    of a block that ``--write`` puts in RESULTS.md. The date is local time now (when the results
    are written); with ``started`` (a ``time.time()`` value) it is the span ``start–end`` when
    that is a minute or more."""
    end = time.time()
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(end))
    if started is not None:
        first = time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
        if first != when:
            when = f"{first}–{time.strftime('%H:%M', time.localtime(end))}"
    return f"Command: `{command_line()}` ({when}; {machine()})"


def write_block(key: str, text: str, path: str = RESULTS, section: str | None = None) -> None:
    """Put ``text`` between ``<!-- key:begin -->`` and ``<!-- key:end -->`` in ``path``,
    replacing what a previous run wrote there (the prose around it is left alone). The first
    time (no markers yet) the block goes at the end of the ``## <section>`` section, before the
    next ``## `` heading, when ``section`` is given and the file has that heading; otherwise at
    the end of the file."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    with open(path) as f:
        doc = f.read()
    block = f"{begin}\n{text.strip()}\n{end}"
    heading = f"## {section}\n"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + block + rest.split(end, 1)[1]
    elif section is not None and (doc.startswith(heading) or f"\n{heading}" in doc):
        at = 0 if doc.startswith(heading) else doc.index(f"\n{heading}") + 1
        nxt = doc.find("\n## ", at + len(heading) - 1)
        if nxt < 0:
            doc = doc.rstrip("\n") + "\n\n" + block + "\n"
        else:
            doc = doc[:nxt].rstrip("\n") + "\n\n" + block + "\n" + doc[nxt:]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


def dtype_key(key: str, dtype: str) -> str:
    """The RESULTS.md block key of a measurement in ``dtype``: ``key`` itself for float32 (the
    blocks written before bfloat16 runs existed), ``key`` and the dtype otherwise, so that a
    bfloat16 block stands beside its float32 one."""
    return key if dtype == "float32" else f"{key} {dtype}"


def emit(text: str, key: str, write: bool, section: str | None = None) -> None:
    """Print a benchmark's results ``text``; with ``write`` (the ``--write`` flag) also put it in
    the ``key`` block of RESULTS.md (:func:`write_block`, first placed in ``section``)."""
    print("\n" + text)
    if write:
        write_block(key, text, section=section)
        print(f"\nwritten to the {key!r} block of {RESULTS}")


def eval_curve(run_dir: str) -> list[dict]:
    """``[{version, rl_s, accuracy, tool_call_rate, ...}]`` of an agentrl run's evaluations, read
    from its ``metrics.jsonl``: ``rl_s`` is the RL loop's wall-clock at the evaluation without the
    time spent in evaluations before it (version 0, before RL, is at 0); every other number of the
    evaluation record comes along under its own key (``ood/accuracy``, ``recovery_rate``...)."""
    import json
    from pathlib import Path

    recs = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    start = next(r["time"] for r in recs if r.get("loop_start"))
    out, eval_s = [], 0.0
    for r in recs:
        if r.get("kind") != "eval":
            continue
        at = max(0.0, r["time"] - r.get("eval_s", 0.0) - start - eval_s) if r["version"] else 0.0
        if r["version"]:
            eval_s += r.get("eval_s", 0.0)
        numbers = {k: v for k, v in r.items() if isinstance(v, (int, float)) and k != "time"}
        out.append({**numbers, "version": r["version"], "rl_s": at, "accuracy": r["accuracy"], "tool_call_rate": r.get("tool_call_rate", 0.0)})
    return out


def agentrl_train(recipe: str, run_dir: "os.PathLike[str] | str", overrides: list[str], timeout_s: float = 3600,
                  fresh: bool = True) -> float:
    """Run ``agentrl train RECIPE`` (``run_dir`` and each ``overrides`` item as a ``--set``) from
    the repository root, its console into ``RUN_DIR.log``; return its wall-clock seconds. Raises
    ``SystemExit`` naming the log when it fails. ``fresh`` (RL runs): with ``--fresh``, so an
    earlier run in ``run_dir`` is set aside, never resumed (an SFT-only run takes no ``--fresh``)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(root / ".venv/bin/agentrl"), "train", recipe, *(["--fresh"] if fresh else []), "--set", f'run_dir="{run_dir}"']
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.monotonic()
    with open(f"{run_dir}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}); see {run_dir}.log")
    return time.monotonic() - t0

