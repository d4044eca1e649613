"""Byte-exact codec of the Dafka wire protocol (spec §1), as the C `dafka_proto` writes it.

A message is 1 or 2 ZeroMQ frames:

    frame 1: id(1) | routing topic | 0x00 | version 0x01 | body fields
    frame 2: content (RECORD and DIRECT_RECORD only)

There is no signature (zproto pubsub codec). Numbers are unsigned big-endian; `string` is a
1-byte length + bytes (max 255), `longstr` a 4-byte length + bytes, `strings` a 4-byte count
of longstrs. Text fields are `str` (UTF-8) here; the routing topic stays `bytes` because it
is what SUB sockets filter on.

`decode` is on the hot path of every actor: RECORD/DIRECT_RECORD take a short fast path,
and `RecordEncoder` pre-builds the constant part of a producer's frame 1.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.dafka.config import Config

RECORD = ord("M")
DIRECT_RECORD = ord("D")
FETCH = ord("F")
ACK = ord("K")
HEAD = ord("H")
DIRECT_HEAD = ord("E")
GET_HEADS = ord("G")
CONSUMER_HELLO = ord("W")
STORE_HELLO = ord("L")

VERSION = 1
MAX_STRING = 255

# A request for the heads of EVERY_SUBJECT (GET_HEADS with topic "", CONSUMER_HELLO with
# subjects [""]) is answered by our store readers with every DIRECT_HEAD and then one more:
# END_OF_HEADS, a DIRECT_HEAD of subject "" whose address is the reader's uuid and whose
# sequence counts the heads sent. Beyond C (whose stores send no mark, and whose peers
# never ask for every subject): an empty store answers too, so an asker can tell "this
# store holds nothing" from "this store's answer has not come yet".
EVERY_SUBJECT = ""


NAMES: dict[int, str] = {
    RECORD: "RECORD",
    DIRECT_RECORD: "DIRECT_RECORD",
    FETCH: "FETCH",
    ACK: "ACK",
    HEAD: "HEAD",
    DIRECT_HEAD: "DIRECT_HEAD",
    GET_HEADS: "GET_HEADS",
    CONSUMER_HELLO: "CONSUMER_HELLO",
    STORE_HELLO: "STORE_HELLO",
}

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK_ID = bytes((ACK,))
_MAX_U32 = 0xFFFFFFFF
_MAX_U64 = 0xFFFFFFFFFFFFFFFF
_WITH_CONTENT = frozenset((RECORD, DIRECT_RECORD))


class MalformedMessage(ValueError):
    """A frame list that is not a valid Dafka message, or a message that cannot be encoded."""


@dataclass(slots=True)
class Message:
    """One Dafka message; only the fields of its type (spec §1.3) are meaningful."""

    id: int
    topic: bytes = b""
    address: str = ""
    subject: str = ""
    sequence: int = 0
    count: int = 0
    subjects: list[str] = field(default_factory=list)
    content: bytes = b""

    @property
    def name(self) -> str:
        return NAMES.get(self.id, f"UNKNOWN({self.id})")


@dataclass(frozen=True, slots=True)
class XpubEvent:
    """A (un)subscription read from an XPUB socket: flag byte, then id byte, then the rest."""

    is_subscribe: bool
    id: int
    rest: bytes


def is_end_of_heads(msg: Message) -> bool:
    """The END_OF_HEADS mark of a store reader (see EVERY_SUBJECT)."""
    return msg.id == DIRECT_HEAD and msg.subject == EVERY_SUBJECT


# --- encoding ------------------------------------------------------------------------------


def _topic_bytes(topic: str | bytes) -> bytes:
    data = topic.encode() if isinstance(topic, str) else bytes(topic)
    if b"\0" in data:
        raise MalformedMessage(f"routing topic {data!r} contains a NUL byte")
    return data


def _string(value: str, name: str) -> bytes:
    data = value.encode()
    if len(data) > MAX_STRING:
        raise MalformedMessage(f"{name} is {len(data)} bytes long, the limit is {MAX_STRING}")
    if b"\0" in data:
        # C keeps these fields in C strings: a NUL would silently truncate them there.
        raise MalformedMessage(f"{name} {value!r} contains a NUL byte")
    return bytes((len(data),)) + data


def _longstr(value: str) -> bytes:
    data = value.encode()
    return _U32.pack(len(data)) + data


def _u64(value: int, name: str) -> bytes:
    if not 0 <= value <= _MAX_U64:
        raise MalformedMessage(f"{name} {value} does not fit in an unsigned 64-bit number")
    return _U64.pack(value)


def _u32(value: int, name: str) -> bytes:
    if not 0 <= value <= _MAX_U32:
        raise MalformedMessage(f"{name} {value} does not fit in an unsigned 32-bit number")
    return _U32.pack(value)


def _body(msg: Message) -> bytes:
    mid = msg.id
    if mid in (RECORD, DIRECT_RECORD, HEAD, DIRECT_HEAD):
        return (
            _string(msg.address, "address")
            + _string(msg.subject, "subject")
            + _u64(msg.sequence, "sequence")
        )
    if mid == FETCH:
        return (
            _string(msg.address, "address")
            + _string(msg.subject, "subject")
            + _u64(msg.sequence, "sequence")
            + _u32(msg.count, "count")
        )
    if mid == ACK:
        return _string(msg.subject, "subject") + _u64(msg.sequence, "sequence")
    if mid in (GET_HEADS, STORE_HELLO):
        return _string(msg.address, "address")
    if mid == CONSUMER_HELLO:
        parts = [_string(msg.address, "address"), _u32(len(msg.subjects), "subjects count")]
        parts.extend(_longstr(subject) for subject in msg.subjects)
        return b"".join(parts)
    raise MalformedMessage(f"unknown message id {mid!r}")


def encode(msg: Message) -> list[bytes]:
    """The frames of `msg`: [frame1] or [frame1, content] for RECORD/DIRECT_RECORD."""
    if not 0 <= msg.id <= 255:
        raise MalformedMessage(f"unknown message id {msg.id!r}")
    frame1 = bytes((msg.id,)) + _topic_bytes(msg.topic) + b"\0\x01" + _body(msg)
    if msg.id in _WITH_CONTENT:
        return [frame1, bytes(msg.content)]
    return [frame1]


class RecordEncoder:
    """Frames of RECORD (or DIRECT_RECORD) messages with fixed topic, address and subject.

    The producer sends millions of these: only the sequence changes, so frame 1 is a
    precomputed prefix plus 8 packed bytes.
    """

    __slots__ = ("_prefix",)

    def __init__(self, topic: str | bytes, address: str, subject: str, id: int = RECORD) -> None:
        if id not in _WITH_CONTENT:
            raise MalformedMessage(f"RecordEncoder needs RECORD or DIRECT_RECORD, not {id!r}")
        self._prefix = (
            bytes((id,))
            + _topic_bytes(topic)
            + b"\0\x01"
            + _string(address, "address")
            + _string(subject, "subject")
        )

    def frame1(self, sequence: int) -> bytes:
        return self._prefix + _U64.pack(sequence)

    def encode(self, sequence: int, content: bytes) -> list[bytes]:
        return [self._prefix + _U64.pack(sequence), content]


def subscription(id: int, topic: str | bytes = b"") -> bytes:
    """The SUB prefix for messages `id` with routing topic starting with `topic` (spec §1.4)."""
    return bytes((id,)) + (topic.encode() if isinstance(topic, str) else bytes(topic))


# --- decoding ------------------------------------------------------------------------------


class _Reader:
    """Cursor over frame 1's body; every overrun raises MalformedMessage."""

    __slots__ = ("data", "name", "pos")

    def __init__(self, data: bytes, pos: int, name: str) -> None:
        self.data = data
        self.pos = pos
        self.name = name

    def _take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise MalformedMessage(
                f"{self.name}: {what} needs {size} bytes at offset {self.pos}, "
                f"frame has {len(self.data)}"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def _text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"{self.name}: {what} is not valid UTF-8") from exc

    def string(self, what: str) -> str:
        size = self._take(1, f"{what} length")[0]
        return self._text(self._take(size, what), what)

    def longstr(self, what: str) -> str:
        (size,) = _U32.unpack(self._take(4, f"{what} length"))
        return self._text(self._take(size, what), what)

    def u32(self, what: str) -> int:
        return int(_U32.unpack(self._take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack(self._take(8, what))[0])


def _split_header(frame1: bytes) -> tuple[int, bytes, int]:
    """(id, routing topic, offset of the body) of frame 1, checking NUL and version."""
    if not frame1:
        raise MalformedMessage("empty frame")
    nul = frame1.find(b"\0", 1)
    if nul < 0:
        raise MalformedMessage("no NUL after the routing topic")
    if nul + 1 >= len(frame1):
        raise MalformedMessage("frame ends before the version byte")
    version = frame1[nul + 1]
    if version != VERSION:
        raise MalformedMessage(f"version {version} is not {VERSION}")
    mid = frame1[0]
    if mid not in NAMES:
        raise MalformedMessage(f"unknown message id {mid!r}")
    return mid, frame1[1:nul], nul + 2


def _record_fields(frames: Sequence[bytes]) -> tuple[int, bytes, str, str, int, bytes] | None:
    """(id, routing topic, address, subject, sequence, content) of a well-formed
    RECORD/DIRECT_RECORD, read in one go; None for anything else, which `decode()` then
    judges field by field (and names what is wrong)."""
    try:
        frame1 = frames[0]
        mid = frame1[0]
        nul = frame1.index(b"\0", 1)
        if mid not in _WITH_CONTENT or frame1[nul + 1] != VERSION:
            return None
        a_end = nul + 3 + frame1[nul + 2]
        s_end = a_end + 1 + frame1[a_end]
        if s_end + 8 > len(frame1):
            return None
        return (
            mid,
            frame1[1:nul],
            frame1[nul + 3 : a_end].decode(),
            frame1[a_end + 1 : s_end].decode(),
            _U64.unpack_from(frame1, s_end)[0],
            frames[1],
        )
    except (IndexError, ValueError):  # ValueError: no NUL, or not UTF-8
        return None


def record_prefix(frame1: bytes) -> bytes | None:
    """Frame 1 of a RECORD/DIRECT_RECORD up to its sequence, when the sequence ends the
    frame (no trailing bytes, which C ignores): the bytes every record of one partition,
    sent the same way, starts with, so that a reader can know the next ones by them
    instead of decoding each. None for any other frame."""
    try:
        nul = frame1.index(b"\0", 1)
        a_end = nul + 3 + frame1[nul + 2]
        s_end = a_end + 1 + frame1[a_end]
    except (IndexError, ValueError):  # ValueError: no NUL
        return None
    if frame1[0] not in _WITH_CONTENT or frame1[nul + 1] != VERSION or s_end + 8 != len(frame1):
        return None
    return frame1[:s_end]


def decode(frames: Sequence[bytes]) -> Message:
    """The message in `frames` (frame 1 and, for records, frame 2). Trailing bytes after the
    last field are ignored, as in C. Raises MalformedMessage on anything else."""
    if not frames:
        raise MalformedMessage("no frames")
    # Most messages a reader gets: the fast path is a quarter of the checks below (2.2 us).
    record = _record_fields(frames) if type(frames[0]) is bytes else None
    if record is not None:
        mid, topic, address, subject, sequence, content = record
        return Message(mid, topic, address, subject, sequence, 0, [], bytes(content))
    frame1 = bytes(frames[0])
    mid, topic, pos = _split_header(frame1)
    name = NAMES[mid]
    reader = _Reader(frame1, pos, name)
    msg = Message(mid, topic)
    if mid in (RECORD, DIRECT_RECORD, HEAD, DIRECT_HEAD, FETCH):
        msg.address = reader.string("address")
        msg.subject = reader.string("subject")
        msg.sequence = reader.u64("sequence")
        if mid == FETCH:
            msg.count = reader.u32("count")
        elif mid in _WITH_CONTENT:
            if len(frames) < 2:
                raise MalformedMessage(f"{name} without its content frame")
            msg.content = bytes(frames[1])
    elif mid == ACK:
        msg.subject = reader.string("subject")
        msg.sequence = reader.u64("sequence")
    elif mid in (GET_HEADS, STORE_HELLO):
        msg.address = reader.string("address")
    else:  # CONSUMER_HELLO
        msg.address = reader.string("address")
        count = reader.u32("subjects count")
        # Each entry needs at least 4 bytes: refuse absurd counts before looping.
        if count * 4 > len(frame1) - reader.pos:
            raise MalformedMessage(f"{name}: {count} subjects cannot fit in the frame")
        msg.subjects = [reader.longstr("subject") for _ in range(count)]
    return msg


def decode_ack(frames: Sequence[bytes]) -> tuple[bytes, bytes, int] | None:
    """Fast path for ACK: (routing topic, subject, sequence) of a well-formed ACK, the
    subject as bytes (not checked as UTF-8: compare it with the bytes of the subject you
    expect); None for anything else, which `decode()` then judges. A producer spread over
    many partitions gets about one ACK per record."""
    frame1 = frames[0]
    if frame1[:1] != _ACK_ID:
        return None
    nul = frame1.find(b"\0", 1)
    if nul < 0 or len(frame1) < nul + 3 or frame1[nul + 1] != VERSION:
        return None
    s_end = nul + 3 + frame1[nul + 2]
    if s_end + 8 > len(frame1):
        return None
    return frame1[1:nul], frame1[nul + 3 : s_end], _U64.unpack_from(frame1, s_end)[0]


def decode_record(frames: Sequence[bytes]) -> tuple[int, bytes, str, str, int, bytes]:
    """Fast path for RECORD/DIRECT_RECORD: (id, topic, address, subject, sequence, content).

    Raises MalformedMessage for any other message or a malformed one.
    """
    record = _record_fields(frames)
    if record is not None:
        return record
    # Not a well-formed record: the full decoder names the problem precisely.
    msg = decode(frames)
    if msg.id not in _WITH_CONTENT:
        raise MalformedMessage(f"{msg.name} is not a record")
    return msg.id, msg.topic, msg.address, msg.subject, msg.sequence, msg.content


def decode_xpub_event(frame: bytes) -> XpubEvent | None:
    """An XPUB (un)subscription event, or None for frames too short to name a message id
    (e.g. the empty subscription of a subscribe-everything SUB) or with an unknown flag."""
    if len(frame) < 2 or frame[0] > 1:
        return None
    return XpubEvent(frame[0] == 1, frame[1], bytes(frame[2:]))


# --- ZPL form (scenario 17: the C selftest also round-trips messages through zconfig) -------


def message_to_config(msg: Message) -> Config:
    """The message as a config tree under `dafka_proto/` (binary topic/content in hex)."""
    from backends.dafka.config import Config

    config = Config()
    config.set("dafka_proto/message", msg.name)
    config.set("dafka_proto/topic", msg.topic.hex())
    config.set("dafka_proto/address", msg.address)
    config.set("dafka_proto/subject", msg.subject)
    config.set("dafka_proto/sequence", msg.sequence)
    config.set("dafka_proto/count", msg.count)
    for index, subject in enumerate(msg.subjects):
        config.set(f"dafka_proto/subjects/{index:04d}", subject)
    config.set("dafka_proto/content", msg.content.hex())
    return config


def message_from_config(config: Config) -> Message:
    """The inverse of `message_to_config`; raises MalformedMessage on an unknown message."""
    by_name = {name: mid for mid, name in NAMES.items()}
    name = config.get("dafka_proto/message")
    if name not in by_name:
        raise MalformedMessage(f"unknown message name {name!r}")
    subjects: list[str] = []
    while config.has(f"dafka_proto/subjects/{len(subjects):04d}"):
        subjects.append(config.get(f"dafka_proto/subjects/{len(subjects):04d}"))
    try:
        return Message(
            by_name[name],
            bytes.fromhex(config.get("dafka_proto/topic")),
            address=config.get("dafka_proto/address"),
            subject=config.get("dafka_proto/subject"),
            sequence=config.get_int("dafka_proto/sequence"),
            count=config.get_int("dafka_proto/count"),
            subjects=subjects,
            content=bytes.fromhex(config.get("dafka_proto/content")),
        )
    except ValueError as exc:
        raise MalformedMessage(f"invalid {name} in config: {exc}") from exc
