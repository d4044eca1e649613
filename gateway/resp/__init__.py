"""Sans-IO RESP protocol: request bytes -> commands, reply values -> RESP2/RESP3 bytes.

No sockets and no asyncio here (modelled on h11): a parser is fed bytes and hands back
complete commands, an encoder turns reply values into bytes. Everything is testable with
byte strings alone.

- ``requests``: the grammar a request must follow and the pure-Python parser.
- ``inline``: inline (telnet) lines split into arguments, as Redis splits them.
- ``fastpath``: hiredis parsing the common case in front of the Python parser, and
  runs of one command read without it (in C, ``_repeat.c``, where it was built).
- ``replies``: the reply values and their encodings.
- ``errors``: the protocol errors, with their exact texts.
"""

from gateway.resp.errors import ProtocolError
from gateway.resp.fastpath import HiredisRequestParser, make_parser
from gateway.resp.inline import split_inline
from gateway.resp.replies import (
    NULL_ARRAY,
    Encoded,
    ErrorReply,
    Reply,
    SimpleString,
    encode,
    encode_into,
    encode_many,
)
from gateway.resp.requests import ParserLimits, PythonRequestParser, RequestParser

__all__ = [
    "NULL_ARRAY",
    "Encoded",
    "ErrorReply",
    "HiredisRequestParser",
    "ParserLimits",
    "ProtocolError",
    "PythonRequestParser",
    "Reply",
    "RequestParser",
    "SimpleString",
    "encode",
    "encode_into",
    "encode_many",
    "make_parser",
    "split_inline",
]
