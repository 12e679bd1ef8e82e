"""Rule-based rewards: ``math-verify`` answer checking in a process pool with a hard outer timeout.

Why a process pool. ``math_verify.parse``/``verify`` bound their own running time with
``signal.alarm``, which works only in the main thread of a process: off it they raise, or score 0
without saying so. Pathological answers (``\\boxed{9^{9^{9^{9}}}}``) make sympy run for minutes.
So every verification runs in a worker process of a :class:`VerifierPool`, in that worker's main
thread, under two deadlines:

- an *inner* one (``signal.setitimer`` in the worker, default 5 s) that interrupts Python-level
  work and leaves the worker usable;
- an *outer* one in the caller (inner + ``grace_s``) that catches what signals cannot interrupt
  (a worker stuck in C code, or dead): the pool's processes are killed and the pool is rebuilt
  lazily at the next call.

Either deadline, and a crashed worker, raise :class:`~agentrl.errors.VerifierError` (an
:class:`~agentrl.errors.InfraError`): the environment reports ``info["infra_failure"]`` and the
episode is kept out of the loss. **A verifier failure is never a reward of 0.**

One pool is shared by everything in a process (:func:`shared_verifier_pool`), created at the first
verification. Workers are started with the ``spawn`` method (safe beside threads, Ray and vLLM),
import ``math_verify`` once and warm it up. As with any ``spawn`` child, a *script* that verifies
at import time needs the ``if __name__ == "__main__":`` guard.

Measured on the 2-core development machine (``test_measure_verifier_latency_through_the_pool``
prints it): a pool start (spawn + import + warm-up) 1.2-2 s, once per process and again after a
kill; a verification of a new answer through the pool, median about 4 ms for integers and
fractions and about 40 ms for intervals and symbolic answers (sympy).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import sniffio

from agentrl.envs.parsers import extract_boxed
from agentrl.errors import ConfigError, VerifierError

__all__ = [
    "VerifierPool",
    "shared_verifier_pool",
    "MathVerifier",
    "MathReward",
    "math_verify_in_process",
    "reference_latex",
]

T = TypeVar("T")

_GUARD_HINT = (
    ". If this runs from a script, check that the script has an `if __name__ == '__main__':` "
    "guard: worker processes re-import the main script"
)

#: Seconds the outer deadline adds to a call's inner timeout before the pool is killed.
DEFAULT_GRACE_S = 3.0


# --------------------------------------------------------------------------------------------
# Worker side (runs in the pool's processes; must be importable, picklable by reference)
# --------------------------------------------------------------------------------------------


class _Deadline(BaseException):
    """Raised by the worker's own alarm. A BaseException, so that math-verify's ``except
    Exception`` (which turns errors into ``False``) cannot swallow it."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Deadline()


def _worker_init() -> None:
    """Import math-verify and run it once, so that the first real call pays no start-up."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we disable its alarms
    try:
        math_verify_in_process("\\boxed{\\frac{1}{2}}", "1/2", 10.0)
    except Exception:  # pragma: no cover - a broken install surfaces at the first real call
        pass


def _call_with_deadline(fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> tuple[str, Any, float]:
    """Run ``fn(*args)`` in the worker's main thread under a SIGALRM deadline.

    Returns ``("ok", value, seconds)`` or ``("timeout", None, seconds)``; other exceptions travel
    back to the caller through the pool (and become VerifierError there).
    """
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        value = fn(*args)
    except _Deadline:
        return "timeout", None, time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return "ok", value, time.perf_counter() - start


def reference_latex(reference: str) -> str:
    """The text math-verify parses for a reference answer: the reference itself when it already
    holds ``$`` or ``\\boxed``, else ``\\boxed{reference}`` (so ``"1/2"``, ``"\\frac{1}{2}"`` and
    ``"(1,2]"`` all parse as the mathematical object, not as prose)."""
    ref = reference.strip()
    if "$" in ref or "\\boxed" in ref:
        return ref
    return "\\boxed{" + ref + "}"


def math_verify_in_process(prediction: str, reference: str, _unused_timeout_s: float = 0.0) -> bool:
    """True iff ``prediction`` (text math-verify can parse, e.g. ``"\\boxed{0.5}"``) is
    mathematically equal to ``reference`` (e.g. ``"1/2"``). Runs math-verify **in this process**
    with its own signal timeouts disabled: call it only in a :class:`VerifierPool` worker (or a
    main thread that bounds its time otherwise)."""
    from math_verify import parse, verify

    gold = parse(reference_latex(reference), parsing_timeout=None)  # type: ignore[arg-type]
    pred = parse(prediction, parsing_timeout=None)  # type: ignore[arg-type]
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


# --------------------------------------------------------------------------------------------
# Caller side
# --------------------------------------------------------------------------------------------


def _loop_key() -> object:
    """An object identifying the running event loop (the asyncio loop or the trio run token)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    return asyncio.get_running_loop()


async def _wait_future(fut: Future[T]) -> T:
    """Await a :class:`concurrent.futures.Future` on asyncio or trio without tying up a thread.

    The future's done-callback (run by the pool's management thread) wakes this task through the
    loop's thread-safe scheduling; if this task is cancelled first, a still-pending call is
    cancelled too (a running one finishes in its worker and is ignored).
    """
    event = anyio.Event()
    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()
        schedule: Callable[[Callable[[], None]], Any] = token.run_sync_soon
    else:
        schedule = asyncio.get_running_loop().call_soon_threadsafe

    def wake(_: Future[T]) -> None:
        try:
            schedule(event.set)
        except Exception:  # the loop is closed or the trio run finished: nobody is waiting
            pass

    fut.add_done_callback(wake)
    try:
        await event.wait()
    finally:
        if not fut.done():
            fut.cancel()
    return fut.result()


class VerifierPool:
    """A lazily started process pool for CPU-bound checks that must be killable.

    Args:
        max_workers: worker processes (default: ``min(2, os.cpu_count())``). At most this many
            calls per event loop are in flight; more wait their turn (their deadline starts when
            they are submitted, not while they wait).
        context: multiprocessing start method, ``"spawn"`` (default) or ``"forkserver"``
            (``"fork"`` is refused: unsafe in a process with threads).
        grace_s: seconds added to each call's inner timeout for the outer deadline.
        warm: import math-verify and run one verification in each worker as it starts (so that
            the first real call pays no import); False for pools that run other functions.

    The pool is safe to share between event loops and threads. Use :func:`shared_verifier_pool`
    rather than building one per environment.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        context: Literal["spawn", "forkserver"] = "spawn",
        grace_s: float = DEFAULT_GRACE_S,
        warm: bool = True,
    ) -> None:
        if context not in ("spawn", "forkserver"):
            raise ConfigError(f"VerifierPool: context must be 'spawn' or 'forkserver', got {context!r}")
        self.max_workers = max_workers or max(1, min(2, os.cpu_count() or 1))
        if self.max_workers < 1:
            raise ConfigError(f"VerifierPool: max_workers must be >= 1, got {max_workers}")
        if not grace_s > 0:
            raise ConfigError(f"VerifierPool: grace_s must be > 0, got {grace_s}")
        self.context = context
        self.grace_s = grace_s
        self.warm = warm
        self.starts = 0
        """How many times worker processes were (re)started: 1 after the first call, +1 per kill."""
        self.kills = 0
        """How many times the pool was killed at an outer deadline or after a crash."""
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._generation = 0
        # one limiter per event loop (anyio primitives belong to one loop); keys are the asyncio
        # loop or the trio token, both weak-referenceable, so finished loops drop out
        self._limiters: weakref.WeakKeyDictionary[object, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()

    def _limiter(self) -> anyio.CapacityLimiter:
        key = _loop_key()
        with self._lock:
            limiter = self._limiters.get(key)
            if limiter is None:
                limiter = self._limiters[key] = anyio.CapacityLimiter(self.max_workers)
        return limiter

    def _get_executor(self) -> tuple[ProcessPoolExecutor, int]:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    max_workers=self.max_workers,
                    mp_context=multiprocessing.get_context(self.context),
                    initializer=_worker_init if self.warm else None,
                )
                self._generation += 1
                self.starts += 1
            return self._executor, self._generation

    def _kill(self, generation: int) -> None:
        """Kill the worker processes of ``generation`` (if still current); the next call restarts."""
        with self._lock:
            if self._executor is None or generation != self._generation:
                return
            executor, self._executor = self._executor, None
            self._generation += 1  # calls still waiting on the old workers see that it was replaced
            self.kills += 1
        # ProcessPoolExecutor has no public way to kill a worker stuck in C code (3.14 adds
        # kill_workers); its process table is the only handle.
        for proc in list(getattr(executor, "_processes", {}).values()):
            try:
                proc.kill()
            except Exception:
                pass
        executor.shutdown(wait=False, cancel_futures=True)

    async def call(self, fn: Callable[..., T], *args: Any, timeout_s: float = 5.0) -> T:
        """Run ``fn(*args)`` in a worker's main thread and return its value.

        ``fn`` and ``args`` must be picklable (``fn`` a module-level function). ``timeout_s`` is the
        inner deadline (a SIGALRM in the worker); after ``timeout_s + grace_s`` seconds the pool is
        killed. A call whose worker was killed because of *another* call's deadline is retried
        once on the new pool.

        Raises:
            VerifierError: the inner or outer deadline passed, the worker died, or ``fn`` raised
                (the message says which; the original exception is the ``__cause__``).
        """
        if not timeout_s > 0:
            raise ConfigError(f"VerifierPool.call: timeout_s must be > 0, got {timeout_s}")
        name = getattr(fn, "__name__", repr(fn))
        async with self._limiter():
            for attempt in (0, 1):
                executor, generation = self._get_executor()
                try:
                    fut = executor.submit(_call_with_deadline, fn, args, timeout_s)
                except (BrokenExecutor, RuntimeError) as exc:  # broken or shut down meanwhile
                    self._kill(generation)
                    if attempt == 0:
                        continue
                    raise VerifierError(f"verifier {name}: the process pool is broken: {exc}{_GUARD_HINT}") from exc
                outer = timeout_s + self.grace_s
                try:
                    with anyio.fail_after(outer):
                        status, value, _ = await _wait_future(fut)
                except TimeoutError:
                    self._kill(generation)
                    raise VerifierError(
                        f"verifier {name}: no result within {outer:g} s (the worker did not respond to its "
                        f"{timeout_s:g} s alarm); the pool was killed"
                    ) from None
                except BrokenExecutor as exc:
                    replaced = generation != self._generation
                    self._kill(generation)
                    if replaced and attempt == 0:  # another call's deadline killed our worker
                        continue
                    raise VerifierError(f"verifier {name}: a worker process died ({exc}){_GUARD_HINT}") from exc
                except Exception as exc:
                    raise VerifierError(f"verifier {name} raised {type(exc).__name__}: {exc}") from exc
                if status == "timeout":
                    raise VerifierError(f"verifier {name}: timed out after {timeout_s:g} s")
                return value  # type: ignore[no-any-return]
        raise AssertionError("unreachable")  # pragma: no cover

    def shutdown(self) -> None:
        """Stop the workers now (a later call starts new ones)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


_SHARED: tuple[int, VerifierPool] | None = None
_SHARED_LOCK = threading.Lock()


def shared_verifier_pool() -> VerifierPool:
    """The process-wide :class:`VerifierPool` (default settings), created at the first call.

    Its workers start at the first verification, not here. A forked child gets its own pool.
    """
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED[0] != os.getpid():
            _SHARED = (os.getpid(), VerifierPool())
        return _SHARED[1]


@dataclass(frozen=True)
class MathVerifier:
    """Scores final answers with math-verify against a reference answer.

    Attributes:
        timeout_s: inner deadline of one verification, seconds (the pool adds its grace for the
            outer one). Past it the verification is a :class:`~agentrl.errors.VerifierError`.
        pool: the process pool; None = :func:`shared_verifier_pool`.
    """

    timeout_s: float = 5.0
    pool: VerifierPool | None = None

    async def verify(self, prediction: str, reference: str) -> bool:
        """True iff ``prediction`` (e.g. ``"\\boxed{0.5}"`` or ``"$x = 1/2$"``) equals
        ``reference`` (e.g. ``"1/2"``) mathematically: fractions, decimals, LaTeX, intervals,
        sets, equations ``x = 5`` versus ``5``, ...

        Raises:
            VerifierError: the verification timed out or its worker crashed.
        """
        pool = self.pool or shared_verifier_pool()
        return bool(await pool.call(math_verify_in_process, prediction, str(reference), timeout_s=self.timeout_s))

    async def score_boxed(self, text: str, reference: str) -> tuple[bool, str | None]:
        """``(correct, boxed)``: whether the **last** ``\\boxed{}`` of ``text`` equals ``reference``.

        ``boxed`` is that box's content (None when there is none; then ``correct`` is False and
        nothing is sent to the pool).

        Raises:
            VerifierError: as :meth:`verify`.
        """
        boxed = extract_boxed(text)
        if boxed is None or not boxed.strip():
            return False, boxed
        return await self.verify("\\boxed{" + boxed + "}", reference), boxed


@dataclass(frozen=True)
class MathReward:
    """The reward of a math episode: answer correctness plus optional shaping terms.

    ``reward = (correct if the answer is right else incorrect) + format (if the final answer has
    a non-empty \\boxed{}) + tool_use (if the episode made at least one tool call that ran
    without error)``. Shaping terms default to 0 (off); each is an explicit env kwarg.

    Attributes:
        correct: reward for a right answer.
        incorrect: reward for a wrong or missing answer (ReTool uses -1).
        format: added when the final answer holds a non-empty ``\\boxed{}``.
        tool_use: added when at least one tool call of the episode succeeded.
        verifier: how answers are checked.
    """

    correct: float = 1.0
    incorrect: float = 0.0
    format: float = 0.0
    tool_use: float = 0.0
    verifier: MathVerifier = MathVerifier()

    async def __call__(self, action: str, reference: str, *, successful_tool_calls: int = 0) -> tuple[float, dict[str, Any]]:
        """``(reward, info)`` for the final answer ``action``; ``info`` holds ``"boxed"`` (the
        last box's content or None), ``"correct"`` (bool) and ``"reward_terms"`` (``answer``,
        ``format``, ``tool_use``).

        Raises:
            VerifierError: the verification timed out or crashed (not a wrong answer).
        """
        ok, boxed = await self.verifier.score_boxed(action, reference)
        terms = {
            "answer": self.correct if ok else self.incorrect,
            "format": self.format if boxed is not None and boxed.strip() else 0.0,
            "tool_use": self.tool_use if successful_tool_calls > 0 else 0.0,
        }
        return sum(terms.values()), {"boxed": boxed, "correct": ok, "reward_terms": terms}
