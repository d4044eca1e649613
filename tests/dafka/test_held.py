"""`held_send` and `held_recv`: libzmq's send and receive through ctypes, keeping the GIL,
run by the same tests as pyzmq's own (the producer actor sends both ways:
`publisher._HOLD_GIL_UP_TO`; the reader receives both ways: `held_recv.HELD_UP_TO`); and
the batches of records sent and messages received by the C fast path (`_zmqbatch.c`), run
by the same tests as the Python loops it replaces where it was not built."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator

import pytest
import zmq

from backends.dafka.held_recv import (
    Receive,
    ReceiveMany,
    batch_receiver,
    held_receiver,
    python_batch_receiver,
    pyzmq_receiver,
)
from backends.dafka.held_send import (
    Send,
    SendRecords,
    _zmq_send,
    batch_module,
    held_sender,
    libzmq,
    python_records_sender,
    records_sender,
)
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


# --- batches: the C fast path and the Python loops -----------------------------------------


def test_the_c_fast_path_is_built_on_linux() -> None:
    """Else the engine runs the Python loops, 3-4 times the CPU a record, and the tests
    below that name it fail: `pip install -e .` builds it with a C compiler (gcc)."""
    if sys.platform == "linux":
        assert batch_module() is not None, "backends.dafka._zmqbatch is not built"


def c_path() -> None:
    if batch_module() is None:
        pytest.fail("the C fast path is not built (see test_the_c_fast_path_is_built_on_linux)")


def c_records(hold_gil: bool) -> Callable[[zmq.Socket], SendRecords]:
    def sender(socket: zmq.Socket) -> SendRecords:
        c_path()
        return records_sender(socket, hold_gil)

    return sender


RECORD_SENDERS: dict[str, Callable[[zmq.Socket], SendRecords]] = {
    "c-keeping-the-gil": c_records(True),
    "c-giving-it-up": c_records(False),
    "python-held": lambda socket: python_records_sender(held_sender(socket)),
    "python-pyzmq": lambda socket: python_records_sender(socket.send),
}


@pytest.fixture(params=list(RECORD_SENDERS.values()), ids=list(RECORD_SENDERS))
def records_sender_of(request: pytest.FixtureRequest) -> Callable[[zmq.Socket], SendRecords]:
    sender: Callable[[zmq.Socket], SendRecords] = request.param
    return sender


def sequence_bytes(sequence: int) -> bytes:
    return sequence.to_bytes(8, "big")


def test_records_go_as_prefix_and_sequence_then_content_in_order(
    records_sender_of: Callable[[zmq.Socket], SendRecords], pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    send = records_sender_of(sending)
    # A long prefix with a NUL; sequences crossing a byte boundary and near 2**64.
    prefix = b"\0\xaa\xa5R" + b"p" * 600
    contents = [b"x" * n for n in range(300)]
    send(prefix, 2**40 - 5, contents)
    send(b"", 2**64 - 2, [b"last but one", b""])
    send(prefix, 7, [])
    expected = [[prefix + sequence_bytes(2**40 - 5 + n), c] for n, c in enumerate(contents)]
    expected += [[sequence_bytes(2**64 - 2), b"last but one"], [sequence_bytes(2**64 - 1), b""]]
    assert [receiving.recv_multipart() for _ in expected] == expected


def test_record_contents_other_than_bytes_are_sent_too(
    records_sender_of: Callable[[zmq.Socket], SendRecords], pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    contents = [b"bytes", bytearray(b"a bytearray"), memoryview(b"a memoryview")]
    records_sender_of(sending)(b"P", 1, contents)  # type: ignore[arg-type]
    got = [receiving.recv_multipart() for _ in contents]
    assert got == [[b"P" + sequence_bytes(n + 1), bytes(c)] for n, c in enumerate(contents)]


def test_a_record_send_that_fails_raises_as_pyzmq_does(
    records_sender_of: Callable[[zmq.Socket], SendRecords], context: zmq.Context
) -> None:
    """A SUB cannot send: libzmq's ENOTSUP, as zmq.ZMQError (the actor stops on it)."""
    sub = context.socket(zmq.SUB)
    with pytest.raises(zmq.ZMQError) as raised:
        records_sender_of(sub)(b"P", 0, [b"refused"])
    assert raised.value.errno == zmq.ENOTSUP


def c_receiver(socket: zmq.Socket) -> ReceiveMany:
    c_path()
    return batch_receiver(socket)


def python_held_receiver(socket: zmq.Socket) -> ReceiveMany:
    receiver = held_receiver(socket)
    assert receiver is not None
    return python_batch_receiver(receiver.take)


BATCH_RECEIVERS: dict[str, Callable[[zmq.Socket], ReceiveMany]] = {
    "c": c_receiver,
    "python-pyzmq": lambda socket: python_batch_receiver(pyzmq_receiver(socket)),
    "python-held": python_held_receiver,  # the reader's first batch without the C path
}


@pytest.fixture(params=list(BATCH_RECEIVERS.values()), ids=list(BATCH_RECEIVERS))
def batch_receiver_of(request: pytest.FixtureRequest) -> Callable[[zmq.Socket], ReceiveMany]:
    receiver: Callable[[zmq.Socket], ReceiveMany] = request.param
    return receiver


def receive_all(receive: ReceiveMany, count: int, limit: int) -> list[list[bytes]]:
    """`count` messages, `limit` at most per call, waiting (with a bound) for them."""
    got: list[list[bytes]] = []

    def more() -> bool:
        while batch := receive(limit):
            assert len(batch) <= limit
            got.extend(batch)
        return len(got) >= count

    wait_until(more, RECEIVE_S, f"{count} messages")
    return got


def test_batches_of_messages_arrive_whole_in_order_and_within_the_limit(
    batch_receiver_of: Callable[[zmq.Socket], ReceiveMany], pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    receive = batch_receiver_of(receiving)
    assert receive(10) == [], "nothing is waiting"
    messages = [[b"RECORD-%d" % n, b"x" * n] for n in range(300)]
    messages += [[b"HEAD"], [b"", b"\0\r\n"], [b"big", bytes(range(256)) * 4096], [b""]]
    for message in messages:
        sending.send_multipart(message)
    assert receive_all(receive, len(messages), 7) == messages
    assert receive(10) == [], "nothing more"


def test_a_batch_reads_frames_beyond_the_second_as_messages_of_their_own(
    batch_receiver_of: Callable[[zmq.Socket], ReceiveMany], pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    sending, receiving = pair
    sending.send_multipart([b"header", b"content", b"third", b"fourth", b"fifth"])
    sending.send_multipart([b"next"])
    got = receive_all(batch_receiver_of(receiving), 4, 100)
    assert got == [[b"header", b"content"], [b"third", b"fourth"], [b"fifth"], [b"next"]]


def test_a_batch_receive_that_fails_raises_as_pyzmq_does(
    batch_receiver_of: Callable[[zmq.Socket], ReceiveMany], context: zmq.Context
) -> None:
    """A PUB cannot receive: libzmq's ENOTSUP, as zmq.ZMQError."""
    pub = context.socket(zmq.PUB)
    with pytest.raises(zmq.ZMQError) as raised:
        batch_receiver_of(pub)(10)
    assert raised.value.errno == zmq.ENOTSUP


def test_a_python_batch_returns_what_it_received_before_a_failure() -> None:
    """As the C path: the messages received are returned, the failure comes next call
    (a fake `take`: a socket failing between two messages cannot be arranged)."""
    script: list[list[bytes] | Exception] = [[b"one"], [b"two"], zmq.ZMQError(zmq.ETERM)]

    def take() -> list[bytes] | None:
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    receive = python_batch_receiver(take)
    assert receive(10) == [[b"one"], [b"two"]]
    script.append(zmq.ZMQError(zmq.ETERM))
    with pytest.raises(zmq.ZMQError):
        receive(10)


def test_a_sequence_that_does_not_fit_eight_bytes_is_refused(
    records_sender_of: Callable[[zmq.Socket], SendRecords], pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    """Not wrapped around (struct.error from Python's pack, OverflowError from C)."""
    send = records_sender_of(pair[0])
    for sequence, contents in ((-1, [b"a"]), (2**64, [b"a"]), (2**64 - 1, [b"a", b"b"])):
        with pytest.raises((OverflowError, struct.error)):
            send(b"P", sequence, contents)
