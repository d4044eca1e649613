"""docker-compose.yml's services as local processes (`Local`), the Dockerfile's final stage
as `Image`, and Compose durations: what e2e/test_compose.py runs the file with (there is
no Docker engine on our machines).

The services of the default profile and of the `dafka` profile, and the gateway of the
`kafka` profile, run as local processes: each one's command (its `entrypoint` and
`command`, else the image's CMD), environment and mounted configuration files are read
from docker-compose.yml and the Dockerfile, and only this mapping is applied (`Local`):

* programs: `rafka` and `dafka-*` are this virtualenv's, `python` this interpreter,
  others (redis-cli) the machine's;
* `HOST:PORT` and `tcp://HOST:PORT`: HOST a service of the file is that service's PORT;
  0.0.0.0, *, 127.0.0.1 and localhost are the service's own. Each (service, PORT) is a
  free port on 127.0.0.1, and PORT must be one the service declares (`ports`/`expose`).
  A host that is not a service fails the test. The value of `--host`/`-h` is 127.0.0.1,
  the value of `--port`/`-p` the service's own port;
* `beacon/address` (what a Dafka node advertises) must be its service name, and is
  127.0.0.1;
* a named volume is a temporary directory, a bind-mounted file a copy with this mapping
  applied to its values; paths under their mount points follow them;
* the image's environment: PYTHONUNBUFFERED=1;
* the Kafka broker (apache/kafka, a JVM we do not have) is a Tansu broker on its port.

`depends_on` is followed (conditions included), health checks are run the same way
(that is how a test knows a service is ready; a store has none and is ready when it says
so), and `down` stops services in reverse order with SIGTERM, each within its
stop_grace_period, as `docker compose down` does: each must exit 0 by itself.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import yaml

from backends.dafka.config import Config as ZplConfig
from backends.dafka.embedded import STORE_READY
from backends.ports import free_port
from backends.process import Child, ProcessError, spawn
from tests.support.tansu import TansuBroker

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"
OWN_HOSTS = {"0.0.0.0", "*", "127.0.0.1", "localhost"}
ADDRESS_KEYS = {"beacon/address"}
IMAGE_ENV = {"PYTHONUNBUFFERED": "1"}
# Services without a health check are ready when their program prints this.
READY_LINES = {"dafka-stored": STORE_READY}
WAIT = 30.0  # a reply, a record
READY = 45.0  # a service's health: longer than the joined gateway's dafka.start_timeout
ENDPOINT = re.compile(r"(?P<scheme>tcp://)?(?P<host>[A-Za-z0-9_.*-]+):(?P<port>\d+)\b")


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


def seconds(duration: str | int | float) -> float:
    """A Compose duration ("45s", "1m30s", "500ms") in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|s|m|h)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


@dataclass(frozen=True)
class Image:
    """What docker-compose.yml's services take from the Dockerfile's final stage."""

    cmd: list[str]
    healthcheck: list[str]  # as a Compose `test`: ["CMD", program, args...]
    workdir: str

    @classmethod
    def parse(cls, text: str) -> Image:
        joined = re.sub(r"\\\n", " ", text)  # continuation lines
        lines = [line.strip() for line in joined.splitlines()]
        instructions = [line for line in lines if line and not line.startswith("#")]
        last = max(i for i, line in enumerate(instructions) if line.startswith("FROM "))
        found: dict[str, str] = {}
        for line in instructions[last:]:
            word, _, rest = line.partition(" ")
            found[word] = rest.strip()
        health = found["HEALTHCHECK"]
        health_cmd = json.loads(health[health.index(" CMD ") + len(" CMD ") :])
        return cls(json.loads(found["CMD"]), ["CMD", *health_cmd], found["WORKDIR"])


IMAGE = Image.parse(DOCKERFILE.read_text())


# --- the compose topology on this machine -----------------------------------------------


class Local:
    """docker-compose.yml's services as local processes, with the mapping of the module
    docstring: ports, directories, copies of mounted files."""

    def __init__(self, document: dict[str, Any], tmp: Path) -> None:
        self.services: dict[str, dict[str, Any]] = document["services"]
        self.volumes: dict[str, Any] = document.get("volumes") or {}
        self.tmp = tmp
        self._ports: dict[tuple[str, int], int] = {}
        self._files: dict[str, list[tuple[str, Path]]] = {}
        self.running: dict[str, Child | TansuBroker] = {}
        self.order: list[str] = []
        self.health_output: dict[str, str] = {}

    # --- mapping ---------------------------------------------------------------------------

    def declared_ports(self, service: str) -> set[int]:
        spec = self.services[service]
        ports = {int(port) for port in spec.get("expose", [])}
        for entry in spec.get("ports", []):
            ports.add(int(str(entry).rsplit(":", 1)[-1].split("/")[0]))
        return ports

    def port(self, service: str, port: int) -> int:
        """The local port standing for `service`'s container port `port`."""
        declared = self.declared_ports(service)
        assert port in declared, (
            f"service {service} does not declare port {port} (ports/expose: {sorted(declared)})"
        )
        if (service, port) not in self._ports:
            taken = set(self._ports.values())
            while (local := free_port()) in taken:
                pass
            self._ports[(service, port)] = local
        return self._ports[(service, port)]

    def host(self, service: str, host: str) -> str:
        assert host in OWN_HOSTS or host in self.services, (
            f"service {service} names host {host!r}, not a service of docker-compose.yml"
        )
        return LOOPBACK

    def text(self, service: str, value: str, *, files: bool = True) -> str:
        """`value` with endpoints and mount points mapped."""

        def endpoint(match: re.Match[str]) -> str:
            host = match["host"]
            target = service if host in OWN_HOSTS else host
            self.host(service, host)
            return f"{match['scheme'] or ''}{LOOPBACK}:{self.port(target, int(match['port']))}"

        value = ENDPOINT.sub(endpoint, value)
        mounts = self.mounts(service) + (self.files(service) if files else [])
        for target, local in sorted(mounts, key=lambda mount: -len(mount[0])):
            if value == target or value.startswith(target.rstrip("/") + "/"):
                return str(local) + value[len(target) :]
        return value

    def mounts(self, service: str) -> list[tuple[str, Path]]:
        """(mount point, local directory) of the service's named volumes."""
        found = []
        for entry in self.services[service].get("volumes", []):
            source, target = str(entry).split(":")[:2]
            if source.startswith((".", "/")):
                continue
            assert source in self.volumes, f"{service}: volume {source} is not declared"
            local = self.tmp / "volumes" / source
            local.mkdir(parents=True, exist_ok=True)
            found.append((target, local))
        return found

    def files(self, service: str) -> list[tuple[str, Path]]:
        """(mount point, local copy) of the service's bind-mounted files."""
        if service not in self._files:
            found = []
            for entry in self.services[service].get("volumes", []):
                source, target = str(entry).split(":")[:2]
                if source.startswith((".", "/")):
                    found.append((target, self.copy(service, REPO / source)))
            self._files[service] = found
        return self._files[service]

    def copy(self, service: str, source: Path) -> Path:
        """A copy of a mounted configuration file, its values mapped."""
        assert source.is_file(), f"{service} mounts {source}, which is not a file"
        local = self.tmp / "files" / service / source.name
        local.parent.mkdir(parents=True, exist_ok=True)

        def value(key: str, item: str) -> str:
            if key in ADDRESS_KEYS:
                own = self.services[service].get("hostname", service)
                assert item == own, f"{service} advertises {key} {item!r}, not its name {own!r}"
                return LOOPBACK
            return self.text(service, item, files=False)

        if source.suffix == ".json":

            def walk(node: Any, key: str = "") -> Any:
                if isinstance(node, dict):
                    return {k: walk(v, k) for k, v in node.items()}
                if isinstance(node, list):
                    return [walk(v) for v in node]
                return value(key, node) if isinstance(node, str) else node

            local.write_text(json.dumps(walk(json.loads(source.read_text())), indent=2))
        elif source.suffix == ".cfg":  # ZPL, as dafka-towerd and dafka-stored read it
            zpl = ZplConfig.load(source)
            for path, item in zpl.items():
                zpl.set(path, value(path, item))
            zpl.save(local)
        else:
            raise AssertionError(f"{service} mounts {source}: no mapping for this kind of file")
        return local

    def program(self, service: str, name: str) -> str:
        if (BIN / name).exists():
            return str(BIN / name)
        if name == "python":
            return sys.executable
        found = shutil.which(name)
        assert found, f"service {service} runs {name!r}: not in the virtualenv nor on PATH"
        return found

    def argv(self, service: str, argv: list[str]) -> list[str]:
        program, *args = argv
        out = [self.program(service, program)]
        for option, arg in zip([None, *args], args, strict=False):
            if option in ("--port", "-p"):
                out.append(str(self.port(service, int(arg))))
            elif option in ("--host", "-h"):
                out.append(self.host(service, arg))
            else:
                out.append(self.text(service, arg))
        return out

    def command(self, service: str) -> list[str]:
        spec = self.services[service]
        assert "build" in spec, f"{service} does not run the rafka image"

        def words(value: str | list[str] | None) -> list[str]:
            return shlex.split(value) if isinstance(value, str) else [str(v) for v in value or []]

        command = words(spec["command"]) if "command" in spec else IMAGE.cmd
        return [*words(spec.get("entrypoint")), *command]

    def environment(self, service: str) -> dict[str, str]:
        raw = self.services[service].get("environment") or {}
        if isinstance(raw, list):
            raw = dict(str(item).partition("=")[::2] for item in raw)
        return {**IMAGE_ENV, **{k: self.text(service, str(v)) for k, v in raw.items()}}

    def workdir(self, service: str) -> Path:
        path = self.services[service].get("working_dir", IMAGE.workdir)
        local = self.text(service, path)
        if local == path:  # not on a mount: the anonymous volume of the image's VOLUME
            local = str(self.tmp / "anonymous" / service)
        Path(local).mkdir(parents=True, exist_ok=True)
        return Path(local)

    def healthcheck(self, service: str) -> list[str] | None:
        spec = self.services[service].get("healthcheck") or {}
        if spec.get("disable"):
            return None
        test = spec.get("test", IMAGE.healthcheck)
        assert test[0] == "CMD", f"{service}: only exec-form (CMD) health checks run here"
        return self.argv(service, test[1:])

    # --- running -------------------------------------------------------------------------

    def up(self, service: str) -> None:
        """Start `service` after its dependencies (meeting their conditions), and wait
        until it is healthy."""
        self._start(service)
        self._wait_ready(service)

    def _start(self, service: str) -> None:
        if service in self.running:
            return
        depends = self.services[service].get("depends_on") or {}
        if isinstance(depends, list):
            depends = {name: {"condition": "service_started"} for name in depends}
        for dependency, condition in depends.items():
            self._start(dependency)
            if condition["condition"] == "service_healthy":
                self._wait_ready(dependency)
            else:
                assert condition["condition"] == "service_started", condition
        image = str(self.services[service].get("image", ""))
        if image.startswith("apache/kafka:"):
            broker = TansuBroker(port=self.port(service, 9092))
            broker.start()
            self.running[service] = broker
        else:
            self.running[service] = spawn(
                self.argv(service, self.command(service)),
                name=service,
                env=self.environment(service),
                cwd=self.workdir(service),
                keep_lines=None,
            )
        self.order.append(service)

    def _wait_ready(self, service: str) -> None:
        child = self.running[service]
        if isinstance(child, TansuBroker):
            return  # listening since start()
        test = self.healthcheck(service)
        if test is None:
            child.wait_line(READY_LINES[self.command(service)[0]], READY)
            return

        def healthy() -> bool:
            self.check_running()
            probe = subprocess.run(test, capture_output=True, text=True, timeout=10)
            self.health_output[service] = probe.stdout.strip()
            return probe.returncode == 0

        try:
            child.wait_ready(healthy, READY)
        except ProcessError as error:
            raise AssertionError(f"{service} never healthy ({shlex.join(test)}): {error}") from None

    def check_running(self) -> None:
        """Fail at once when a started service has exited (compose would restart it)."""
        for name, child in self.running.items():
            if isinstance(child, Child) and not child.running:
                raise AssertionError(f"{name} exited ({child.returncode}):\n{child.tail(40)}")

    def stop(self, service: str) -> int:
        """SIGTERM, SIGKILL after the service's stop_grace_period (docker stop)."""
        child = self.running.pop(service)
        self.order.remove(service)
        if isinstance(child, TansuBroker):
            child.stop()
            return 0
        grace = seconds(self.services[service].get("stop_grace_period", "10s"))
        code = child.stop(grace)
        assert code != -signal.SIGKILL, f"{service} outlived its stop_grace_period ({grace:g} s)"
        return code

    def down(self) -> dict[str, int]:
        """Stop everything, dependents first; the exit codes. As `docker compose down`
        removes the containers, their anonymous volumes go too: the next `up` makes new
        ones (named volumes stay)."""
        codes = {service: self.stop(service) for service in reversed(list(self.order))}
        for service in codes:
            shutil.rmtree(self.tmp / "anonymous" / service, ignore_errors=True)
        return codes

    def kill_all(self) -> None:
        for service in reversed(list(self.order)):
            child = self.running.pop(service)
            if isinstance(child, TansuBroker):
                child.stop()
            else:
                child.stop(5)
        self.order.clear()

    def output(self, service: str) -> str:
        child = self.running.get(service)
        return child.tail(40) if isinstance(child, Child) else ""

    def redis(self, service: str, **options: Any) -> redis.Redis:
        return redis.Redis(port=self.port(service, 6380), socket_timeout=WAIT, **options)
