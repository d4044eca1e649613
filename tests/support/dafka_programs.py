"""The Dafka programs (dafka-towerd, dafka-stored, ...) as real processes on loopback
(end-to-end tests, benchmarks)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from backends.process import spawn
from tests.support.rafka_process import CHILD_ENV

BIN = Path(sys.executable).parent  # the venv's programs


def zpl(
    tower_sub: int,
    tower_pub: int,
    db: Path | None = None,
    *,
    towers: list[tuple[int, int]] | None = None,
) -> str:
    """A ZPL config on loopback only: nothing ever connects to another interface.
    `towers`: the (sub, pub) ports the beacon uses, when not just this config's tower."""
    beacon_towers = towers or [(tower_sub, tower_pub)]
    subs = ",".join(f"tcp://127.0.0.1:{sub}" for sub, _ in beacon_towers)
    pubs = ",".join(f"tcp://127.0.0.1:{pub}" for _, pub in beacon_towers)
    text = (
        "beacon\n"
        "    interval = 100\n"
        "    timeout = 2000\n"
        f"    sub_address = {subs}\n"
        f"    pub_address = {pubs}\n"
        "    address = 127.0.0.1\n"
        "tower\n"
        f"    sub_address = tcp://127.0.0.1:{tower_sub}\n"
        f"    pub_address = tcp://127.0.0.1:{tower_pub}\n"
        "producer\n"
        "    head_interval = 100\n"
    )
    if db is not None:
        text += f"store\n    db = {db}\n"
    return text


class Program:
    """A Dafka program (dies with the test run); all its output lines are kept."""

    def __init__(self, *args: str, stdin: bool = False) -> None:
        self.args = args
        self.child = spawn(
            [str(BIN / args[0]), *args[1:]],
            stdin=stdin,
            env=CHILD_ENV,
            keep_lines=None,
        )

    @property
    def lines(self) -> list[str]:
        """What it printed on stdout so far."""
        return self.child.stdout_lines

    def write_lines(self, lines: list[str]) -> None:
        self.child.write("".join(f"{line}\n" for line in lines).encode())

    def close_stdin(self) -> None:
        self.child.close_stdin()

    def wait_exit(self, timeout: float) -> int:
        return self.child.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if sig == signal.SIGKILL:
            self.child.kill()
        self.child.stop(15)

    def stderr(self) -> str:
        """What the program logged so far (for failure messages)."""
        return "\n".join(self.child.stderr_lines) or "(nothing on stderr)"
