"""Bounded waits: every await on another component has a timeout that names what it waited for."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.errors import AgentRLError, TimeoutError_

__all__ = ["timed"]


async def timed(aw: Any, timeout: float, what: str, error: type[AgentRLError] = TimeoutError_) -> Any:
    """Await ``aw`` for at most ``timeout`` seconds; a timeout raises ``error`` naming ``what``.

    When ``aw`` is a Ray ``ObjectRef`` (a remote call), the remote task is cancelled too, on a
    timeout and when this wait is itself cancelled: giving up on a result must not leave an episode or a step running on for nothing, holding a
    generator's or a sandbox's capacity.
    """
    fut = asyncio.ensure_future(aw)
    try:
        return await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        _cancel_remote(aw)
        raise error(f"{what} did not finish within {timeout:.0f} s") from None
    except asyncio.CancelledError:  # the caller gave up on it (e.g. the run ended)
        _cancel_remote(aw)
        # wait_for cancels ``fut`` but never reads its outcome: a gather ends with a
        # CancelledError *set* on it, which asyncio prints with a traceback as "exception was
        # never retrieved" when it is collected
        fut.add_done_callback(_retrieve)
        raise


def _retrieve(fut: asyncio.Future) -> None:
    """Read a finished future's outcome, so that asyncio does not report it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


def _cancel_remote(aw: Any) -> None:
    try:
        import ray
    except ImportError:  # pragma: no cover
        return
    if isinstance(aw, ray.ObjectRef):
        try:
            ray.cancel(aw)
        except Exception:  # noqa: BLE001 - finished meanwhile, or the actor is gone: nothing to stop
            pass
