"""Test certificates, made by trustme: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, and a second CA nobody trusts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA that signs the server's and the client's certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # A client certificate signed by a CA the server does not trust.
    stranger_cert: Path
    stranger_key: Path

    def server_flags(self, tls_port: int | str, auth_clients: str = "no") -> list[str]:
        """`rafka`'s flags for a TLS port with this server certificate."""
        return [
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(self.server_cert),
            "--tls-key-file",
            str(self.server_key),
            "--tls-auth-clients",
            auth_clients,
        ]


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca, stranger_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.rafka.test")
    stranger = stranger_ca.issue_cert("stranger.rafka.test")
    certs = Certs(
        *(
            directory / name
            for name in (
                "ca.pem",
                "server.pem",
                "server.key",
                "client.pem",
                "client.key",
                "stranger.pem",
                "stranger.key",
            )
        )
    )
    ca.cert_pem.write_to_path(str(certs.ca))
    for leaf, cert, key in (
        (server, certs.server_cert, certs.server_key),
        (client, certs.client_cert, certs.client_key),
        (stranger, certs.stranger_cert, certs.stranger_key),
    ):
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
    return certs
