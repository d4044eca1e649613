"""librdkafka's own log lines, through structlog like every other line of ours.

Without a `logger`, librdkafka prints them raw on stderr (`%3|1700000000.123|FAIL|
rdkafka#producer-1| ...`): a gateway run with `--log-json` then wrote lines no JSON
reader takes, most of them while a broker was down. Given this logger, confluent-kafka
hands each line to it when the client is polled (on the thread that polls it).
"""

from __future__ import annotations

import logging

import structlog

_log = structlog.get_logger("rafka.kafka.librdkafka")


class _ToStructlog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        args = record.args  # confluent-kafka's: "%s [%s] %s"
        if isinstance(args, tuple) and len(args) == 3:
            facility, client, text = (str(arg) for arg in args)
        else:
            facility, client, text = "", "", record.getMessage()
        _log.log(record.levelno, "librdkafka", facility=facility, client=client, text=text)


# Not structlog's logger name: structlog may sit on the standard library's loggers (the
# tests' configuration does), and this handler would then receive its own lines.
librdkafka_logger = logging.getLogger("confluent_kafka.librdkafka")
librdkafka_logger.addHandler(_ToStructlog())
librdkafka_logger.setLevel(logging.DEBUG)  # librdkafka's own `log_level` filters first
librdkafka_logger.propagate = False
