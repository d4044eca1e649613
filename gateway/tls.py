"""The TLS listener's SSLContext, made from the files the configuration names.

Every problem with the files is a ConfigError naming the setting and the file, found at
start-up before the engine starts: missing or unreadable files, files that hold no
certificate or key, a key that does not match the certificate, an encrypted key (rafka
asks for no pass phrase).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from gateway.config import Config, ConfigError

# A client that connects to the TLS port must finish its handshake within this bound.
HANDSHAKE_TIMEOUT = 10.0

_VERIFY_MODES = {
    "yes": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "no": ssl.CERT_NONE,
}


def _readable(setting: str, path: str) -> None:
    file = Path(path)
    if not file.exists():
        raise ConfigError(f"{setting} {path}: no such file")
    if not file.is_file():
        raise ConfigError(f"{setting} {path}: not a file")
    if not os.access(file, os.R_OK):
        raise ConfigError(f"{setting} {path}: not readable (permission denied)")


def _no_pass_phrase() -> str:
    raise ConfigError("the key is encrypted (rafka reads unencrypted PEM keys only)")


def _reason(error: ssl.SSLError) -> str:
    return str(error.reason or error).replace("_", " ").lower()


def server_context(config: Config) -> ssl.SSLContext | None:
    """The context of the TLS listener; None when TLS is off."""
    if config.tls_port is None:
        return None
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_ca_cert_file
    assert cert is not None and key is not None  # Config checks both are set
    _readable("tls-cert-file", cert)
    _readable("tls-key-file", key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A TLS 1.2 client asking for handshake after handshake costs the server a handshake
    # each (OpenSSL 3 refuses them unless allowed; older ones did not).
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        context.load_cert_chain(cert, key, password=_no_pass_phrase)
    except ConfigError as error:
        raise ConfigError(f"tls-key-file {key}: {error}") from None
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"tls-key-file {key} does not match the certificate of tls-cert-file {cert}"
            ) from None
        raise ConfigError(
            f"tls-cert-file {cert} / tls-key-file {key}: not a PEM certificate and its "
            f"private key ({_reason(error)})"
        ) from None
    if ca:
        _readable("tls-ca-cert-file", ca)
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as error:
            raise ConfigError(
                f"tls-ca-cert-file {ca}: no PEM CA certificate in it ({_reason(error)})"
            ) from None
    context.verify_mode = _VERIFY_MODES[config.tls_auth_clients]
    return context
