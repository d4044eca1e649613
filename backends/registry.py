"""The engines a gateway can run on, by the name `gateway.engine` gives.

An entry names a module that is imported only when its engine is chosen, so that one
engine's libraries (librdkafka; ZeroMQ and RocksDB) are never loaded for another. The
module provides (see `EngineModule`):

- `parse_settings(document)`: the engine's settings from the whole configuration
  document, of which it reads only its own sections; raises EngineConfigError naming
  the key. The gateway keeps the result without looking into it.
- `create(settings, stats, options)`: a new engine, not started yet.
- `describe(settings)`: the settings for the start-up log line, secrets redacted.
- `make_admin(settings, options)`: topic administration (`rafka-topics`, the gateway's
  metrics), not connected yet. (Not `admin`: importing an engine's `admin` submodule
  rebinds that name in its package.)

Adding an engine is one entry in `ENGINES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from backends.base import (
    Admin,
    Engine,
    EngineConfigError,
    EngineFlag,
    EngineOptions,
    EngineSettings,
    Stats,
)


class EngineModule(Protocol):
    def parse_settings(self, document: Mapping[str, object]) -> EngineSettings: ...

    def create(self, settings: EngineSettings, stats: Stats, options: EngineOptions) -> Engine: ...

    def describe(self, settings: EngineSettings) -> dict[str, object]: ...

    def make_admin(self, settings: EngineSettings, options: EngineOptions) -> Admin: ...


@dataclass(frozen=True, slots=True)
class EngineEntry:
    name: str
    module: str  # the dotted name of the engine's EngineModule

    def load(self) -> EngineModule:
        return cast(EngineModule, importlib.import_module(self.module))

    def parse_settings(self, document: Mapping[str, object]) -> EngineSettings:
        return self.load().parse_settings(document)

    def create(self, settings: EngineSettings, stats: Stats, options: EngineOptions) -> Engine:
        return self.load().create(settings, stats, options)

    def describe(self, settings: EngineSettings) -> dict[str, object]:
        return self.load().describe(settings)

    def admin(self, settings: EngineSettings, options: EngineOptions) -> Admin:
        """Topic administration of this engine (`rafka-topics`); connects on first use."""
        return self.load().make_admin(settings, options)

    def sections(self) -> tuple[str, ...]:
        """The sections of a configuration document that only this engine reads."""
        return tuple(getattr(self.load(), "SECTIONS", ()))

    def flags(self) -> tuple[EngineFlag, ...]:
        """The flags the engine adds to `rafka` (a module's optional `FLAGS`)."""
        return tuple(getattr(self.load(), "FLAGS", ()))


ENGINES: dict[str, EngineEntry] = {
    entry.name: entry
    for entry in (EngineEntry("dafka", "backends.dafka"), EngineEntry("kafka", "backends.kafka"))
}
# `rafka` alone, with nothing else installed or running: the embedded Dafka network.
DEFAULT_ENGINE = "dafka"


def engine_for(document: Mapping[str, object]) -> str:
    """The engine of a document that names none (`gateway.engine`): the one whose
    sections it has, so that Rafka's own file (`general`, `consumer`, `producer`) keeps
    meaning Kafka; with none of them, the default."""
    claimed = [
        name for name, entry in ENGINES.items() if any(s in document for s in entry.sections())
    ]
    if len(claimed) > 1:
        raise EngineConfigError(
            f"the configuration has sections of several engines ({', '.join(claimed)}): "
            'say which one with "gateway": {"engine": ...}'
        )
    return claimed[0] if claimed else DEFAULT_ENGINE


def engine_entry(name: str) -> EngineEntry:
    """The entry of engine `name`; raises EngineConfigError listing the known ones."""
    entry = ENGINES.get(name)
    if entry is None:
        raise EngineConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
    return entry


if TYPE_CHECKING:
    import backends.dafka
    import backends.kafka

    # mypy checks here that each engine's module provides what an entry promises.
    _kafka: EngineModule = backends.kafka
    _dafka: EngineModule = backends.dafka
