# `make run` and `make test` set up everything they need on a fresh Debian machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := redis-server redis-tools ruby ruby-redis docker-compose openjdk-17-jre-headless \
	openssl
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PORT ?= 6380
PYTEST_ARGS ?=
BENCH_ARGS ?=
SOAK_ARGS ?=

.PHONY: run test test-fast venv venv-support compiler system-packages lint typecheck compose-check pytest bench \
	bench-dafka bench-tls bench-push bench-idle bench-growth soak bench-spark pipeline clean

$(STAMP): pyproject.toml setup.py backends/dafka/_zmqbatch.c gateway/resp/_repeat.c | compiler venv-support
	$(PYTHON) -m venv $(VENV)
	@# A C source that no longer compiles must not leave the last build in use.
	rm -f backends/dafka/_zmqbatch.*.so gateway/resp/_repeat.*.so
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

# `python3 -m venv` needs ensurepip, which Debian's own Python ships apart (python3-venv).
venv-support:
	@if ! $(PYTHON) -c 'import ensurepip' >/dev/null 2>&1; then \
	  echo "installing Debian packages: python3-venv"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv; \
	fi

# The C fast paths (setup.py: the Dafka engine's, the request parser's) need a C compiler
# and Python's headers; without them the install still succeeds, on the slower Python paths.
HAS_PYTHON_H := import os, sys, sysconfig; \
	sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
compiler:
	@if ! command -v gcc >/dev/null || ! $(PYTHON) -c '$(HAS_PYTHON_H)'; then \
	  echo "installing Debian packages: gcc python3-dev"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq gcc python3-dev \
	    || echo "no C compiler: the Dafka engine and the parser will run their Python paths"; \
	fi

# The tests drive real redis-server, redis-cli and redis-rb, and validate the compose file
# with docker-compose (no Docker engine needed), renegotiate TLS with openssl s_client;
# PySpark needs a Java 17 runtime: install them when missing.
system-packages:
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null \
	    || ! command -v redis-benchmark >/dev/null || ! command -v docker-compose >/dev/null \
	    || ! command -v java >/dev/null || ! command -v openssl >/dev/null \
	    || ! ruby -e 'require "redis"' >/dev/null 2>&1; then \
	  echo "installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES); \
	fi

ENGINE ?= dafka
DATA_DIR ?= rafka-data

# The embedded default: the gateway runs its own Dafka tower and store over $(DATA_DIR).
# `make run ENGINE=kafka`: a local in-memory Kafka-compatible broker (Tansu) instead.
run: venv
ifeq ($(ENGINE),kafka)
	$(BIN)/python -m tests.support.devrun_kafka --port $(PORT)
else
	$(BIN)/rafka --engine $(ENGINE) --host 127.0.0.1 --port $(PORT) --data-dir $(DATA_DIR)
endif

lint: venv
	$(BIN)/ruff check gateway backends clients tests e2e bench
	$(BIN)/ruff format --check gateway backends clients tests e2e bench

typecheck: venv
	$(BIN)/mypy
	$(BIN)/mypy tests e2e bench clients/spark/flights_pipeline.py

# docker-compose.yml against the Compose schema, with each profile (no Docker engine needed);
# e2e/test_compose.py runs its services as local processes.
compose-check: system-packages
	docker-compose -f docker-compose.yml config -q
	docker-compose -f docker-compose.yml --profile dafka config -q
	docker-compose -f docker-compose.yml --profile kafka config -q
	docker-compose -f docker-compose.yml --profile spark config -q

pytest: venv system-packages
	$(BIN)/pytest $(PYTEST_ARGS)

test: system-packages venv lint typecheck compose-check pytest

# Every test that needs no broker (the Kafka ones are skipped): a quick check while working.
test-fast: venv system-packages
	$(BIN)/pytest --no-broker -rfE $(PYTEST_ARGS)

# The gateway on both engines, next to references measured in the same run (about 5 min).
# `make bench BENCH_ARGS="--engine dafka"`: one engine; `--help` for the rest.
bench: venv system-packages
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The Dafka programs (tower, store, perf tools) as processes on loopback: throughput, latency.
bench-dafka: venv
	$(BIN)/python bench/dafka.py

# The NYC flights through the Spark sink and the `rafka` source, checked against a batch job
# (clients/spark/README.md). Starts and stops its own gateway on $(ENGINE);
# PIPELINE_ARGS="--limit 20000" for a part, "--url redis://host:port" for a running gateway.
PIPELINE_ARGS ?=
pipeline: venv system-packages
	$(BIN)/python clients/spark/flights_pipeline.py --engine $(ENGINE) $(PIPELINE_ARGS)

# Rows/s through the Spark sink and source next to direct clients (never fails).
bench-spark: venv system-packages
	$(BIN)/python bench/spark.py $(BENCH_ARGS)

# TLS vs plaintext on one gateway (embedded Dafka), with redis-benchmark (about 2 min).
bench-tls: venv system-packages
	$(BIN)/python bench/tls.py $(BENCH_ARGS)

# HTTP push subscriptions (docs/push.md) against a bare aiohttp loop to the same server.
bench-push: venv
	$(BIN)/python bench/push.py

# A real gateway under 1,000 active and 10,000 idle connections, random disconnects and one
# restart (about 4 min): nothing DUMP confirmed is lost, RSS bounded; prints a summary.
# `make soak SOAK_ARGS="--engine kafka --duration 60"`; `--help` for the rest.
soak: venv system-packages
	$(BIN)/python -m e2e.soak $(SOAK_ARGS)

# 10,000 idle connections to one gateway (embedded Dafka): RSS per connection, all served
# (about 10 s; `BENCH_ARGS="--connections N"`).
bench-idle: venv
	$(BIN)/python bench/idle_connections.py $(BENCH_ARGS)

# How cost grows: produce/consume rates and gateway RSS with 1, 100, 1,000 topics and 1, 10,
# 100 groups, both engines, next to the 1-topic/1-group figure (a few minutes; each shape
# bounded by --bound).
bench-growth: venv
	$(BIN)/python bench/growth.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build \
	  backends/dafka/_zmqbatch.*.so gateway/resp/_repeat.*.so
