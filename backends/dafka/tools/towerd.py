"""dafka-towerd: the Dafka tower (spec §6)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from backends.dafka.config import Config
from backends.dafka.tools import serve
from backends.dafka.tower import Tower

PROG = "dafka-towerd"


def _listening(tower: Tower, config: Config) -> str:
    return f"listening sub={','.join(tower.sub_endpoints)} pub={','.join(tower.pub_endpoints)}"


def main(argv: Sequence[str] | None = None) -> int:
    return serve(
        PROG,
        "Relay Dafka beacons so that nodes find each other.",
        argv,
        "tower",
        ["tower/verbose"],
        Tower,
        _listening,
        tower=True,
    )


if __name__ == "__main__":
    sys.exit(main())
