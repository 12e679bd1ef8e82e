"""The dtype a run computes in: ``model.dtype`` as the recipe sets it, or, for ``"auto"``,
bfloat16 where this hardware runs it fast and float32 otherwise.

One decision for the run (:class:`agentrl.engine.controller.Controller`, before the model is
imported or loaded: its line is among the run's first) and for its dry run
(``agentrl check --dry-run``), so that the two never disagree.

What ``auto`` picks:

* **GPUs** (``generator.num_gpus`` or ``learner.num_gpus`` above 0): bfloat16 when the CUDA
  device this process sees supports it (``torch.cuda.is_bf16_supported()``: Ampere and newer),
  float32 on older ones; bfloat16 when this process sees no GPU at all (the recipe's GPUs are on
  the cluster's other nodes, which vLLM and FSDP2 serve in bfloat16 since Ampere).
* **CPUs**: bfloat16 when a bfloat16 matrix product measured here runs at least
  :data:`CPU_BF16_MIN_SPEEDUP` times as fast as the same product in float32
  (:func:`measure_cpu_bf16_speedup`). CPUs with bfloat16 dot-product units (AVX512-BF16, AMX)
  run it several times faster; CPUs without them emulate it several times slower. The
  measurement decides, not a flag: a virtual machine may hide or emulate the units. The line
  also names what torch's own capability query says (``avx512_bf16``, ``amx``).

Under bfloat16 the learner trains with FSDP2 mixed precision (float32 master weights and
reductions, bfloat16 compute; :func:`agentrl.engine.training.model_setup.mixed_precision`) and
vLLM serves in bfloat16; versions are published in bfloat16.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CPU_BF16_MIN_SPEEDUP", "DtypePlan", "cpu_bf16_units", "measure_cpu_bf16_speedup", "plan_dtype"]

Dtype = Literal["float32", "bfloat16", "float16"]

CPU_BF16_MIN_SPEEDUP = 1.3
"""The least measured bfloat16/float32 speed ratio of a CPU matrix product for which ``auto``
picks bfloat16: below it the precision lost is not paid for by speed."""


@dataclass(frozen=True)
class DtypePlan:
    """``dtype``: the dtype the run uses; ``requested``: the recipe's ``model.dtype``;
    ``reason``: why, in words (for the run's first lines and the dry run)."""

    dtype: Dtype
    requested: str
    reason: str

    def line(self) -> str:
        """The run's line: ``dtype: bfloat16 (auto: ...)``."""
        return f"dtype: {self.dtype} ({self.reason})"


def cpu_bf16_units() -> str:
    """What torch's capability query says of this CPU's bfloat16 units: ``"amx"``,
    ``"avx512_bf16"`` or ``"none"``."""
    import torch

    cpu = getattr(torch, "cpu", None)
    if cpu is not None and getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "amx"
    if cpu is not None and getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "avx512_bf16"
    return "none"


def measure_cpu_bf16_speedup(rows: int = 256, width: int = 1024, repeats: int = 3) -> float:
    """How many times faster a ``rows × width`` by ``width × width`` matrix product runs in
    bfloat16 than in float32 on this CPU, with torch's current thread count (best of
    ``repeats`` timings each, after one warm-up). Above 1: bfloat16 is faster. About 0.2 s on a
    CPU without bfloat16 units, less on one with them."""
    import torch

    def best(dtype: torch.dtype) -> float:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, width, generator=g).to(dtype)
        w = torch.randn(width, width, generator=g).to(dtype)
        torch.nn.functional.linear(x, w)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - t)
        return max(min(times), 1e-9)

    with torch.no_grad():
        return best(torch.float32) / best(torch.bfloat16)


def plan_dtype(
    requested: str,
    *,
    gpu: bool,
    cpu_speedup: Callable[[], float] | None = None,
    cpu_units: Callable[[], str] | None = None,
    cuda_bf16: Callable[[], bool | None] | None = None,
    explicit: bool = True,
) -> DtypePlan:
    """The dtype of a run whose recipe asks for ``requested`` (``model.dtype``), its devices
    GPUs (``gpu``) or CPUs. The probes are injectable: ``cpu_speedup`` (bfloat16's measured
    speed ratio over float32 here), ``cpu_units`` (torch's capability query, named in the
    reason); None: the real ones; ``cuda_bf16`` (whether the CUDA device this process sees supports bfloat16; None:
    this process sees none). Only ``"auto"`` runs a probe. ``explicit``: whether the recipe
    sets ``model.dtype`` (False: it is the default, and the reason says so)."""
    if requested != "auto":
        why = "set in the recipe" if explicit else 'the default; model.dtype = "auto" picks bfloat16 where it is fast'
        return DtypePlan(requested, requested, why)  # type: ignore[arg-type]
    if gpu:
        supported = (cuda_bf16 or _cuda_bf16)()
        if supported is None:
            return DtypePlan("bfloat16", requested, "auto: the recipe's GPUs are not on this machine; bfloat16, "
                                                    "as on every GPU since Ampere (set model.dtype to choose)")
        if supported:
            return DtypePlan("bfloat16", requested, "auto: this GPU supports bfloat16; mixed precision")
        return DtypePlan("float32", requested, "auto: this GPU does not support bfloat16")
    ratio = (cpu_speedup or measure_cpu_bf16_speedup)()
    units = (cpu_units or cpu_bf16_units)()
    units_text = "torch reports no bfloat16 units" if units == "none" else f"torch reports {units}"
    if ratio >= CPU_BF16_MIN_SPEEDUP:
        return DtypePlan("bfloat16", requested, f"auto: a bfloat16 matrix product ran {ratio:.1f}x as fast as float32 "
                                                f"on this CPU ({units_text}); mixed precision")
    return DtypePlan("float32", requested, f"auto: a bfloat16 matrix product ran {ratio:.2f}x as fast as float32 on "
                                           f"this CPU ({units_text}); bfloat16 is picked from {CPU_BF16_MIN_SPEEDUP}x")


def _cuda_bf16() -> bool | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return bool(torch.cuda.is_bf16_supported())
