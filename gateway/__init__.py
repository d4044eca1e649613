"""The RESP gateway of rafka: a Redis-protocol server in front of a streaming-log engine."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("rafka")
except metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
