"""The optional Prometheus endpoint (`gateway.metrics_port`, `--metrics-port`; off by
default). Every metric is documented in docs/metrics.md.

prometheus_client's HTTP server answers scrapes on threads of its own; a scrape reads
live values through `GatewayCollector`, never on the gateway's event loop:
- the stats counters and gauges (what `HGETALL stats` shows), thread-safe already;
- the per-command latency histograms (gateway.latency), filled by the connections;
- consumer lag, read through the engine's Admin by a `LagReader` (bounded in time);
- the size of the directories the engine keeps the log in (`Engine.disk_paths`).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterator

import structlog
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from backends.registry import engine_entry
from gateway.context import ServerContext
from gateway.lag import LagReader, LagUnavailable
from gateway.latency import BUCKETS, CommandLatency
from gateway.metrics_server import MetricsServer, serve
from gateway.push.runner import counter_of
from gateway.stats import ServerStats

log = structlog.get_logger("rafka.gateway.metrics")

PREFIX = "rafka_"
# How long stopping may wait for the lag reader (its Admin's close) to end.
STOP_TIMEOUT = 10.0
_NOT_A_NAME = re.compile(r"[^a-zA-Z0-9_]")
_BOUNDS = [f"{bound:g}" for bound in BUCKETS] + ["+Inf"]


def stat_metric(name: str) -> str:
    """The metric name of a stats counter: `producer.produced.messages` ->
    `rafka_producer_produced_messages` (a counter's samples end in `_total`)."""
    return PREFIX + _NOT_A_NAME.sub("_", name)


def disk_usage(path: str) -> int:
    """Bytes the files under `path` take on disk (as `du -s --block-size=1`); files
    that vanish meanwhile (RocksDB compactions) are skipped."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


class GatewayCollector(Collector):
    """Reads every value at scrape time."""

    def __init__(self, ctx: ServerContext, latency: CommandLatency, lag: LagReader) -> None:
        self._ctx = ctx
        self._latency = latency
        self._lag = lag

    def collect(self) -> Iterator[Metric]:
        yield from self._stats()
        yield self._latencies()
        yield from self._lags()
        yield self._disk()

    def _stats(self) -> Iterator[Metric]:
        # A push subscription's counters (`push.<name>.<kind>`): one family per kind, the
        # subscription a label. Its name made a metric name would merge subscriptions
        # whose names differ only in `.`/`-` (both legal) into one family, twice.
        pushes: dict[str, CounterMetricFamily] = {}
        for name, value in self._ctx.stats.snapshot().items():
            doc = f"HGETALL stats: {name}"
            push = counter_of(name)
            if push is not None:
                subscription, kind = push
                family = pushes.get(kind)
                if family is None:
                    family = pushes[kind] = CounterMetricFamily(
                        f"{PREFIX}push_{kind}",
                        f"HGETALL stats: push.<subscription>.{kind}",
                        labels=["subscription"],
                    )
                family.add_metric([subscription], value)
            elif name in ServerStats.GAUGES:
                yield GaugeMetricFamily(stat_metric(name), doc, value=value)
            else:
                yield CounterMetricFamily(stat_metric(name), doc, value=value)
        yield from pushes.values()

    def _latencies(self) -> Metric:
        family = HistogramMetricFamily(
            PREFIX + "command_duration_seconds",
            "Time from a command's parsing to its reply, per command (waiting commands: "
            "until they answer)",
            labels=["command"],
        )
        for histogram in self._latency.snapshot():
            buckets = list(zip(_BOUNDS, histogram.cumulative, strict=True))
            family.add_metric([histogram.command], buckets, histogram.total)
        return family

    def _lags(self) -> Iterator[Metric]:
        ok = GaugeMetricFamily(
            PREFIX + "consumer_lag_collect_ok",
            "1 when this scrape read consumer lag, 0 when it could not (then no lag samples)",
        )
        try:
            snapshot = self._lag.read()
        except LagUnavailable as error:
            log.warning("consumer lag unavailable", error=str(error))
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        yield GaugeMetricFamily(
            PREFIX + "consumer_lag_collect_seconds",
            "How long this scrape took to read consumer lag",
            value=snapshot.seconds,
        )
        labels = ["group", "topic", "partition"]
        lag = GaugeMetricFamily(
            PREFIX + "consumer_lag",
            "Records of a partition after a group's committed offset",
            labels=labels,
        )
        committed = GaugeMetricFamily(
            PREFIX + "consumer_committed_offset",
            "A group's committed offset on a partition: the next record it wants",
            labels=labels,
        )
        for row in snapshot.lags:
            values = [row.group, row.topic, str(row.partition)]
            lag.add_metric(values, row.lag)
            committed.add_metric(values, row.committed)
        first = GaugeMetricFamily(
            PREFIX + "partition_first_offset",
            "The oldest offset a partition keeps",
            labels=["topic", "partition"],
        )
        following = GaugeMetricFamily(
            PREFIX + "partition_next_offset",
            "The offset the next record of a partition will get",
            labels=["topic", "partition"],
        )
        for end in snapshot.partitions:
            first.add_metric([end.topic, str(end.partition)], end.first)
            following.add_metric([end.topic, str(end.partition)], end.next)
        yield from (lag, committed, first, following)

    def _disk(self) -> Metric:
        family = GaugeMetricFamily(
            PREFIX + "store_disk_usage_bytes",
            "Bytes on disk of a directory the engine keeps the log in (none: the log is "
            "elsewhere, e.g. a Kafka broker)",
            labels=["path"],
        )
        for path in self._ctx.engine.disk_paths():
            family.add_metric([path], disk_usage(path))
        return family


class MetricsEndpoint:
    """The HTTP server of the metrics and what it reads; `start()` then `stop()` once."""

    def __init__(self, ctx: ServerContext, latency: CommandLatency) -> None:
        config = ctx.config
        assert config.metrics_port is not None
        self.host = config.metrics_host if config.metrics_host is not None else config.host
        self.port = config.metrics_port
        entry = engine_entry(config.engine)
        self._lag = LagReader(
            lambda: entry.admin(config.engine_settings, config.engine_options()),
            config.metrics_lag_timeout,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GatewayCollector(ctx, latency, self._lag))
        # prometheus_client's standard ones: process_* (CPU, memory, file descriptors),
        # python_gc_*, python_info.
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(standard)
        self._server: MetricsServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen (raises OSError with the address in its text)."""
        try:
            self._server, self._thread = serve(self.host, self.port, make_wsgi_app(self.registry))
        except OSError as error:
            reason = error.strerror or str(error)
            raise OSError(f"cannot serve metrics on {self.host}:{self.port}: {reason}") from None
        self.port = self._server.server_port
        log.info("Serving metrics", host=self.host, port=self.port, path="/metrics")

    async def stop(self) -> None:
        """Stop answering scrapes and close the lag reader, off the event loop."""
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            # Scrapers still connected (slow or stuck clients) are cut off; a scrape
            # waiting for the lag gives up once the lag reader is closed.
            server.close_connections()
        self._lag.close(STOP_TIMEOUT)
        if server is not None:
            server.server_close()  # joins the connections' threads
        if self._thread is not None:
            self._thread.join()
        log.info("metrics endpoint closed")
