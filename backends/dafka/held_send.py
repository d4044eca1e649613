"""Send on a ZeroMQ socket without giving the GIL up: libzmq's `zmq_send` through ctypes,
and batches of records through the C fast path (`records_sender`, `_zmqbatch.c`).

pyzmq releases the GIL around every frame it sends. The producer actor sends two frames
per record while the gateway's event loop, in the same process, wants the GIL for its
next pass: each release can hand the GIL to the loop and leave the actor waiting for it
back, a futex wake-up and a context switch per frame. Held across a few records' frames,
unpipelined RPUSHX from 50 clients cost the gateway 2.5-3.5 µs less CPU per record and a
quarter fewer context switches (`docs/dafka-engine.md`, "Sending records without the GIL").

Only for sends that never block: a PUB socket (it drops at its high-water mark), or any
socket with `zmq.NOBLOCK`. The caller must not send once the socket is closed (the handle
is libzmq's raw pointer; pyzmq's own checks are bypassed).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Protocol

import zmq


class Send(Protocol):
    def __call__(self, data: bytes, flags: int = 0, /) -> None: ...


class SendRecords(Protocol):
    """Send each of `contents` as a two-frame message: `prefix` and the sequence (8
    bytes, big endian) counting up from `sequence`, then the content (a RECORD)."""

    def __call__(self, prefix: bytes, sequence: int, contents: list[bytes], /) -> None: ...


_PACK_SEQ = struct.Struct(">Q").pack


@functools.cache
def libzmq() -> ctypes.PyDLL | None:
    """The libzmq pyzmq loaded, its functions called without releasing the GIL
    (`ctypes.PyDLL`); None where it cannot be found (only Linux's /proc/self/maps is
    read: elsewhere pyzmq's own calls serve)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {
                line.split()[-1]
                for line in maps
                if os.path.basename(line.rstrip()).startswith("libzmq")
            }
    except OSError:
        return None
    if len(paths) != 1:
        return None
    try:
        # use_errno: ctypes keeps the call's errno for get_errno(); zmq_errno() read after
        # the call returns may see another one (Python ran in between: a signal handler).
        return ctypes.PyDLL(paths.pop(), use_errno=True)
    except OSError:
        return None


@functools.cache
def batch_module() -> ModuleType | None:
    """The C fast path (`_zmqbatch.c`) bound to pyzmq's libzmq; None where it was not
    built (no compiler at install) or libzmq cannot be found (see `libzmq`)."""
    library = libzmq()
    if library is None:
        return None
    try:
        from backends.dafka import _zmqbatch  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        _zmqbatch.load(library._name)
    except OSError:
        return None
    module: ModuleType = _zmqbatch
    return module


def zmq_error(code: int | None) -> zmq.ZMQError:
    """libzmq's error `code` (from ctypes or the C fast path) as pyzmq raises it."""
    code = code or errno.EFAULT
    return zmq.Again(code) if code == errno.EAGAIN else zmq.ZMQError(code)


@functools.cache
def _zmq_send() -> Callable[[ctypes.c_void_p, bytes, int, int], int] | None:
    """libzmq's `zmq_send`, called without releasing the GIL (None: see `libzmq`)."""
    library = libzmq()
    if library is None:
        return None
    send = library.zmq_send
    send.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    send.restype = ctypes.c_int
    return send


def held_sender(socket: zmq.Socket) -> Send:
    """`socket.send(data, flags)` that keeps the GIL (pyzmq's send where libzmq cannot
    be reached this way, and for anything but bytes)."""
    zmq_send = _zmq_send()
    if zmq_send is None:
        return socket.send
    handle = ctypes.c_void_p(socket.underlying)
    fallback = socket.send

    def send(data: bytes, flags: int = 0) -> None:
        try:
            sent = zmq_send(handle, data, len(data), flags)
        except ctypes.ArgumentError:  # not bytes: pyzmq takes any buffer
            fallback(data, flags)
            return
        if sent < 0:
            raise zmq_error(ctypes.get_errno())

    return send


def direct_sender(socket: zmq.Socket) -> Send:
    """`socket.send(data, flags)` without pyzmq's Python wrapper around its Cython send,
    which only adds the routing_id and group of draft sockets (none of ours): 0.29
    against 0.49 µs a frame. It gives the GIL up as pyzmq's send does. The socket's own
    send where pyzmq has no such wrapper."""
    try:
        send: Send = super(zmq.Socket, socket).send
    except AttributeError:
        return socket.send
    return send


def records_sender(socket: zmq.Socket, hold_gil: bool) -> SendRecords:
    """A `SendRecords` on `socket` (one that never blocks: see above): a batch in one call
    to the C fast path, which keeps the GIL (`hold_gil`) or gives it up once for the
    batch; where it was not built, two calls a record to `held_sender` (keeping it) or to
    `direct_sender` (giving it up per frame). The C path costs about 0.3 us a record,
    the others 0.8-1.1."""
    module = batch_module()
    if module is None:
        return python_records_sender(held_sender(socket) if hold_gil else direct_sender(socket))
    send_records = module.send_records
    handle = socket.underlying
    fallback = python_records_sender(socket.send)

    def send(prefix: bytes, sequence: int, contents: list[bytes]) -> None:
        try:
            send_records(handle, prefix, sequence, contents, not hold_gil)
        except TypeError:  # a content that is not bytes, refused before anything went
            fallback(prefix, sequence, contents)
        except OSError as error:
            raise zmq_error(error.errno) from None

    return send


def python_records_sender(send: Send) -> SendRecords:
    """`SendRecords` through `send`, two calls a record."""
    more = zmq.SNDMORE
    pack = _PACK_SEQ

    def send_records(prefix: bytes, sequence: int, contents: list[bytes]) -> None:
        for content in contents:
            send(prefix + pack(sequence), more)
            send(content)
            sequence += 1

    return send_records
