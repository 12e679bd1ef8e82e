"""Measurements the benchmarks share: the machine's busy CPU time, quantiles of samples."""

from __future__ import annotations

import os


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


def write_block(key: str, text: str, path: str = RESULTS) -> None:
    """Put ``text`` between ``<!-- key:begin -->`` and ``<!-- key:end -->`` in ``path``,
    replacing what a previous run wrote there (the prose around it is left alone); the markers
    are appended at the end of the file the first time."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    with open(path) as f:
        doc = f.read()
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + block + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)
