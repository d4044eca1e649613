"""Where `rafka-topics` on Dafka connects (`admin.py`).

- joined (`dafka.tower_sub_address` / `tower_pub_address`): that network;
- else the gateway's data directory (`gateway.data_dir`): if a gateway runs there (its
  `rafka.lock` is held), its network, through the tower addresses the stores were given
  (`store-<i>/stored.cfg`); else the directory's own tower and stores, started for the
  duration of the command, as the gateway would start them.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from backends.base import AdminError, EngineError
from backends.dafka.config import Config, ConfigError
from backends.dafka.embedded import LOCK_FILE
from backends.dafka.engine import EmbeddedMode, JoinedNetwork, Network
from backends.dafka.settings import DafkaSettings


@dataclass(frozen=True, slots=True)
class Joined:
    """The network the admin works on."""

    network: Network
    started: bool  # started for this command: stop it at the end
    store_config: Config | None  # what the stores were given, if known


async def join(settings: DafkaSettings, data_dir: Path, timeout: float) -> Joined:
    """The network `settings` name, else the one of `data_dir` (see the module docstring);
    AdminError when there is none to reach."""
    if settings.joined:
        joined = JoinedNetwork(dataclasses.replace(settings, start_timeout=timeout))
        return Joined(joined, started=False, store_config=None)
    if not (data_dir / "store-0").is_dir():
        raise AdminError(
            f"{data_dir} is not the data directory of a rafka on the Dafka engine "
            "(no store-0 in it); give one (--data-dir), a Dafka network "
            "(--tower-sub, --tower-pub) or a Kafka cluster (--bootstrap-server)"
        )
    for _ in range(2):
        if _locked(data_dir):
            network = _RunningGateway(data_dir, settings, timeout)
            return Joined(network, started=False, store_config=_read_store_config(data_dir))
        stores = max(1, _store_dirs(data_dir))
        embedded = EmbeddedMode(
            dataclasses.replace(settings, stores=stores, start_timeout=timeout),
            str(data_dir),
            stop_timeout=10.0,
        )
        try:
            await embedded.start()
        except EngineError as error:
            if _locked(data_dir):  # a gateway started meanwhile: join it
                continue
            raise AdminError(str(error)) from None
        return Joined(embedded, started=True, store_config=_read_store_config(data_dir))
    raise AdminError(f"the Dafka data directory {data_dir} is changing hands; try again")


def _read_store_config(data_dir: Path) -> Config | None:
    try:
        return Config.load(data_dir / "store-0" / "stored.cfg")
    except (OSError, ConfigError):
        return None


class _RunningGateway(Network):
    """The network of a gateway that runs on the data directory (joined, starts nothing)."""

    def __init__(self, data_dir: Path, settings: DafkaSettings, timeout: float) -> None:
        try:
            first = Config.load(data_dir / "store-0" / "stored.cfg")
        except (OSError, ConfigError) as error:
            raise AdminError(f"cannot read the store settings in {data_dir}: {error}") from None
        sub, pub = first.get("beacon/sub_address"), first.get("beacon/pub_address")
        values = {
            "beacon/sub_address": sub,
            "beacon/pub_address": pub,
            "beacon/address": "127.0.0.1",
            "beacon/ready_timeout": str(int(timeout * 1000)),
        }
        actor = {k: v for k, v in settings.settings.items() if not k.startswith("store/")}
        self.config = Config({**actor, **values})
        # The stores of this run: those given the tower of this run (a directory may keep
        # more store-<i> from a run with more stores).
        self.stores = max(
            1,
            sum(
                1
                for index in range(_store_dirs(data_dir))
                if _tower_of(data_dir / f"store-{index}" / "stored.cfg") == sub
            ),
        )
        self._where = f"the Dafka network of the rafka running on {data_dir}"

    def where(self) -> str:
        return self._where


def _tower_of(path: Path) -> str | None:
    try:
        return Config.load(path).get("beacon/sub_address")
    except (OSError, ConfigError):
        return None


def _store_dirs(data_dir: Path) -> int:
    count = 0
    while (data_dir / f"store-{count}").is_dir():
        count += 1
    return count


def _locked(data_dir: Path) -> bool:
    """Whether a gateway holds the data directory (its lock file is flocked)."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise AdminError(f"cannot read {data_dir / LOCK_FILE}: {error.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise AdminError(f"cannot lock {data_dir / LOCK_FILE}: {error.strerror}") from None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
