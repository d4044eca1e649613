"""The errors of a request that breaks the protocol, with their exact texts.

gateway/resp/requests.py says which bytes raise which text; the server answers the text
as an error reply and closes the connection.
"""

from __future__ import annotations

from typing import Final

# The exact error texts (go-redisproto's, plus Redis's for unbalanced quotes).
EXPECT_NUMBER: Final = "Expect Number"
EXPECT_NEWLINE: Final = "Expect Newline"
EXPECT_TYPECHAR: Final = "Expect TypeChar"
TOO_MANY_ARG: Final = "TooManyArg"
INVALID_BULK_SIZE: Final = "Invalid bulk size"
LINE_TOO_LONG: Final = "LineTooLong"
UNBALANCED_QUOTES: Final = "ERR Protocol error: unbalanced quotes in request"


class ProtocolError(Exception):
    """A request that breaks the protocol. ``str(e)`` is the exact RESP error text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text
