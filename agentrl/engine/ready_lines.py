"""The console's one line per component when it is ready: what started, on which device, how big,
in which mode and how long it took, in words (the raw start-up dicts stay in ``metrics.jsonl``).

    generators ready: 1 vLLM engine on cpu, started in 22.4 s
    learner ready: 1 rank on cpu (gloo), 1.09 M parameters, full fine-tuning, started in 6.1 s
    critic ready: 1 rank on cpu (gloo), value model of 1.05 M parameters, started in 5.0 s
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

__all__ = ["clocked", "critic_line", "generators_line", "learner_line"]

T = TypeVar("T")


async def clocked(aw: Awaitable[T]) -> tuple[T, float]:
    """``await aw``; its result and the seconds it took."""
    t0 = time.monotonic()
    result = await aw
    return result, time.monotonic() - t0


def _count(n: float) -> str:
    """A parameter count in words: ``1.09 M``, ``7.62 B``, ``512``."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(int(n))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _seconds(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f} s" if hi - lo < 0.05 else f"{lo:.1f}–{hi:.1f} s"


def _nodes(infos: Sequence[dict[str, Any]]) -> str:
    nodes = {i["node_id"] for i in infos if i.get("node_id")}
    return f", on {len(nodes)} nodes" if len(nodes) > 1 else ""


def generators_line(infos: Sequence[dict[str, Any]]) -> str:
    """``generators ready: ...`` from the generators' start-up infos (``startup_s``, ``device``,
    ``node_id``; ``url`` for remote servers)."""
    infos = list(infos)
    if not infos:
        return "generators ready: none"
    remote = [i for i in infos if i.get("device") == "remote"]
    if remote:
        urls = ", ".join(str(i.get("url", "?")) for i in remote)
        return f"generators ready: {_plural(len(remote), 'vLLM server')} over HTTP ({urls})"
    devices = sorted({str(i.get("device", "?")) for i in infos})
    times = [float(i["startup_s"]) for i in infos if "startup_s" in i]
    took = f", started in {_seconds(times)}" if times else ""
    return f"generators ready: {_plural(len(infos), 'vLLM engine')} on {'/'.join(devices)}{took}{_nodes(infos)}"


def _ranks(infos: Sequence[dict[str, Any]]) -> str:
    backend = str(infos[0].get("backend", "?")) if infos else "?"
    device = {"nccl": "cuda", "gloo": "cpu"}.get(backend, backend)
    return f"{_plural(len(infos), 'rank')} on {device} ({backend})"


def learner_line(infos: Sequence[dict[str, Any]], seconds: float) -> str:
    """``learner ready: ...`` from the ranks' ``setup()`` infos (rank 0's model figures) and the
    seconds the start took."""
    infos = list(infos)
    if not infos:
        return "learner ready: no ranks"
    first = infos[0]
    total = float(first.get("parameters", 0))
    trainable = float(first.get("trainable_parameters", total))
    lora = first.get("lora")
    if lora:
        mode = f"LoRA rank {lora.get('rank', '?')}: {_count(trainable)} of them trained"
    else:
        mode = "full fine-tuning"
    extras = []
    if first.get("mixed_precision") not in (None, "off"):
        extras.append(f"mixed precision {first['mixed_precision']}")
    if first.get("reference_model"):
        extras.append("KL reference model")
    more = "".join(f", {e}" for e in extras)
    return f"learner ready: {_ranks(infos)}, {_count(total)} parameters, {mode}{more}, started in {seconds:.1f} s{_nodes(infos)}"


def critic_line(infos: Sequence[dict[str, Any]], seconds: float) -> str:
    """``critic ready: ...`` from the critic ranks' ``setup()`` infos."""
    infos = list(infos)
    if not infos:
        return "critic ready: no ranks"
    return (f"critic ready: {_ranks(infos)}, value model of {_count(float(infos[0].get('parameters', 0)))} parameters, "
            f"started in {seconds:.1f} s{_nodes(infos)}")
