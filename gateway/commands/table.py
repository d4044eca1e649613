"""The command table: upper-cased name -> CommandSpec."""

from __future__ import annotations

from gateway.commands import admin, connection, consume, introspection, produce
from gateway.commands.base import Argument, CommandSpec, Reply
from gateway.session import Session


def command(session: Session, args: list[bytes]) -> Reply:
    """COMMAND describes this table, which is complete by the time a client asks."""
    return introspection.describe(COMMANDS, args)


_SPECS = (
    CommandSpec(
        "BLPOP",
        consume.blpop,
        -2,
        ("write", "blocking"),
        "Consume one record: BLPOP topics:<t1,t2>[:<json config>] <timeout seconds>",
        "list",
        (Argument("key", "key"), Argument("timeout", "double", optional=True)),
        first_key=1,
        last_key=1,
        key_step=1,
    ),
    CommandSpec(
        "RPUSH",
        consume.rpush,
        -2,
        ("write", "fast"),
        "Acknowledge records: RPUSH acks <topic>:<partition>:<offset> [...]",
        "list",
        (Argument("key", "key"), Argument("ack", multiple=True)),
        first_key=1,
        last_key=1,
        key_step=1,
    ),
    CommandSpec(
        "RPUSHX",
        produce.rpushx,
        -3,
        ("write", "fast"),
        "Produce: RPUSHX topics:<topic>[:<partition key>] <message> [<message> ...]",
        "list",
        (Argument("key", "key"), Argument("message", multiple=True)),
        first_key=1,
        last_key=1,
        key_step=1,
    ),
    CommandSpec(
        "DUMP",
        produce.dump,
        -1,
        ("write",),
        "Wait up to <timeout ms> for this connection's records; reply how many are left",
        "generic",
        (Argument("timeout-ms", "integer"),),
    ),
    CommandSpec(
        "HGETALL",
        admin.hgetall,
        2,
        ("readonly",),
        "Read the server statistics: HGETALL stats",
        "hash",
        (Argument("key", "key"),),
        first_key=1,
        last_key=1,
        key_step=1,
    ),
    CommandSpec(
        "DEL",
        admin.del_,
        -2,
        ("write",),
        "Reset the server statistics: DEL stats",
        "generic",
        (Argument("key", "key"),),
        first_key=1,
        last_key=1,
        key_step=1,
    ),
    CommandSpec(
        "KEYS",
        admin.keys,
        2,
        ("readonly",),
        "List the topics: KEYS topics:",
        "generic",
        (Argument("pattern", "pattern"),),
    ),
    CommandSpec(
        "MONITOR",
        admin.monitor,
        1,
        ("admin", "noscript"),
        "Stream every command the server receives",
        "server",
    ),
    CommandSpec(
        "PING",
        connection.ping,
        -1,
        ("fast",),
        "Answer PONG",
        "connection",
        (Argument("message", optional=True),),
    ),
    CommandSpec(
        "QUIT",
        connection.quit_,
        -1,
        ("fast", "no_auth"),
        "Close the connection",
        "connection",
        no_auth=True,
    ),
    CommandSpec(
        "CLIENT",
        connection.client,
        -2,
        ("fast",),
        "CLIENT SETNAME <group>:<name> | GETNAME | ID | SETINFO <attr> <value>",
        "connection",
        (Argument("subcommand"), Argument("arg", optional=True, multiple=True)),
    ),
    CommandSpec(
        "HELLO",
        connection.hello,
        -1,
        ("fast", "no_auth"),
        "Handshake: HELLO [2|3 [AUTH <user> <password>] [SETNAME <group>:<name>]]",
        "connection",
        (
            Argument("protover", "integer", optional=True),
            Argument(
                "username-password",
                "block",
                optional=True,
                token="AUTH",
                arguments=(Argument("username"), Argument("password")),
            ),
            Argument("clientname", optional=True, token="SETNAME"),
        ),
        no_auth=True,
    ),
    CommandSpec(
        "AUTH",
        connection.auth,
        -2,
        ("fast", "no_auth"),
        "Authenticate with the configured password",
        "connection",
        (Argument("username", optional=True), Argument("password")),
        no_auth=True,
    ),
    CommandSpec(
        "SELECT",
        connection.select,
        2,
        ("fast",),
        "Select database 0 (the only one)",
        "connection",
        (Argument("index", "integer"),),
    ),
    CommandSpec(
        "COMMAND",
        command,
        -1,
        ("loading", "stale"),
        "Describe the commands: COMMAND [COUNT | INFO [name ...] | DOCS [name ...]]",
        "server",
        (Argument("subcommand", optional=True), Argument("name", optional=True, multiple=True)),
    ),
)

COMMANDS: dict[bytes, CommandSpec] = {spec.name.encode(): spec for spec in _SPECS}
