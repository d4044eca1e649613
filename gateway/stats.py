"""What `HGETALL stats` shows: the engine's fixed counters (`backends.base.Stats`), the
gateway's own, of connections, then the counters added while running. `DEL stats` zeroes
every counter but not the gauges."""

from __future__ import annotations

import threading

from backends.base import Stats


class ServerStats:
    CONNECTIONS_TOTAL = "server.connections.total"
    # Gauges: describe the present, so DEL stats does not zero them.
    CONNECTIONS_CURRENT = "server.connections.current"

    COUNTERS: tuple[str, ...] = (CONNECTIONS_TOTAL,)
    GAUGES: tuple[str, ...] = (CONNECTIONS_CURRENT,)

    def __init__(self, engine: Stats) -> None:
        self.engine = engine
        # Written on the event loop; read from any thread (e.g. a metrics endpoint).
        self._lock = threading.Lock()
        self._values: dict[str, int] = dict.fromkeys(self.COUNTERS + self.GAUGES, 0)

    def connected(self) -> None:
        with self._lock:
            self._values[self.CONNECTIONS_TOTAL] += 1
            self._values[self.CONNECTIONS_CURRENT] += 1

    def disconnected(self) -> None:
        with self._lock:
            self._values[self.CONNECTIONS_CURRENT] -= 1

    def get(self, name: str) -> int:
        with self._lock:
            if name in self._values:
                return self._values[name]
        return self.engine.get(name)

    def snapshot(self) -> dict[str, int]:
        """Every counter and gauge: the engine's fixed ones (Rafka's three first), ours,
        then those added while running (HTTP push subscriptions': docs/gateway.md)."""
        with self._lock:
            own = dict(self._values)
        engine = list(self.engine.snapshot().items())
        fixed = len(self.engine.COUNTERS)  # first: add_counters appends
        return {**dict(engine[:fixed]), **own, **dict(engine[fixed:])}

    def reset(self) -> None:
        self.engine.reset()
        with self._lock:
            for name in self.COUNTERS:
                self._values[name] = 0
