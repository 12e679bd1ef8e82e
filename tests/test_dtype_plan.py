"""``model.dtype = "auto"``: bfloat16 where the hardware runs it fast, float32 elsewhere, from a
measurement or the CUDA device's own answer, never from a guess (:mod:`agentrl.dtype_plan`)."""

from __future__ import annotations

import pytest

from agentrl.dtype_plan import CPU_BF16_MIN_SPEEDUP, measure_cpu_bf16_speedup, plan_dtype


def _never() -> float:
    raise AssertionError("a probe ran for a dtype the recipe set")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_dtype_the_recipe_sets_is_kept_without_probing(dtype: str) -> None:
    for gpu in (False, True):
        plan = plan_dtype(dtype, gpu=gpu, cpu_speedup=_never, cpu_units=lambda: "none", cuda_bf16=_never)
        assert (plan.dtype, plan.requested, plan.reason) == (dtype, dtype, "set in the recipe")


@pytest.mark.parametrize(("ratio", "want"), [(4.2, "bfloat16"), (CPU_BF16_MIN_SPEEDUP, "bfloat16"), (1.1, "float32"), (0.15, "float32")])
def test_auto_on_cpus_follows_the_measured_bfloat16_speed(ratio: float, want: str) -> None:
    plan = plan_dtype("auto", gpu=False, cpu_speedup=lambda: ratio, cpu_units=lambda: "avx512_bf16")
    assert plan.dtype == want and plan.requested == "auto"
    assert f"{ratio:.1f}x" in plan.reason or f"{ratio:.2f}x" in plan.reason
    assert "torch reports avx512_bf16" in plan.reason
    assert plan.line().startswith(f"dtype: {want} (auto: ")


def test_auto_on_cpus_trusts_the_measurement_over_the_capability_flag() -> None:
    """A virtual machine may report bfloat16 units it emulates, or hide units it has."""
    assert plan_dtype("auto", gpu=False, cpu_speedup=lambda: 0.2, cpu_units=lambda: "amx").dtype == "float32"
    fast = plan_dtype("auto", gpu=False, cpu_speedup=lambda: 3.0, cpu_units=lambda: "none")
    assert fast.dtype == "bfloat16" and "torch reports no bfloat16 units" in fast.reason


@pytest.mark.parametrize(("supported", "want", "words"), [
    (True, "bfloat16", "this GPU supports bfloat16"),
    (False, "float32", "does not support bfloat16"),
    (None, "bfloat16", "not on this machine"),
])
def test_auto_on_gpus_asks_the_cuda_device(supported: bool | None, want: str, words: str) -> None:
    plan = plan_dtype("auto", gpu=True, cpu_speedup=_never, cuda_bf16=lambda: supported)
    assert plan.dtype == want and words in plan.reason


def test_the_real_measurement_decides_auto_on_this_cpu() -> None:
    """The real probe: a positive speed ratio, and ``auto`` on this machine's CPU picks what
    that ratio says (no assertion on the ratio itself: machines differ)."""
    ratio = measure_cpu_bf16_speedup(rows=64, width=256, repeats=2)
    assert ratio > 0
    plan = plan_dtype("auto", gpu=False, cpu_speedup=lambda: ratio)
    assert plan.dtype == ("bfloat16" if ratio >= CPU_BF16_MIN_SPEEDUP else "float32")


def test_the_recipe_accepts_auto_and_the_dry_run_says_what_it_resolves_to(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl import dtype_plan, dryrun
    from tests.engine.test_wiring import recipe

    monkeypatch.setattr(dtype_plan, "measure_cpu_bf16_speedup", lambda: 0.15)
    r = recipe(model={"path": "unused", "dtype": "auto"})
    assert r.model.dtype == "auto"
    status, detail = dryrun._dtype(r)
    assert status == "ok" and detail.startswith("float32 (auto: a bfloat16 matrix product ran 0.15x")
    with pytest.raises(Exception, match="dtype"):
        recipe(model={"path": "unused", "dtype": "fp8"})


def test_a_default_dtype_is_said_to_be_the_default() -> None:
    from agentrl import dryrun
    from tests.engine.test_wiring import recipe

    plan = plan_dtype("float32", gpu=False, cpu_speedup=_never, explicit=False)
    assert plan.dtype == "float32" and plan.reason.startswith("the default; model.dtype = \"auto\"")
    assert dryrun._dtype(recipe(model={"path": "unused"}))[1].startswith("float32 (the default;")
    assert dryrun._dtype(recipe(model={"path": "unused", "dtype": "float32"}))[1] == "float32 (set in the recipe)"
