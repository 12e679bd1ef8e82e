"""Rewards: math-verify through the process pool, its deadlines, crashes, and what envs make of them.

One pool (the process-wide shared one) serves most tests; tests that kill workers use pools of
their own so that the shared one stays warm.
"""

import time

import anyio
import pytest
from tests.envs import envfakes

from agentrl.envs.rewards import MathReward, MathVerifier, VerifierPool, reference_latex, shared_verifier_pool
from agentrl.errors import ConfigError, InfraError, VerifierError

BACKENDS = ["asyncio", "trio"]


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        # fractions
        ("\\boxed{\\frac{1}{2}}", "1/2", True),
        ("\\boxed{0.5}", "1/2", True),
        ("\\boxed{\\dfrac{3}{4}}", "3/4", True),
        ("\\boxed{-\\frac{3}{7}}", "-3/7", True),
        ("\\boxed{17/4}", "\\frac{17}{4}", True),
        ("\\boxed{4.25}", "17/4", True),
        ("\\boxed{\\frac{2}{4}}", "1/2", True),
        ("\\boxed{\\frac{1}{3}}", "1/2", False),
        # LaTeX expressions
        ("\\boxed{\\sqrt{2}}", "2^{1/2}", True),
        ("\\boxed{2\\pi}", "2\\pi", True),
        ("\\boxed{x = 5}", "5", True),
        ("\\boxed{20,217}", "20217", True),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", True),
        ("$\\frac{1}{2}$", "0.5", True),
        # intervals and sets
        ("\\boxed{(1, 2]}", "(1,2]", True),
        ("\\boxed{[1, 2]}", "(1,2]", False),
        ("\\boxed{[0, \\infty)}", "[0, \\infty)", True),
        ("\\boxed{(-\\infty, 3) \\cup (5, \\infty)}", "(-\\infty,3)\\cup(5,\\infty)", True),
        ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", True),
        # wrong answers
        ("\\boxed{3}", "2", False),
        ("\\boxed{20218}", "20217", False),
        ("\\boxed{x}", "5", False),
        ("no answer at all", "12", False),
    ],
)
def test_math_verify_cases(prediction: str, reference: str, expected: bool) -> None:
    assert anyio.run(MathVerifier().verify, prediction, reference) is expected


def test_reference_latex() -> None:
    assert reference_latex(" 1/2 ") == "\\boxed{1/2}"
    assert reference_latex("$x$") == "$x$" and reference_latex("\\boxed{3}") == "\\boxed{3}"


@pytest.mark.parametrize(
    ("text", "correct", "boxed"),
    [
        ("So the answer is \\boxed{\\frac{17}{4}}.", True, "\\frac{17}{4}"),
        ("\\boxed{4} no, \\boxed{17/4}", True, "17/4"),  # the last box counts
        ("\\boxed{17/4} no, \\boxed{4}", False, "4"),
        ("17/4", False, None),  # no box: not sent to the verifier
        ("\\boxed{}", False, ""),
        ("\\boxed{17/4", False, None),
    ],
)
def test_score_boxed(text: str, correct: bool, boxed: str | None) -> None:
    assert anyio.run(MathVerifier().score_boxed, text, "17/4") == (correct, boxed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_verifications(backend: str) -> None:
    async def main() -> list[bool]:
        results: list[bool] = [False] * 12
        verifier = MathVerifier()

        async def one(i: int) -> None:
            results[i] = await verifier.verify(f"\\boxed{{{i}/2}}", f"{i / 2}")

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        return results

    assert anyio.run(main, backend=backend) == [True] * 12


def test_verifier_timeout_is_a_verifier_error() -> None:
    """A pathological answer: sympy would run for minutes; the worker's alarm stops it."""
    pool = shared_verifier_pool()
    kills = pool.kills
    start = time.monotonic()
    with pytest.raises(VerifierError, match="timed out after 0.5 s"):
        anyio.run(MathVerifier(timeout_s=0.5).verify, "\\boxed{9^{9^{9^{9}}}}", "2")
    assert time.monotonic() - start < 5 and pool.kills == kills  # the worker survived
    assert anyio.run(MathVerifier().verify, "\\boxed{2}", "2") is True
    assert issubclass(VerifierError, InfraError)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stuck_worker_is_killed_at_the_outer_deadline(backend: str) -> None:
    pool = VerifierPool(max_workers=1, grace_s=0.5, warm=False)

    async def main() -> None:
        assert await pool.call(envfakes.pool_echo, 1, timeout_s=10) == 1
        start = time.monotonic()
        with pytest.raises(VerifierError, match="no result within 0.8 s .* the pool was killed"):
            await pool.call(envfakes.pool_sleep_ignoring_alarm, 30.0, timeout_s=0.3)
        assert time.monotonic() - start < 3
        assert pool.kills == 1
        assert await pool.call(envfakes.pool_echo, "back", timeout_s=10) == "back"  # a new pool
        assert pool.starts == 2

    try:
        anyio.run(main, backend=backend)
    finally:
        pool.shutdown()


def test_inner_alarm_and_crashes() -> None:
    pool = VerifierPool(max_workers=1, warm=False)

    async def main() -> None:
        with pytest.raises(VerifierError, match="timed out after 0.2 s"):
            await pool.call(envfakes.pool_busy_python, 30.0, timeout_s=0.2)
        with pytest.raises(VerifierError, match="raised ValueError: bad input"):
            await pool.call(envfakes.pool_raise, timeout_s=5)
        with pytest.raises(VerifierError, match="a worker process died"):
            await pool.call(envfakes.pool_crash, timeout_s=5)
        assert await pool.call(envfakes.pool_echo, 7, timeout_s=10) == 7  # rebuilt after the crash
        with pytest.raises(ConfigError):
            await pool.call(envfakes.pool_echo, 7, timeout_s=0)

    try:
        anyio.run(main)
    finally:
        pool.shutdown()


def test_a_kill_does_not_fail_the_other_calls() -> None:
    """One stuck call kills the pool; a call that was running beside it is retried on the new pool."""
    pool = VerifierPool(max_workers=2, grace_s=0.3, warm=False)

    async def main() -> None:
        outcome: dict[str, object] = {}

        async def stuck() -> None:
            try:
                await pool.call(envfakes.pool_sleep_ignoring_alarm, 30.0, timeout_s=0.2)
            except VerifierError as exc:
                outcome["stuck"] = exc

        async def slow_but_fine() -> None:
            outcome["fine"] = await pool.call(envfakes.pool_busy_python, 0.8, timeout_s=5)

        await pool.call(envfakes.pool_echo, 0, timeout_s=10)  # start the workers
        async with anyio.create_task_group() as tg:
            tg.start_soon(stuck)
            tg.start_soon(slow_but_fine)
        assert isinstance(outcome["stuck"], VerifierError) and outcome["fine"] == "done"

    try:
        anyio.run(main)
    finally:
        pool.shutdown()


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="context"):
        VerifierPool(context="fork")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="grace_s"):
        VerifierPool(grace_s=0)
    assert shared_verifier_pool() is shared_verifier_pool()


def test_math_reward_terms() -> None:
    reward = MathReward(correct=1.0, incorrect=-1.0, format=0.1, tool_use=0.2)

    async def main() -> None:
        r, info = await reward("\\boxed{\\frac{1}{2}}", "0.5", successful_tool_calls=2)
        assert r == pytest.approx(1.3) and info == {
            "boxed": "\\frac{1}{2}",
            "correct": True,
            "reward_terms": {"answer": 1.0, "format": 0.1, "tool_use": 0.2},
        }
        r, info = await reward("\\boxed{3}", "0.5")
        assert r == pytest.approx(-0.9) and info["correct"] is False
        r, info = await reward("I don't know", "0.5")
        assert r == -1.0 and info["boxed"] is None

    anyio.run(main)


def test_verifier_accepts_each_answer_kind_through_the_pool() -> None:
    """Seven distinct correct answers of each kind verify through the process pool; the median
    latency is printed for information (timings are benchmarks' business, not asserted here)."""

    async def main() -> dict[str, float]:
        verifier = MathVerifier()
        await verifier.verify("\\boxed{1}", "1")
        out = {}
        for kind, make in {
            "integer": lambda i: (f"\\boxed{{{1000 + i}}}", str(1000 + i)),
            "fraction": lambda i: (f"\\boxed{{\\frac{{{i + 1}}}{{{i + 7}}}}}", f"{i + 1}/{i + 7}"),
            "interval": lambda i: (f"\\boxed{{({i}, {i + 2}]}}", f"({i},{i + 2}]"),
            "symbolic": lambda i: (f"\\boxed{{(x+{i})^2}}", f"x^2+{2 * i}x+{i * i}"),
        }.items():
            times = []
            for i in range(7):
                pred, ref = make(i)
                t = time.perf_counter()
                assert await verifier.verify(pred, ref), (pred, ref)
                times.append(time.perf_counter() - t)
            out[kind] = sorted(times)[len(times) // 2] * 1000
        return out

    medians = anyio.run(main)
    print("verifier median latency through the pool (ms):", {k: round(v, 2) for k, v in medians.items()})
