"""Error texts as librdkafka names them, the way Rafka showed them to clients."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def error_text(exc: KafkaException) -> str:
    """librdkafka's own text for the error code, e.g. `Local: Unknown topic`.

    confluent-kafka prefixes the text with the failing call ("Unable to produce
    message: ...", "StoreOffsets failed: ..."); Rafka (Go) showed the bare
    rd_kafka_err2str text, so that is what clients get.
    """
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return str(KafkaError(error.code()).str())
    return str(exc)


def creation_error_text(exc: BaseException) -> str:
    """The cause of a failed client creation, e.g. `No such configuration property: "foo"`."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(error, KafkaError):
        return str(error.str())
    return str(exc)
