"""`held_send` and `held_recv`: libzmq's send and receive through ctypes, keeping the GIL,
run by the same tests as pyzmq's own (the producer actor sends both ways:
`publisher._HOLD_GIL_UP_TO`; the reader receives both ways: `held_recv.HELD_UP_TO`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
import zmq

from backends.dafka.held_recv import Receive, held_receiver, pyzmq_receiver
from backends.dafka.held_send import Send, _zmq_send, held_sender, libzmq
from tests.support.waiting import wait_until

RECEIVE_MS = 5000
RECEIVE_S = RECEIVE_MS / 1000

Sender = Callable[[zmq.Socket], Send]
SENDERS: dict[str, Sender] = {"held": held_sender, "pyzmq": lambda socket: socket.send}


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def pair(context: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    """A PAIR over TCP, as the actor's PUB reaches stores and copies reach the reader:
    (sending end, receiving end)."""
    sending, receiving = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    receiving.rcvtimeo = RECEIVE_MS
    port = receiving.bind_to_random_port("tcp://127.0.0.1")
    sending.connect(f"tcp://127.0.0.1:{port}")
    return sending, receiving


@pytest.fixture(params=list(SENDERS.values()), ids=list(SENDERS))
def send(request: pytest.FixtureRequest, pair: tuple[zmq.Socket, zmq.Socket]) -> Send:
    """Each sender on the pair's sending end."""
    sender: Sender = request.param
    return sender(pair[0])


def test_libzmq_is_reached_on_linux() -> None:
    """Else every test below would run pyzmq's calls twice, and neither the actor nor the
    reader ever keeps the GIL."""
    if sys.platform == "linux":
        assert libzmq() is not None, "libzmq not found in /proc/self/maps"
        assert _zmq_send() is not None


def test_multipart_messages_arrive_whole_and_in_order(
    send: Send, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    receiving = pair[1]
    messages = [[b"RECORD-%d" % n, b"x" * n] for n in range(300)] + [[b"", b"\0\r\n"]]
    for header, content in messages:
        send(header, zmq.SNDMORE)
        send(content)
    got = [receiving.recv_multipart() for _ in messages]
    assert got == messages


def test_buffers_other_than_bytes_are_sent_too(
    send: Send, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    receiving = pair[1]
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


# --- receiving ---------------------------------------------------------------------------

Receiver = Callable[[zmq.Socket], Receive]


def held(socket: zmq.Socket) -> Receive:
    receiver = held_receiver(socket)
    assert receiver is not None
    return receiver.take


RECEIVERS: dict[str, Receiver] = {"held": held, "pyzmq": pyzmq_receiver}


@pytest.fixture(params=list(RECEIVERS.values()), ids=list(RECEIVERS))
def take(request: pytest.FixtureRequest, pair: tuple[zmq.Socket, zmq.Socket]) -> Receive:
    """Each receiver on the pair's receiving end."""
    receiver: Receiver = request.param
    return receiver(pair[1])


def take_all(take: Receive, count: int) -> list[list[bytes]]:
    """`count` messages, waiting (with a bound) for them to arrive."""
    got: list[list[bytes]] = []

    def more() -> bool:
        while (frames := take()) is not None:
            got.append(frames)
        return len(got) >= count

    wait_until(more, RECEIVE_S, f"{count} messages")
    return got


def test_messages_of_one_and_two_frames_arrive_whole_and_in_order(
    take: Receive, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending = pair[0]
    assert take() is None, "nothing is waiting"
    messages = [[b"RECORD-%d" % n, b"x" * n] for n in range(300)]
    messages += [[b"HEAD"], [b"", b"\0\r\n"], [b"big", bytes(range(256)) * 4096], [b""]]
    for message in messages:
        sending.send_multipart(message)
    assert take_all(take, len(messages)) == messages
    assert take() is None, "nothing more"


def test_frames_beyond_the_second_are_read_as_messages_of_their_own(
    take: Receive, pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending = pair[0]
    sending.send_multipart([b"header", b"content", b"third", b"fourth", b"fifth"])
    sending.send_multipart([b"next"])
    got = take_all(take, 4)
    assert got == [[b"header", b"content"], [b"third", b"fourth"], [b"fifth"], [b"next"]]


def test_a_held_receiver_closes_once(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    sending, receiving = pair
    receiver = held_receiver(receiving)
    assert receiver is not None
    sending.send(b"kept until the next receive or close")
    assert take_all(receiver.take, 1) == [[b"kept until the next receive or close"]]
    receiver.close()
    receiver.close()
