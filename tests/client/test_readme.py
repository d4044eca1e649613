"""The examples of clients/python/README.md run as written: against a gateway (in-memory
engine) and, for the test-double example, a fresh plain redis-server."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.runner import ServerThread
from tests.support.engines import MemoryEngineFactory
from tests.support.fixtures import EngineFactories
from tests.support.memory_engine import MemoryLog
from tests.support.redis_server import RedisServer

README = Path(__file__).parents[2] / "clients" / "python" / "README.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_readme_examples_run(engines: EngineFactories) -> None:
    blocks = examples()
    assert len(blocks) == 4, "the README's examples changed: update this test"
    producing, consuming, reading, double = blocks
    factory = engines("memory")
    assert isinstance(factory, MemoryEngineFactory)
    MemoryLog.named(factory.log_name).create_topic("greetings", 2)
    with ServerThread(factory.gateway_config()) as gateway:
        namespace: dict[str, object] = {"URL": f"redis://127.0.0.1:{gateway.port}"}
        for block in (producing, consuming, reading):
            exec(compile(block, str(README), "exec"), namespace)
    record = namespace["record"]
    assert getattr(record, "value", None) == b"hello", "the consuming example found hello"
    held = MemoryLog.named(factory.log_name).topics["greetings"]
    assert namespace["following"] == len(held[0]), "next_offset: partition 0's next offset"
    assert len(held[0]) + len(held[1]) == 1002, "every record produced is in the log"
    last_ten = namespace["last_ten"]
    assert isinstance(last_ten, list) and len(last_ten) == 10
    with RedisServer() as server:
        exec(compile(double, str(README), "exec"), {"DOUBLE_URL": server.url})
