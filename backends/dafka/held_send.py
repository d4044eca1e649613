"""Send on a ZeroMQ socket without giving the GIL up: libzmq's `zmq_send` through ctypes.

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
import functools
import os
from collections.abc import Callable
from typing import Protocol

import zmq


class Send(Protocol):
    def __call__(self, data: bytes, flags: int = 0, /) -> None: ...


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
            errno = ctypes.get_errno()
            raise zmq.Again(errno) if errno == zmq.EAGAIN else zmq.ZMQError(errno)

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
