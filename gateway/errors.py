"""Every error text the gateway sends, byte for byte (spec §3 plus the Redis texts we add).

A handler raises `RespError`; the server turns it into `-<text>\\r\\n`. Rafka's own texts
carry a `CONS ` (consumer path), `PROD ` (producer path) or `ERR ` prefix, and none for
unsupported commands; the Redis texts we added for HELLO/AUTH/SELECT are Redis's own.
`from_engine` is the one table from an engine's errors to these texts.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.base import (
    AckError,
    ConsumeError,
    EngineError,
    MetadataClientError,
    MetadataError,
    ProduceError,
    ProducerCreationError,
)


class RespError(Exception):
    """An error reply; `text` is exactly what follows the `-` on the wire."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def cons(text: str) -> RespError:
    """A consumer-path error (`CONS ` prefix; rafka-rb raises ConsumeError)."""
    return RespError(f"CONS {text}")


def prod(text: str) -> RespError:
    """A producer-path error (`PROD ` prefix; rafka-rb raises ProduceError)."""
    return RespError(f"PROD {text}")


def err(text: str) -> RespError:
    """A generic error (`ERR ` prefix)."""
    return RespError(f"ERR {text}")


# --- CLIENT SETNAME (#1-#3) -------------------------------------------------------------


def id_taken(new_id: str) -> RespError:
    return cons(f"id {new_id} is already taken")


def id_already_set(current_id: str) -> RespError:
    return cons(f"Client ID is already set to {current_id}")


def cannot_parse_group() -> RespError:
    return cons("Cannot parse group.id")


# --- BLPOP (#4-#10) -----------------------------------------------------------------------


def cannot_parse_topics(key: str) -> RespError:
    return cons(f"Cannot parse topics from `{key}`")


def bad_consumer_config(raw_json: str, detail: str) -> RespError:
    return cons(f"Error parsing configuration from '{raw_json}'; {detail}")


def server_shutdown() -> RespError:
    return cons("Server shutdown")


def not_ready() -> RespError:
    return cons("Connection not ready. Identify yourself using `CLIENT SETNAME` first")


def consumer_registration_failed(consumer_id: str, client_id: str) -> RespError:
    return cons(f"Failed to register Consumer '{consumer_id}' for Client '{client_id}'")


def consumer_exclusive(client_id: str, existing_id: str, new_id: str) -> RespError:
    return cons(
        f"Client '{client_id}' has Consumer '{existing_id}' registered (new consID: '{new_id}')"
    )


def poll_failed(cause: str) -> RespError:
    return cons(f"Poll {cause}")


def timeout_negative() -> RespError:
    # Redis's text for a negative BLPOP timeout (Rafka crashed instead).
    return err("timeout is negative")


# --- BLMPOP (Redis's texts for its syntax; one of ours for RIGHT) -------------------------


def timeout_not_a_float() -> RespError:
    return err("timeout is not a float or out of range")


def numkeys_not_positive() -> RespError:
    return err("numkeys should be greater than 0")


def count_not_positive() -> RespError:
    return err("count should be greater than 0")


def syntax_error() -> RespError:
    return err("syntax error")


def blmpop_right() -> RespError:
    # A log is consumed from its oldest record: there is no RIGHT end to pop from.
    return cons("BLMPOP consumes from the LEFT only")


# --- RPUSH acks (#11-#16) -----------------------------------------------------------------


def rpush_only_acks() -> RespError:
    return cons("You can only RPUSH to the 'acks' key")


def cannot_parse_ack(ack: str) -> RespError:
    return cons(f"Cannot parse ack: '{ack}'")


def parse_int_failed(message: str) -> RespError:
    """`message` is Go's strconv.ParseInt error text (see gateway.goparse)."""
    return cons(message)


def no_consumer(client_id: str) -> RespError:
    return cons(f"No consumer registered for Client {client_id}")


def negative_offset(position: int) -> RespError:
    return cons(f"offset cannot be negative, got {position}")


def ack_refused(cause: str) -> RespError:
    return cons(cause)


# --- RPUSHX / DUMP (#17-#22) --------------------------------------------------------------


def rpushx_arity(count: int) -> RespError:
    return prod(f"RPUSHX accepts 2 arguments, got {count}")


def invalid_topic() -> RespError:
    return prod("Broker: Invalid topic")


def rpushx_form() -> RespError:
    return prod("First argument must be in the form of 'topics:<topic>' or 'topics:<topic>:<key>'")


def producer_spawn_failed(cause: str) -> RespError:
    return prod(f"Error spawning producer: {cause}")


def produce_refused(cause: str) -> RespError:
    return prod(cause)


def dump_arity(count: int) -> RespError:
    return prod(f"DUMP accepts 1 argument, got {count}")


def dump_nan() -> RespError:
    return prod("NaN")


# --- HGETALL / DEL / KEYS / MONITOR (#23-#27) ---------------------------------------------


def expected_stats_key(key: str) -> RespError:
    return err(f"Expected key to be 'stats', got {key}")


def expected_topics_argument(arg: str) -> RespError:
    return err(f"Expected argument to be 'topics:', got {arg}")


def metadata_client_failed(cause: str) -> RespError:
    return err(f"Error spawning producer: {cause}")


def metadata_failed(cause: str) -> RespError:
    return err(f"Error getting metadata: {cause}")


def monitor_arguments() -> RespError:
    return err("command 'monitor' does not accept any extra arguments")


# --- LLEN / LRANGE (reads by offset; not in Rafka) -------------------------------------------


def read_key_form(key: str) -> RespError:
    return err(f"key must be in the form of 'topics:<topic>:<partition>', got '{key}'")


def read_partition(partition: str) -> RespError:
    return err(f"partition must be an integer from 0 to 2147483647, got '{partition}'")


def unknown_partition(topic: str, partition: int) -> RespError:
    return err(f"unknown topic or partition {topic}:{partition}")


def range_over_limit(count: int, limit: int) -> RespError:
    return err(f"range of {count} records is over the limit of {limit} (gateway.max_range)")


def range_not_held(topic: str, partition: int, start: int, stop: int, first: int) -> RespError:
    return err(
        f"offsets {start} to {stop} of {topic}:{partition} are no longer held, "
        f"the first held offset is {first}"
    )


def read_failed(cause: str) -> RespError:
    return err(f"read failed: {cause}")


# --- Unsupported (#28) --------------------------------------------------------------------


def not_supported(command: str) -> RespError:
    # No prefix, and a trailing space when the command is empty (`*0`), as in Rafka.
    return RespError(f"Command not supported: {command}")


# --- Redis texts for the commands Rafka lacked --------------------------------------------


def noauth() -> RespError:
    return RespError("NOAUTH Authentication required.")


def hello_noauth() -> RespError:
    return RespError(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
        "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
        "select the RESP protocol version at the same time"
    )


def unauthenticated_request_too_large(limit: int) -> RespError:
    # Redis refuses a large request before AUTH too ("Protocol error: unauthenticated
    # bulk length" / "multibulk length"); we bound the bytes of one unfinished request.
    return err(
        f"Protocol error: unauthenticated request larger than {limit} bytes, closing the connection"
    )


def wrongpass() -> RespError:
    return RespError("WRONGPASS invalid username-password pair or user is disabled.")


def auth_not_configured() -> RespError:
    return err(
        "AUTH <password> called without any password configured for the default user. "
        "Are you sure your configuration is correct?"
    )


def noproto() -> RespError:
    return RespError("NOPROTO unsupported protocol version")


def protocol_not_integer() -> RespError:
    return err("Protocol version is not an integer or out of range")


def hello_syntax(option: str) -> RespError:
    return err(f"Syntax error in HELLO option '{option}'")


def wrong_arity(command: str) -> RespError:
    return err(f"wrong number of arguments for '{command.lower()}' command")


def not_an_integer() -> RespError:
    return err("value is not an integer or out of range")


def db_out_of_range() -> RespError:
    return err("DB index is out of range")


def unknown_subcommand(subcommand: str, command: str) -> RespError:
    return err(f"unknown subcommand '{subcommand}'. Try {command.upper()} HELP.")


def max_clients_reached() -> RespError:
    return err("max number of clients reached")


def partial_command_timeout(seconds: float) -> RespError:
    return err(
        f"command not received in full within {seconds:g} seconds "
        "(gateway.partial_command_timeout), closing the connection"
    )


def internal_error() -> RespError:
    return err("internal error, see the server log")


# --- Engine errors (backends.base) --------------------------------------------------------

# What a client reads for each engine error; the engine's text is the cause. The first
# match wins, so a subclass comes before its base. ConsumerCreationError is not here:
# Rafka's text for a failed consumer registration names the consumer and the client, not
# the cause (consumer_registration_failed; the cause goes to the log).
ENGINE_ERRORS: tuple[tuple[type[EngineError], Callable[[str], RespError]], ...] = (
    (ProducerCreationError, producer_spawn_failed),
    (ProduceError, produce_refused),
    (ConsumeError, poll_failed),
    (AckError, ack_refused),
    (MetadataClientError, metadata_client_failed),
    (MetadataError, metadata_failed),
)


def from_engine(error: EngineError) -> RespError:
    """The error reply for `error`; an engine error without a text here is a bug (the
    server answers its internal error and logs it)."""
    for kind, make in ENGINE_ERRORS:
        if isinstance(error, kind):
            return make(str(error))
    raise TypeError(f"no RESP text for {type(error).__name__}: {error}") from error


# --- HTTP push subscriptions (RAFKA.PUSH; docs/push.md) -----------------------------------


def push_refused(cause: str) -> RespError:
    """A RAFKA.PUSH change or subscription refused; `cause` names the key or the reason."""
    return err(f"push: {cause}")
