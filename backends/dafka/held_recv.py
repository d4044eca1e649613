"""Receive from a ZeroMQ socket without giving the GIL up: batches of messages through the
C fast path (`batch_receiver`, `_zmqbatch.c`), or where it was not built, libzmq's
`zmq_msg_recv` through ctypes (the receiving side of `held_send.py`).

pyzmq releases the GIL around every frame it receives. The gateway's reader received
the copies of the gateway's own records (its groups took them in process; it dropped
them) while the event loop, in the same process, wanted the GIL: each release let the
loop in, and the frame after it waited for the GIL back, the loop too when the reader had
it. Held across a drain, at 10,000 records/s with 100 BLPOPs in flight the loop went to
sleep 0.29-0.33 times per record instead of 0.49-0.52 (waiting for the GIL, mostly) and
the p99.9 from RPUSHX to BLPOP fell from 4.7-7.5 to 2.9-3.1 ms, though a frame costs more
this way (2.5 against 0.8 µs a 2-frame message, uncontended). Since, the reader no longer
connects to its own gateway's writers (docs/dafka-engine.md, "Latency"): what it receives
a few messages at a time is other producers' live records and the stores' answers, and
whether keeping the GIL still pays has not been measured again on a quiet machine.

A receiver keeps one `zmq_msg_t`, initialised once: `zmq_msg_recv` frees what the
message held before it receives the next, and `close()` frees the last. Only for the
thread that owns the socket, and only while the socket is open (the handle is libzmq's
raw pointer; pyzmq's own checks are bypassed).
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable

import zmq

from backends.dafka.held_send import batch_module, libzmq, zmq_error

# Two frames: every message a reader takes has one or two (a RECORD's header and content).
Receive = Callable[[], "list[bytes] | None"]
# Up to so many messages waiting, as Receive takes them; fewer: no more were waiting.
ReceiveMany = Callable[[int], "list[list[bytes]]"]
# Without the C fast path: messages of one drain received keeping the GIL; past them
# pyzmq's receive, the cheaper call, which lets the event loop run meanwhile (a bulk of
# FETCH answers), as the producer actor sends (`publisher._HOLD_GIL_UP_TO`). All of them
# held, a reader fetching from the store served BLMPOP COUNT 500 at 96,500 instead of
# 120,300 records/s. With it, the size of a drain's first batch.
HELD_UP_TO = 256
_MSG_SIZE = 64  # sizeof(zmq_msg_t)


class HeldReceiver:
    """`take()`: the first two frames of the next message waiting, without blocking, or
    None when none is waiting; frames beyond the second are read as messages of their own
    (as the store and a C peer read them)."""

    def __init__(self, socket: zmq.Socket, library: ctypes.PyDLL) -> None:
        init = library.zmq_msg_init
        init.argtypes = [ctypes.c_void_p]
        recv = library.zmq_msg_recv
        recv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        recv.restype = ctypes.c_int
        data = library.zmq_msg_data
        data.argtypes = [ctypes.c_void_p]
        data.restype = ctypes.c_void_p
        more = library.zmq_msg_more
        more.argtypes = [ctypes.c_void_p]
        self._close = library.zmq_msg_close
        self._close.argtypes = [ctypes.c_void_p]
        self._msg: ctypes.Array[ctypes.c_char] | None = ctypes.create_string_buffer(_MSG_SIZE)
        init(self._msg)
        msg, handle, noblock, at = (
            self._msg,
            ctypes.c_void_p(socket.underlying),
            zmq.NOBLOCK,
            ctypes.string_at,
        )

        def take() -> list[bytes] | None:
            size = recv(msg, handle, noblock)
            if size < 0:
                _failed()
                return None
            frames = [at(data(msg), size)]
            if more(msg):  # the other parts are here already: a message arrives whole
                size = recv(msg, handle, noblock)
                if size < 0:
                    _failed()
                    return frames
                frames.append(at(data(msg), size))
            return frames

        self.take: Receive = take

    def close(self) -> None:
        """Free the last message received (once; `take` must not be called after)."""
        if self._msg is not None:
            self._close(self._msg)
            self._msg = None


def _failed() -> None:
    """After a failed receive: nothing waiting (or interrupted: the caller polls again) is
    no error; anything else is pyzmq's error."""
    code = ctypes.get_errno()
    if code not in (errno.EAGAIN, errno.EINTR):
        raise zmq_error(code)


def pyzmq_receiver(socket: zmq.Socket) -> Receive:
    """`HeldReceiver.take` through pyzmq's receive, which gives the GIL up per frame (the
    store writer's receive, and the reader's past HELD_UP_TO).

    The first frame comes as a zero-copy Frame, which knows `more` itself; the second as
    bytes, whose `more` nobody asks: a getsockopt(RCVMORE) costs 0.9 µs, a second Frame
    0.7 µs, and a 2-frame message took 1.5 µs that way against 0.8 µs. A malformed message
    with a third frame is read on as messages of its own, each dropped or taken as any
    message its sender could have sent: ZeroMQ hands a message over whole, so no other
    peer's frames come between.
    """
    recv = socket.recv

    def take() -> list[bytes] | None:
        try:
            frame = recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        if frame.more:
            return [frame.bytes, recv(zmq.NOBLOCK)]
        return [frame.bytes]

    return take


def held_receiver(socket: zmq.Socket) -> HeldReceiver | None:
    """A receiver of `socket` that keeps the GIL; None where libzmq cannot be reached this
    way (pyzmq's receive serves there)."""
    library = libzmq()
    return None if library is None else HeldReceiver(socket, library)


def batch_receiver(socket: zmq.Socket) -> ReceiveMany:
    """`ReceiveMany` on `socket`: one call to the C fast path (`_zmqbatch.c`, keeping the
    GIL: about 0.3 us a message); where it was not built, `pyzmq_receiver` per message
    (0.8-1 us)."""
    module = batch_module()
    if module is None:
        return python_batch_receiver(pyzmq_receiver(socket))
    receive = module.receive
    handle = socket.underlying

    def receive_many(limit: int) -> list[list[bytes]]:
        try:
            messages: list[list[bytes]] = receive(handle, limit)
        except OSError as error:
            raise zmq_error(error.errno) from None
        return messages

    return receive_many


def python_batch_receiver(take: Receive) -> ReceiveMany:
    """`ReceiveMany` through `take`, one call a message."""

    def receive_many(limit: int) -> list[list[bytes]]:
        messages: list[list[bytes]] = []
        try:
            while len(messages) < limit and (frames := take()) is not None:
                messages.append(frames)
        except zmq.ZMQError:
            if not messages:
                raise
            # As the C path: those received are returned, the next call raises.
        return messages

    return receive_many
