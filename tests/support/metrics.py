"""Scraping the gateway's Prometheus endpoint over HTTP, parsed by prometheus_client."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tests.support.waiting import wait_until


@dataclass(frozen=True)
class Scrape:
    """One scrape: each metric family's type, and every sample's value by name and labels."""

    types: Mapping[str, str]
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def labelled(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        """Every sample of `name`, by its labels."""
        return {labels: v for (sample, labels), v in self.samples.items() if sample == name}


def scrape(port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> Scrape:
    url = f"http://{host}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200, f"{url} answered {response.status}"
        text = response.read().decode()
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(types, samples)


def scrape_until(port: int, accept: Callable[[Scrape], bool], timeout: float, what: str) -> Scrape:
    """Scrape until a scrape is `accept`ed (returned); fail after `timeout` naming `what`."""
    accepted: list[Scrape] = []

    def check() -> bool:
        metrics = scrape(port)
        if accept(metrics):
            accepted.append(metrics)
        return bool(accepted)

    wait_until(check, timeout, what, interval=0.2)
    return accepted[-1]
