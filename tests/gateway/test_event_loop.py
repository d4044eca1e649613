"""`gateway.event_loop`: the gateway serves the same on uvloop as on asyncio's own loop
(every other test runs on asyncio's), on both engines: produce, DUMP, consume, ack; and
`rafka --event-loop uvloop` starts, serves and stops on SIGTERM."""

from __future__ import annotations

import json
import secrets
import signal
from pathlib import Path

import pytest

from gateway.config import ConfigError, from_dict
from tests.support.engines import GATEWAY_ENGINES
from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import Raw, client, running
from tests.support.rafka_process import RafkaProcess


@pytest.mark.parametrize("engine", GATEWAY_ENGINES)
@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_gateway_serves_the_same_on_either_loop(
    gateway_config: GatewayConfig, engines: EngineFactories, engine: str, event_loop: str
) -> None:
    config = gateway_config(engine, event_loop=event_loop)
    assert config.event_loop == event_loop
    with running(config) as gateway:
        loop_type = type(gateway.call(_running_loop()))
        assert ("uvloop" in loop_type.__module__) == (event_loop == "uvloop"), loop_type
        topic = engines(engine).new_topic(1)
        with client(gateway) as producer:
            values = [b"a%d" % n for n in range(50)]
            assert producer.execute_command("RPUSHX", f"topics:{topic}:k", *values) == 50
            assert producer.execute_command("DUMP", "10000") == 0
        with Raw(gateway.port, timeout=30) as raw:
            raw.command("CLIENT", "SETNAME", f"g{secrets.token_hex(3)}:c")
            assert raw.read_reply() == b"OK"
            got: list[bytes] = []
            for _ in range(20):
                raw.command("BLMPOP", "2", "1", f"topics:{topic}", "LEFT", "COUNT", "100")
                reply = raw.read_reply()
                if reply is not None:
                    got += [record[7] for record in reply[1]]
                    last = reply[1][-1]
                    raw.command("RPUSH", "acks", f"{topic}:{last[3]}:{last[5]}")
                    assert raw.read_reply() == 1
                if len(got) == len(values):
                    break
            assert got == values


async def _running_loop() -> object:
    import asyncio

    return asyncio.get_running_loop()


def test_an_unknown_event_loop_is_refused() -> None:
    with pytest.raises(ConfigError, match="event_loop"):
        from_dict({"gateway": {"event_loop": "trio"}})


def test_rafka_runs_on_uvloop_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "rafka.json"
    config.write_text(json.dumps({"gateway": {"data_dir": str(tmp_path / "data")}}))
    gateway = RafkaProcess(config, None, "--event-loop", "uvloop")
    gateway.start()
    try:
        with Raw(gateway.port) as raw:
            raw.command("PING")
            assert raw.read_reply() == "PONG"
        assert gateway.child is not None
        # uvloop is imported only when chosen (gateway/loops.py): its extension mapped in
        # the process shows the flag took effect, where a PONG alone would not.
        maps = Path(f"/proc/{gateway.child.popen.pid}/maps").read_text()
        assert "uvloop/loop" in maps, "rafka --event-loop uvloop did not load uvloop"
        gateway.child.popen.send_signal(signal.SIGTERM)
        assert gateway.child.popen.wait(30) == 0, gateway.stderr()
    finally:
        gateway.kill()
