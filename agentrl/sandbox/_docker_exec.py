"""One execution's connection to a Docker sandbox's runner: a pooled container (:class:`Container`)
and one ``docker exec`` of the guest runner in it (:class:`RunnerExec`), driven over the exec's
hijacked stdio connection: the request and the code go to the runner's stdin; its answer (a wire
frame, then the code's output) comes back on stdout, demultiplexed from Docker's stream frames.

A runner that cannot be started, vanishes, answers nonsense or overshoots its deadline by more
than the sandbox's ``grace_s`` marks its container broken (removed and replaced by
:class:`~agentrl.sandbox.docker.DockerSandbox`, whose docstring is the design); the runner itself
is :mod:`agentrl.sandbox.guest.docker_runner`.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from agentrl.errors import SandboxError
from agentrl.sandbox.guest.wire import HDR, MAX_FRAME, frame

__all__ = ["Container", "RunnerExec"]


@dataclass
class Container:
    """One pooled container: its id and whether it may be reused."""

    id: str
    healthy: bool = True


class RunnerExec:
    """One ``docker exec`` of the guest runner, driven over its hijacked stdio connection."""

    _HDR = struct.Struct(">BxxxL")

    def __init__(self, container: Container, sock: socket.socket) -> None:
        self.container = container
        self.sock = sock
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.pending = bytearray()
        self.eof = False

    @classmethod
    async def open(cls, client: Any, container: Container, argv: list[str]) -> RunnerExec:
        """Start the runner (command line ``argv``) in ``container`` through the Docker engine's
        ``client``.

        Raises:
            SandboxError: the Docker API refused (the container is then marked broken).
        """

        def start() -> socket.socket:
            api = client.api
            exec_id = api.exec_create(
                container.id, argv, stdin=True, stdout=True, stderr=True, tty=False,
                user="0", workdir="/tmp",
            )["Id"]
            raw = api.exec_start(exec_id, socket=True)
            real = getattr(raw, "_sock", raw)
            sock = socket.socket(fileno=os.dup(real.fileno()))
            try:
                raw.close()
            except OSError:
                pass
            return sock

        try:
            sock = await anyio.to_thread.run_sync(start)
        except Exception as exc:
            container.healthy = False
            raise SandboxError(f"docker sandbox: cannot start an exec: {exc}") from exc
        sock.setblocking(False)
        return cls(container, sock)

    async def request(
        self, req: dict[str, Any], code: str, timeout: float, grace_s: float
    ) -> tuple[dict[str, Any], bytes, bytes]:
        """Send one request and wait for its result: ``(result, stdout bytes, stderr bytes)``.

        Raises:
            SandboxError: the runner vanished, answered nonsense, or overshot the deadline
                ``timeout`` by more than ``grace_s`` (the container is then marked broken).
        """
        data = code.encode("utf-8", "surrogatepass")
        payload = frame({**req, "code_len": len(data)}) + data
        try:
            with anyio.fail_after(timeout + grace_s):
                await self._send(payload)
                result = await self._recv_frame()
                tail = await self._read_stdout(int(result["out_len"]) + int(result["err_len"]))
        except TimeoutError as exc:
            self.container.healthy = False
            raise SandboxError(
                f"docker sandbox: the runner did not answer within {timeout + grace_s:g} s"
                f"{self._stderr_note()}"
            ) from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.container.healthy = False
            raise SandboxError(f"docker sandbox: broken runner: {exc!r}{self._stderr_note()}") from exc
        out_len = int(result["out_len"])
        return result, tail[:out_len], tail[out_len:]

    async def finish(self, timeout: float = 10.0) -> bool:
        """Close our side of stdin and wait for the runner to exit; whether it did in time."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        with anyio.move_on_after(timeout):
            while not self.eof:
                await self._read_more()
            return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- stream plumbing ----------------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = self.sock.send(view[: 1 << 20])
            except BlockingIOError:
                await anyio.wait_writable(self.sock)
                continue
            view = view[n:]

    async def _read_more(self) -> None:
        """Read from the connection and demultiplex Docker's stdout/stderr frames."""
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            await anyio.wait_readable(self.sock)
            return
        if not chunk:
            self.eof = True
            return
        self.pending += chunk
        while len(self.pending) >= 8:
            stream, size = self._HDR.unpack(self.pending[:8])
            if len(self.pending) < 8 + size:
                break
            body = bytes(self.pending[8 : 8 + size])
            del self.pending[: 8 + size]
            if stream == 1:
                self.stdout += body
            else:
                self.stderr += body
                del self.stderr[:-8192]

    async def _read_stdout(self, n: int) -> bytes:
        while len(self.stdout) < n:
            if self.eof:
                raise OSError("the runner exited before it answered")
            await self._read_more()
        out = bytes(self.stdout[:n])
        del self.stdout[:n]
        return out

    async def _recv_frame(self) -> dict[str, Any]:
        (n,) = HDR.unpack(await self._read_stdout(HDR.size))
        if n > MAX_FRAME:
            raise ValueError("frame too large")
        msg = json.loads(await self._read_stdout(n))
        if not isinstance(msg, dict) or msg.get("event") != "result":
            raise ValueError(f"unexpected answer {msg!r}")
        return msg

    def _stderr_note(self) -> str:
        text = bytes(self.stderr).decode("utf-8", "replace").strip()
        return f": {text[-2000:]}" if text else ""
