"""`held_send`: libzmq's send through ctypes, keeping the GIL, run by the same tests as
pyzmq's own send (the producer actor uses both: `publisher._HOLD_GIL_UP_TO`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
import zmq

from backends.dafka.held_send import Send, _zmq_send, held_sender

RECEIVE_MS = 5000

Sender = Callable[[zmq.Socket], Send]
SENDERS: dict[str, Sender] = {"held": held_sender, "pyzmq": lambda socket: socket.send}


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def pair(context: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    """A PAIR over TCP, as the actor's PUB reaches stores: (sending end, receiving end)."""
    sending, receiving = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    receiving.rcvtimeo = RECEIVE_MS
    port = receiving.bind_to_random_port("tcp://127.0.0.1")
    sending.connect(f"tcp://127.0.0.1:{port}")
    return sending, receiving


def test_libzmq_is_reached_on_linux() -> None:
    """Else every test below would run pyzmq's send twice, and the actor never keeps the GIL."""
    if sys.platform == "linux":
        assert _zmq_send() is not None, "libzmq not found in /proc/self/maps"


@pytest.mark.parametrize("sender", SENDERS.values(), ids=SENDERS.keys())
def test_multipart_messages_arrive_whole_and_in_order(
    sender: Sender, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    send = sender(sending)
    messages = [[b"RECORD-%d" % n, b"x" * n] for n in range(300)] + [[b"", b"\0\r\n"]]
    for header, content in messages:
        send(header, zmq.SNDMORE)
        send(content)
    got = [receiving.recv_multipart() for _ in messages]
    assert got == messages


@pytest.mark.parametrize("sender", SENDERS.values(), ids=SENDERS.keys())
def test_buffers_other_than_bytes_are_sent_too(
    sender: Sender, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    send = sender(sending)
    send(memoryview(b"from a memoryview"), zmq.SNDMORE)  # type: ignore[arg-type]
    send(bytearray(b"from a bytearray"))  # type: ignore[arg-type]
    assert receiving.recv_multipart() == [b"from a memoryview", b"from a bytearray"]


@pytest.mark.parametrize("sender", SENDERS.values(), ids=SENDERS.keys())
def test_a_send_that_would_block_raises_again(sender: Sender, context: zmq.Context) -> None:
    """NOBLOCK on a socket with no peer: zmq.Again, as pyzmq raises it (the actor's wake-up
    pipe relies on it)."""
    lonely = context.socket(zmq.PAIR)
    lonely.bind("inproc://nobody-connects")
    with pytest.raises(zmq.Again):
        sender(lonely)(b"wake", zmq.NOBLOCK)
