"""`held_recv`: libzmq's receive through ctypes, keeping the GIL, run by the same tests as
pyzmq's own receive (the gateway's reader uses both: `held_recv.HELD_UP_TO`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
import zmq

from backends.dafka.held_recv import Receive, held_receiver, pyzmq_receiver
from backends.dafka.held_send import libzmq
from tests.support.waiting import wait_until

RECEIVE_S = 5.0

Receiver = Callable[[zmq.Socket], Receive]


def held(socket: zmq.Socket) -> Receive:
    receiver = held_receiver(socket)
    assert receiver is not None
    return receiver.take


RECEIVERS: dict[str, Receiver] = {"held": held, "pyzmq": pyzmq_receiver}


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A PAIR over TCP, as copies reach the reader: (sending end, receiving end)."""
    context = zmq.Context()
    sending, receiving = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    port = receiving.bind_to_random_port("tcp://127.0.0.1")
    sending.connect(f"tcp://127.0.0.1:{port}")
    yield sending, receiving
    context.destroy(linger=0)


def take_all(take: Receive, count: int) -> list[list[bytes]]:
    """`count` messages, waiting (with a bound) for them to arrive."""
    got: list[list[bytes]] = []

    def more() -> bool:
        while (frames := take()) is not None:
            got.append(frames)
        return len(got) >= count

    wait_until(more, RECEIVE_S, f"{count} messages")
    return got


def test_libzmq_is_reached_on_linux() -> None:
    """Else every test below would run pyzmq's receive twice, and the reader never keeps
    the GIL."""
    if sys.platform == "linux":
        assert libzmq() is not None, "libzmq not found in /proc/self/maps"


@pytest.mark.parametrize("receiver", RECEIVERS.values(), ids=RECEIVERS.keys())
def test_messages_of_one_and_two_frames_arrive_whole_and_in_order(
    receiver: Receiver, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    take = receiver(receiving)
    assert take() is None, "nothing is waiting"
    messages = [[b"RECORD-%d" % n, b"x" * n] for n in range(300)]
    messages += [[b"HEAD"], [b"", b"\0\r\n"], [b"big", bytes(range(256)) * 4096], [b""]]
    for message in messages:
        sending.send_multipart(message)
    assert take_all(take, len(messages)) == messages
    assert take() is None, "nothing more"


@pytest.mark.parametrize("receiver", RECEIVERS.values(), ids=RECEIVERS.keys())
def test_frames_beyond_the_second_are_read_as_messages_of_their_own(
    receiver: Receiver, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    sending.send_multipart([b"header", b"content", b"third", b"fourth", b"fifth"])
    sending.send_multipart([b"next"])
    got = take_all(receiver(receiving), 4)
    assert got == [[b"header", b"content"], [b"third", b"fourth"], [b"fifth"], [b"next"]]


def test_a_held_receiver_closes_once(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    sending, receiving = pair
    receiver = held_receiver(receiving)
    assert receiver is not None
    sending.send(b"kept until the next receive or close")
    assert take_all(receiver.take, 1) == [[b"kept until the next receive or close"]]
    receiver.close()
    receiver.close()
