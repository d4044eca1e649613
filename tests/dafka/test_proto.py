"""The Dafka codec against the bytes of spec §1.7, scenario 17 and 24, malformed input."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.proto import MalformedMessage, Message

P = "0123456789ABCDEF0123456789ABCDEF"
C = "FEDCBA9876543210FEDCBA9876543210"
R = "00112233445566778899AABBCCDDEEFF"
SEQ5 = b"\x00" * 7 + b"\x05"


def uuid_string(value: str) -> bytes:
    return b"\x20" + value.encode()


# --- spec §1.7 worked examples, byte for byte ----------------------------------------------

WORKED = [
    (
        Message(proto.RECORD, b"hello", address=P, subject="hello", sequence=5, content=b"HI"),
        [b"Mhello\x00\x01" + uuid_string(P) + b"\x05hello" + SEQ5, b"HI"],
        55,
    ),
    (
        Message(
            proto.DIRECT_RECORD, C.encode(), address=P, subject="hello", sequence=5, content=b"HI"
        ),
        [b"D" + C.encode() + b"\x00\x01" + uuid_string(P) + b"\x05hello" + SEQ5, b"HI"],
        82,
    ),
    (
        Message(proto.FETCH, P.encode(), address=C, subject="hello", sequence=5, count=99995),
        [
            b"F"
            + P.encode()
            + b"\x00\x01"
            + uuid_string(C)
            + b"\x05hello"
            + SEQ5
            + b"\x00\x01\x86\x9b"
        ],
        86,
    ),
    (
        Message(proto.ACK, P.encode(), subject="hello", sequence=5),
        [b"K" + P.encode() + b"\x00\x01\x05hello" + SEQ5],
        49,
    ),
    (
        Message(proto.HEAD, b"hello", address=P, subject="hello", sequence=5),
        [b"Hhello\x00\x01" + uuid_string(P) + b"\x05hello" + SEQ5],
        55,
    ),
    (
        Message(proto.DIRECT_HEAD, C.encode(), address=P, subject="hello", sequence=5),
        [b"E" + C.encode() + b"\x00\x01" + uuid_string(P) + b"\x05hello" + SEQ5],
        82,
    ),
    (
        Message(proto.GET_HEADS, b"hello", address=C),
        [b"Ghello\x00\x01" + uuid_string(C)],
        41,
    ),
    (
        Message(proto.CONSUMER_HELLO, R.encode(), address=C, subjects=["hello"]),
        [
            b"W"
            + R.encode()
            + b"\x00\x01"
            + uuid_string(C)
            + b"\x00\x00\x00\x01\x00\x00\x00\x05hello"
        ],
        81,
    ),
    (
        Message(proto.STORE_HELLO, C.encode(), address=R),
        [b"L" + C.encode() + b"\x00\x01" + uuid_string(R)],
        68,
    ),
]


@pytest.mark.parametrize(("msg", "frames", "size"), WORKED, ids=lambda v: getattr(v, "name", ""))
def test_worked_example_bytes(msg: Message, frames: list[bytes], size: int) -> None:
    encoded = proto.encode(msg)
    assert encoded == frames
    assert len(encoded[0]) == size
    assert proto.decode(frames) == msg


def test_ids_are_the_ascii_letters_of_the_c_code() -> None:
    ids = [proto.RECORD, proto.DIRECT_RECORD, proto.FETCH, proto.ACK, proto.HEAD]
    ids += [proto.DIRECT_HEAD, proto.GET_HEADS, proto.CONSUMER_HELLO, proto.STORE_HELLO]
    assert bytes(ids) == b"MDFKHEGWL"


# --- scenario 17: every type round-trips with the upstream selftest values -----------------

TEXT = "Life is short but Now lasts for ever"


def full_message(mid: int) -> Message:
    """Scenario 17's values, set only on the fields the type carries."""
    msg = Message(mid, b"Hello")
    if mid != proto.ACK:
        msg.address = TEXT
    if mid in (proto.RECORD, proto.DIRECT_RECORD, proto.FETCH, proto.ACK):
        msg.subject = TEXT
        msg.sequence = 123
    if mid in (proto.HEAD, proto.DIRECT_HEAD):
        msg.subject = TEXT
        msg.sequence = 123
    if mid == proto.FETCH:
        msg.count = 123
    if mid in (proto.RECORD, proto.DIRECT_RECORD):
        msg.content = b"Captcha Diem"
    if mid == proto.CONSUMER_HELLO:
        msg.subjects = ["Name: Brutus", "Age: 43"]
    return msg


@pytest.mark.parametrize("mid", list(proto.NAMES), ids=list(proto.NAMES.values()))
def test_scenario_17_every_type_round_trips(mid: int) -> None:
    msg = full_message(mid)
    for _ in range(2):  # upstream sends twice and decodes both copies
        frames = proto.encode(msg)
        assert frames[0].startswith(bytes((mid,)) + b"Hello\x00\x01")
        assert len(frames) == (2 if mid in (proto.RECORD, proto.DIRECT_RECORD) else 1)
        copy = proto.decode(frames)
        assert copy == msg
        assert copy.topic == b"Hello"
        assert copy.name == proto.NAMES[mid]


@pytest.mark.parametrize("mid", list(proto.NAMES), ids=list(proto.NAMES.values()))
def test_scenario_17_round_trips_through_zpl(mid: int) -> None:
    msg = full_message(mid)
    text = proto.message_to_config(msg).to_zpl()
    assert proto.message_from_config(Config.from_zpl(text)) == msg


# --- scenario 24: what the C code does and does not write ----------------------------------


def test_scenario_24_no_signature_nul_after_topic_version_1() -> None:
    frame1 = proto.encode(Message(proto.HEAD, b"t", address="a", subject="t", sequence=1))[0]
    assert not frame1.startswith(b"\xaa\xa5")
    assert frame1[:4] == b"Ht\x00\x01"


def test_scenario_24_ack_has_no_address() -> None:
    msg = Message(proto.ACK, P.encode(), address="IGNORED", subject="s", sequence=7)
    frame1 = proto.encode(msg)[0]
    assert b"IGNORED" not in frame1
    assert frame1 == b"K" + P.encode() + b"\x00\x01\x01s" + struct.pack(">Q", 7)
    assert proto.decode([frame1]).address == ""


def test_scenario_24_rejects_bad_version_unknown_id_missing_content() -> None:
    good = proto.encode(Message(proto.RECORD, b"t", address="a", subject="t", content=b"x"))
    with pytest.raises(MalformedMessage, match="version 2"):
        proto.decode([good[0].replace(b"t\x00\x01", b"t\x00\x02", 1), good[1]])
    with pytest.raises(MalformedMessage, match="unknown message id"):
        proto.decode([b"Z" + good[0][1:], good[1]])
    with pytest.raises(MalformedMessage, match="content frame"):
        proto.decode(good[:1])


def test_empty_content_and_empty_topic_are_valid() -> None:
    msg = Message(proto.RECORD, b"", address="a", subject="", sequence=0, content=b"")
    frames = proto.encode(msg)
    assert frames == [b"M\x00\x01\x01a\x00" + b"\x00" * 8, b""]
    assert proto.decode(frames) == msg


def test_trailing_bytes_are_ignored_as_in_c() -> None:
    frame1 = proto.encode(Message(proto.GET_HEADS, b"t", address=C))[0]
    assert proto.decode([frame1 + b"junk"]).address == C


def test_record_prefix_is_a_record_frame_up_to_its_sequence_when_that_ends_it() -> None:
    for mid, routing in ((proto.RECORD, "topic"), (proto.DIRECT_RECORD, C)):
        encoder = proto.RecordEncoder(routing, C, "topic", mid)
        frame1 = encoder.frame1(7)
        assert proto.record_prefix(frame1) == frame1[:-8] == encoder.frame1(8)[:-8]
        assert proto.record_prefix(frame1 + b"\x09") is None, "trailing bytes"
        assert proto.record_prefix(frame1[:-1]) is None, "a short sequence"
    head = proto.encode(Message(proto.HEAD, b"topic", address=C, subject="topic", sequence=7))
    assert proto.record_prefix(head[0]) is None, "not a record"
    for garbage in (b"", b"M", b"Mtopic", b"Mtopic\0", b"Mtopic\0\x02\x01a\x01b" + bytes(8)):
        assert proto.record_prefix(garbage) is None, garbage


def test_largest_numbers_and_utf8_text() -> None:
    msg = Message(
        proto.FETCH,
        "prüfung".encode(),
        address="é" * 127,
        subject="ß",
        sequence=2**64 - 1,
        count=2**32 - 1,
    )
    assert proto.decode(proto.encode(msg)) == msg


# --- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "no frames"),
        ([b""], "empty frame"),
        ([b"Mhello"], "no NUL"),
        ([b"Mhello\x00"], "version byte"),
        ([b"Ghello\x00\x01"], "address length"),
        ([b"Ghello\x00\x01\x20" + b"A" * 31], "address needs 32 bytes"),
        ([b"Hhello\x00\x01\x01a\x05hel"], "subject needs 5 bytes"),
        ([b"Hhello\x00\x01\x01a\x01h\x00\x00\x00"], "sequence needs 8 bytes"),
        ([b"Fp\x00\x01\x01a\x01h" + SEQ5 + b"\x00\x00"], "count needs 4 bytes"),
        ([b"Wr\x00\x01\x01a\x00\x00\x00\x02\x00\x00\x00\x01x"], "2 subjects cannot fit"),
        ([b"Wr\x00\x01\x01a\x00\x00\x00\x01\x00\x00\x00\x09abc"], "subject needs 9 bytes"),
        ([b"Lc\x00\x01\x02\xff\xfe"], "not valid UTF-8"),
    ],
)
def test_malformed_frames_raise(frames: list[bytes], reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason):
        proto.decode(frames)


def test_encode_refuses_what_c_could_not_carry() -> None:
    with pytest.raises(MalformedMessage, match="256 bytes long, the limit is 255"):
        proto.encode(Message(proto.STORE_HELLO, b"c", address="x" * 256))
    assert proto.decode(proto.encode(Message(proto.STORE_HELLO, b"c", address="x" * 255)))
    with pytest.raises(MalformedMessage, match="NUL"):
        proto.encode(Message(proto.HEAD, b"to\x00pic", address="a"))
    with pytest.raises(MalformedMessage, match="NUL"):
        proto.encode(Message(proto.HEAD, b"t", address="a\x00b"))
    with pytest.raises(MalformedMessage, match="unsigned 64-bit"):
        proto.encode(Message(proto.HEAD, b"t", address="a", sequence=-1))
    with pytest.raises(MalformedMessage, match="unsigned 32-bit"):
        proto.encode(Message(proto.FETCH, b"t", address="a", count=2**32))
    with pytest.raises(MalformedMessage, match="unknown message id"):
        proto.encode(Message(ord("Z"), b"t"))


# --- fast paths ------------------------------------------------------------------------------


def test_record_encoder_matches_encode() -> None:
    encoder = proto.RecordEncoder("hello", P, "hello")
    for seq in (0, 5, 2**64 - 1):
        expected = proto.encode(
            Message(proto.RECORD, b"hello", address=P, subject="hello", sequence=seq, content=b"x")
        )
        assert encoder.encode(seq, b"x") == expected
        assert encoder.frame1(seq) == expected[0]
    direct = proto.RecordEncoder(C.encode(), P, "hello", proto.DIRECT_RECORD)
    assert direct.encode(5, b"HI") == WORKED[1][1]
    with pytest.raises(MalformedMessage, match="RECORD or DIRECT_RECORD"):
        proto.RecordEncoder("t", P, "t", proto.HEAD)


def test_decode_record_fast_path() -> None:
    assert proto.decode_record(WORKED[0][1]) == (proto.RECORD, b"hello", P, "hello", 5, b"HI")
    assert proto.decode_record(WORKED[1][1])[:2] == (proto.DIRECT_RECORD, C.encode())
    utf8 = Message(proto.RECORD, b"t", address="ä", subject="ö", sequence=1, content=b"c")
    assert proto.decode_record(proto.encode(utf8)) == (proto.RECORD, b"t", "ä", "ö", 1, b"c")
    with pytest.raises(MalformedMessage, match="HEAD is not a record"):
        proto.decode_record(WORKED[4][1])
    with pytest.raises(MalformedMessage, match="content frame"):
        proto.decode_record(WORKED[0][1][:1])
    with pytest.raises(MalformedMessage, match="sequence needs 8 bytes"):
        proto.decode_record([WORKED[0][1][0][:-1], b"HI"])
    with pytest.raises(MalformedMessage, match="version 0"):
        proto.decode_record([b"Mt\x00\x00", b""])


@pytest.mark.parametrize(
    ("frame1", "reason"),
    [
        (b"Dt", "no NUL"),
        (b"Dt\x00", "version byte"),
        (b"Dt\x00\x01", "address length"),
        (b"Dt\x00\x01\x05ab", "address needs 5 bytes"),
        (b"Dt\x00\x01\x01a", "subject length"),
        (b"Dt\x00\x01\x01a\x01t" + SEQ5[:7], "sequence needs 8 bytes"),
        (b"Dt\x00\x01\x01\xff\x01t" + SEQ5, "address is not valid UTF-8"),
        (b"Mt\x00\x01\x01a\x01\xfe" + SEQ5, "subject is not valid UTF-8"),
    ],
)
def test_malformed_records_with_content_are_named_as_without_the_fast_path(
    frame1: bytes, reason: str
) -> None:
    """decode() reads a record in one go; what that cannot read goes field by field."""
    with pytest.raises(MalformedMessage, match=reason):
        proto.decode([frame1, b"content"])


def test_records_decode_alike_on_either_path() -> None:
    record = Message(proto.DIRECT_RECORD, b"t", address="ä", subject="ö", sequence=9, content=b"c")
    frames = proto.encode(record)
    assert proto.decode(frames) == record  # the fast path
    assert proto.decode([frames[0] + b"junk", frames[1]]) == record  # ignored, as in C
    views: list[Any] = [bytearray(frames[0]), memoryview(frames[1])]  # as libzmq's buffers
    assert proto.decode(views) == record  # field by field


def test_decode_ack_fast_path_reads_what_decode_reads_or_leaves_it_to_decode() -> None:
    ack = proto.encode(Message(proto.ACK, P.encode(), subject="hello", sequence=7))
    assert proto.decode_ack(ack) == (P.encode(), b"hello", 7)
    assert proto.decode_ack([ack[0] + b"trailing", b"more"]) == (P.encode(), b"hello", 7)
    assert proto.decode_ack(WORKED[0][1]) is None  # a RECORD
    malformed = [
        [ack[0][:-1]],  # the sequence cut short
        [ack[0].replace(b"\0\x01", b"\0\x02", 1)],  # another version
        [b"K" + P.encode()],  # no NUL
        [b"K" + P.encode() + b"\0"],  # nothing after the routing topic
        [b"K" + P.encode() + b"\0\x01"],  # no subject length
        [b"K" + P.encode() + b"\0\x01\xff" + b"x" * 20],  # subject longer than the frame
    ]
    for frames in malformed:
        assert proto.decode_ack(frames) is None, frames
        with pytest.raises(MalformedMessage):
            proto.decode(frames)


def test_subscription_and_xpub_events() -> None:
    assert proto.subscription(proto.RECORD, "hello") == b"Mhello"
    assert proto.subscription(proto.DIRECT_RECORD, C.encode()) == b"D" + C.encode()
    assert proto.subscription(proto.FETCH) == b"F"
    event = proto.decode_xpub_event(b"\x01L" + C.encode())
    assert event == proto.XpubEvent(True, proto.STORE_HELLO, C.encode())
    assert proto.decode_xpub_event(b"\x00Whello") == proto.XpubEvent(
        False, proto.CONSUMER_HELLO, b"hello"
    )
    assert proto.decode_xpub_event(b"\x01") is None  # the empty subscription
    assert proto.decode_xpub_event(b"") is None
    assert proto.decode_xpub_event(b"\x07Mx") is None
