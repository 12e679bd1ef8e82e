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
