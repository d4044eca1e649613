"""dafka-towerd: the Dafka tower (spec §6)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from backends.dafka.tools import configure_logging, load_config, parser, run, wait_for_signal
from backends.dafka.tower import Tower

PROG = "dafka-towerd"


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        args = parser(PROG, "Relay Dafka beacons so that nodes find each other.", True).parse_args(
            argv
        )
        configure_logging(args.verbose)
        config = load_config(args, "tower", ["tower/verbose"])
        with Tower(config) as tower:
            # One line on stderr so that supervisors (and tests) know we are listening.
            print(
                f"{PROG}: listening sub={','.join(tower.sub_endpoints)} "
                f"pub={','.join(tower.pub_endpoints)}",
                file=sys.stderr,
                flush=True,
            )
            wait_for_signal()
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
