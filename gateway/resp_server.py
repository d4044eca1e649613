"""The asyncio adapter moved to gateway.connection; this name stays for its importers."""

from gateway.connection import Server, start_server

__all__ = ["Server", "start_server"]
