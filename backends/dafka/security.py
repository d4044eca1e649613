"""Optional ZeroMQ CURVE between Python Dafka peers (tower, stores, gateways, tools).

Off by default, so that C peers (which know no CURVE) still interoperate. When on
(`curve/enabled = 1`), every Dafka socket of the node is encrypted and authenticated:

- every socket a node binds (its data PUB/XPUB, a tower's XSUB and XPUB) is a CURVE
  server with the *network's* key pair (`curve/server_cert`: a ZeroMQ secret certificate
  file, shared by every node of the network: whoever holds it can serve);
- every socket a node connects (its data SUBs, its beacon's two sockets) is a CURVE client
  with the node's own key pair (`curve/client_cert`) and the network's public key;
- a bound socket accepts only clients whose public certificate is in `curve/authorized_dir`
  (ZAP, one authenticator thread per ZeroMQ context): unknown keys are refused, so a node
  without an authorized key hears nothing and is heard by no one.

Keys are made with `dafka-keygen DIR NAME` (NAME.key, public; NAME.key_secret, secret).
A node with CURVE on and one with it off cannot talk to each other.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from backends.dafka.config import Config, ConfigError

ENABLED = "curve/enabled"
SERVER_CERT = "curve/server_cert"
CLIENT_CERT = "curve/client_cert"
AUTHORIZED_DIR = "curve/authorized_dir"


@dataclass(frozen=True)
class Curve:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    authorized_dir: str


_lock = threading.Lock()
_loaded: dict[tuple[str, str, str], Curve] = {}
_authenticators: dict[int, tuple[zmq.Context, ThreadAuthenticator, str]] = {}


def _secret_certificate(config: Config, key: str) -> tuple[bytes, bytes]:
    path = config.get(key)
    if not path:
        raise ConfigError(f"{key} is not set ({ENABLED} = 1 needs it)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{key}: cannot read the certificate {path}: {error}") from None
    if secret is None:
        raise ConfigError(f"{key}: {path} holds no secret key (use the .key_secret file)")
    return public, secret


def curve_of(config: Config) -> Curve | None:
    """The node's CURVE keys, or None when CURVE is off; raises ConfigError naming the
    setting when a file is missing or wrong."""
    if not config.get_bool(ENABLED):
        return None
    paths = (config.get(SERVER_CERT), config.get(CLIENT_CERT), config.get(AUTHORIZED_DIR))
    with _lock:
        known = _loaded.get(paths)
    if known is not None:
        return known
    server_public, server_secret = _secret_certificate(config, SERVER_CERT)
    client_public, client_secret = _secret_certificate(config, CLIENT_CERT)
    authorized = paths[2]
    if not authorized or not Path(authorized).is_dir():
        raise ConfigError(f"{AUTHORIZED_DIR}: {authorized!r} is not a directory of public keys")
    curve = Curve(server_public, server_secret, client_public, client_secret, authorized)
    with _lock:
        _loaded[paths] = curve
    return curve


def _authenticate(context: zmq.Context, curve: Curve) -> None:
    """One ZAP authenticator per context, following the node's authorized directory."""
    with _lock:
        entry = _authenticators.get(id(context))
        if entry is not None and entry[0] is context:
            if entry[2] != curve.authorized_dir:
                entry[1].configure_curve(domain="*", location=curve.authorized_dir)
                _authenticators[id(context)] = (context, entry[1], curve.authorized_dir)
            return
        authenticator = ThreadAuthenticator(context)
        authenticator.start()
        authenticator.configure_curve(domain="*", location=curve.authorized_dir)
        _authenticators[id(context)] = (context, authenticator, curve.authorized_dir)


def serve(sock: zmq.Socket, config: Config) -> None:
    """Make a socket the node binds a CURVE server (before it binds), when CURVE is on."""
    curve = curve_of(config)
    if curve is None:
        return
    _authenticate(sock.context, curve)
    sock.curve_secretkey = curve.server_secret
    sock.curve_publickey = curve.server_public
    sock.curve_server = True


def join(sock: zmq.Socket, config: Config) -> None:
    """Make a socket the node connects a CURVE client (before it connects), when on."""
    curve = curve_of(config)
    if curve is None:
        return
    sock.curve_serverkey = curve.server_public
    sock.curve_publickey = curve.client_public
    sock.curve_secretkey = curve.client_secret


@atexit.register
def _stop_authenticators() -> None:
    with _lock:
        entries = list(_authenticators.values())
        _authenticators.clear()
    for _, authenticator, _ in entries:
        authenticator.stop()
