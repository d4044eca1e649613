"""Who may use the gateway: the configured users and their passwords.

The default user (`AUTH pass`, `HELLO 3 AUTH default pass`) has `gateway.password` (or
`gateway.users.default`); other users are `gateway.users`. Authentication is required
once any password is configured; until then the default user accepts any password, as
Redis's password-less default user does, and no other user exists.

Passwords are compared as SHA-256 digests with hmac.compare_digest: the time taken says
nothing about the password, its length, or whether the user exists.
"""

from __future__ import annotations

import hashlib
import hmac

from gateway.config import Config

DEFAULT_USER = "default"

# What an unknown user's password is compared with, so that it takes as long as a known one.
_NOBODY = hashlib.sha256(b"\0no such user").digest()


def password_of(config: Config, user: str) -> str | None:
    """The user's password; None for a user that does not exist (or is disabled: the
    default user when only other users are configured)."""
    if user in config.users:
        return config.users[user]
    if user == DEFAULT_USER:
        return config.password
    return None


def known_user(config: Config, user: str) -> bool:
    return password_of(config, user) is not None


def check(config: Config, user: str, password: bytes) -> bool:
    """Whether `user` may log in with `password`."""
    if not config.auth_required:
        return user == DEFAULT_USER
    expected = password_of(config, user)
    wanted = _NOBODY if expected is None else hashlib.sha256(expected.encode()).digest()
    given = hashlib.sha256(password).digest()
    return hmac.compare_digest(given, wanted) and expected is not None
