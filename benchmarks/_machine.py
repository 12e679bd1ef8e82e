"""What the benchmarks read about the machine while they run."""

from __future__ import annotations

import os


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: user, nice,
    system, irq, softirq, steal). The difference over a pass is what the pass cost every process
    together (the benchmark, vLLM's engine processes, sandbox processes, the kernel)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")
