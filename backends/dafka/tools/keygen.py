"""dafka-keygen: CURVE certificates for a Dafka network (see backends/dafka/security.py).

    dafka-keygen DIR NAME [NAME ...]

writes DIR/NAME.key (the public certificate: copy it into every node's
`curve/authorized_dir` for a client, or hand it out for the network's server key) and
DIR/NAME.key_secret (the secret one: `curve/server_cert` or `curve/client_cert`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import zmq.auth

from backends.dafka.tools import run

PROG = "dafka-keygen"


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
        parser.add_argument("directory", help="where to write the certificates")
        parser.add_argument("names", nargs="+", metavar="name", help="one key pair each")
        args = parser.parse_args(argv)
        directory = Path(args.directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in args.names:
            if (directory / f"{name}.key_secret").exists():
                raise ValueError(f"{directory / name}.key_secret exists: not overwritten")
            public, secret = zmq.auth.create_certificates(directory, name)
            print(f"{public}\n{secret}")
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
