"""The resource limits of one execution, host side: their values, validation and wire form.

They are applied inside the sandbox by :func:`agentrl.sandbox.guest.limits.apply_limits`, the one place
that sets rlimits (every backend and mode), whose docstring says what each limit means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentrl.errors import ConfigError

#: Largest file a sandboxed process may write (RLIMIT_FSIZE), in bytes.
FSIZE_BYTES = 64 * 1024 * 1024
#: Most file descriptors a sandboxed process may hold open (RLIMIT_NOFILE).
NOFILE = 256


@dataclass(frozen=True)
class Limits:
    """The limits of one execution (or session cell), as :func:`~agentrl.sandbox.guest.limits.apply_limits`
    takes them.

    Attributes:
        cpu_s: CPU seconds the code may use (RLIMIT_CPU, on top of what the process used before).
        memory_bytes: address space each process may add to what the interpreter held when the
            code was handed to it (RLIMIT_AS = that VmSize + ``memory_bytes``).
        fsize_bytes: largest file the code may write (RLIMIT_FSIZE).
        nofile: most open file descriptors (RLIMIT_NOFILE).
        nproc: most processes of the sandbox uid (RLIMIT_NPROC); 0: not set (Docker counts them
            with the container's PID limit).
    """

    cpu_s: int
    memory_bytes: int
    fsize_bytes: int
    nofile: int
    nproc: int

    @classmethod
    def for_run(cls, *, timeout_s: float, memory_mb: int, max_processes: int) -> Limits:
        """CPU seconds a bit above the wall deadline (the deadline normally fires first)."""
        return cls(
            cpu_s=math.ceil(timeout_s) + 1,
            memory_bytes=memory_mb * 1024 * 1024,
            fsize_bytes=FSIZE_BYTES,
            nofile=NOFILE,
            nproc=max_processes,
        )

    def request_fields(self) -> dict[str, int]:
        """The limits as fields of a guest request (the keys :func:`~agentrl.sandbox.guest.limits.apply_limits`
        reads)."""
        return {
            "memory_bytes": self.memory_bytes,
            "cpu_s": self.cpu_s,
            "fsize": self.fsize_bytes,
            "nofile": self.nofile,
            "nproc": self.nproc,
        }


def check_settings(
    *, max_concurrency: int, timeout_s: float, memory_mb: int, max_output_bytes: int,
    max_processes: int,
) -> None:
    """Reject nonsensical constructor arguments with a :class:`ConfigError` naming the argument."""
    for name, value in (
        ("max_concurrency", max_concurrency),
        ("timeout_s", timeout_s),
        ("memory_mb", memory_mb),
        ("max_output_bytes", max_output_bytes),
        ("max_processes", max_processes),
    ):
        if not value > 0:
            raise ConfigError(f"sandbox: {name} must be > 0, got {value!r}")


def run_settings(
    timeout_s: float | None, memory_mb: int | None, default_timeout_s: float, default_memory_mb: int
) -> tuple[float, int]:
    """Resolve per-run overrides against the sandbox defaults, validating them."""
    t = default_timeout_s if timeout_s is None else timeout_s
    m = default_memory_mb if memory_mb is None else memory_mb
    if not t > 0:
        raise ConfigError(f"sandbox run: timeout_s must be > 0, got {t!r}")
    if not m > 0:
        raise ConfigError(f"sandbox run: memory_mb must be > 0, got {m!r}")
    return t, m
