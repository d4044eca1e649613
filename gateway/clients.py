"""The ids of the live clients: what makes CLIENT SETNAME's ids unique.

The registry only knows ids and which connection holds each; a session asks it, so the
server context needs nothing of sessions (and sessions never edit its dictionaries).
"""

from __future__ import annotations


class ClientIds:
    """Client id -> the one live connection (any object, compared by identity) holding it."""

    def __init__(self) -> None:
        self._holders: dict[str, object] = {}

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._holders

    def add(self, client_id: str, holder: object) -> None:
        """Hold `client_id` unless someone already does (an unnamed client's address must
        not displace a client that SETNAMEd to the same text)."""
        self._holders.setdefault(client_id, holder)

    def release(self, client_id: str, holder: object) -> None:
        """Give up `client_id` if `holder` holds it; another holder keeps it."""
        if self._holders.get(client_id) is holder:
            del self._holders[client_id]
