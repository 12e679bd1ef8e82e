"""The guest's wire format, the one definition that both sides use. The guest program ships it
(joined by :mod:`agentrl.sandbox._launch`), and the host imports it (:mod:`agentrl.sandbox._tree`,
:mod:`agentrl.sandbox._warm`, :mod:`agentrl.sandbox.docker`). Standard library only.

* A *frame* (the warm server's control socket, the Docker runner's stdio) is a 4-byte big-endian
  length (:data:`HDR`, at most :data:`MAX_FRAME`), then that many bytes of JSON (:func:`frame`).
* A *tree channel* is a ``SOCK_SEQPACKET`` socket with one JSON object per message
  (:class:`Packets`). A request is its header ``{"code_len": n, ...limits}`` with the
  descriptors for the code's stdout and stderr attached (``SCM_RIGHTS``; then those of the cgroups
  to join), and after a newline in the same message as much of the code as fits; the rest of the
  code follows in messages of at most :data:`CHUNK` bytes.
* Over the Docker runner's stdio a request is a frame ``{"code_len": n, ...}`` followed by ``n``
  bytes of UTF-8 source; the answer is a frame followed by the captured output (:class:`Stream`).
* :data:`STARTED` and :data:`RELEASE` are the two messages that are sent as fixed bytes.
"""

import json
import os
import socket
import struct

#: A frame's length prefix.
HDR = struct.Struct(">I")
#: Largest frame a reader accepts.
MAX_FRAME = 1 << 20


def encode(obj):
    """``obj`` as the compact JSON bytes of one message (or one frame's body)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def frame(obj):
    """One frame: a 4-byte big-endian length (:data:`HDR`), then that many bytes of JSON."""
    data = encode(obj)
    return HDR.pack(len(data)) + data


#: Largest piece of code per message on a SOCK_SEQPACKET channel.
CHUNK = 32 * 1024


class Packets:
    """A SOCK_SEQPACKET socket: one JSON object (or raw chunk) per message, fds attached."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, obj, fds=()):
        data = json.dumps(obj, separators=(",", ":")).encode()  # encode(obj), inline: U calls it
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv_raw(self):
        data, fds, _flags, _addr = socket.recv_fds(self.sock, CHUNK + 4096, 8)
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError
        return data, fds

    def recv_request(self):
        """One request: the header (with the stdout/stderr fds attached), then the code in
        chunks; the header's message may carry the start of the code after a newline (a JSON
        header never holds a raw one), all of it when it is short."""
        data, fds = self.recv_raw()
        head, _nl, first = data.partition(b"\n")
        req = json.loads(head)
        parts, size, want = [first], len(first), int(req["code_len"])
        while size < want:
            chunk, extra = self.recv_raw()
            for fd in extra:
                os.close(fd)
            parts.append(chunk)
            size += len(chunk)
        return req, fds, b"".join(parts).decode("utf-8", "surrogatepass")

    def send_request(self, req, code, fds):
        self.send(dict(req, code_len=len(code)), fds=fds)
        for i in range(0, len(code), CHUNK):
            self.sock.sendall(code[i:i + CHUNK])

    def park(self, fd=1000):
        """Move the socket to a high, close-on-exec descriptor, out of the code's way."""
        old = self.sock.fileno()
        if old == fd and not os.get_inheritable(fd):
            return fd
        if old != fd:
            os.dup2(old, fd)
            self.sock.detach()
            os.close(old)
        os.set_inheritable(fd, False)
        self.sock = socket.socket(fileno=fd)
        return fd


class Stream:
    """Length-prefixed JSON frames (plus raw tails) over a pair of pipe fds (the Docker runner)."""

    def __init__(self, rfd, wfd):
        self.rfd = rfd
        self.wfd = wfd
        self.buf = bytearray()

    def read(self, n):
        while len(self.buf) < n:
            data = os.read(self.rfd, 1 << 16)
            if not data:
                raise EOFError
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv(self):
        (n,) = HDR.unpack(self.read(4))
        if n > MAX_FRAME:
            raise ValueError("frame too large")
        return json.loads(self.read(n))

    def send(self, obj, tail=b""):
        view = memoryview(frame(obj) + tail)
        while view:
            view = view[os.write(self.wfd, view):]


STARTED = b'{"event":"started"}'
"""The ``started`` event, encoded once."""

RELEASE = b'{"op":"release"}'
"""The host's last message on an exec tree's channel after a normal end, just before it closes
it: it leaves the tree's init alone, so the server may reset and reuse the tree."""
