"""What the benches' own drivers promise, run as the benches run them (processes of their
own, on real engines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support.child_process import run_to_end

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_the_dafka_growth_reference_produces_past_a_full_queue(tmp_path: Path) -> None:
    """bench/growth.py's engine-alone reference with more records than
    `dafka.queue_max_messages` lets wait on the stores: each refused record waits for room,
    as the gateway's RPUSHX does, and every record is produced and read back (it stopped
    with `Local: Queue full` at `--records 300000`, over the default 100,000)."""
    records = 600
    document = {"dafka": {"partitions": 1, "queue_max_messages": 50}}
    command = [
        sys.executable,
        str(BENCH / "growth_engine.py"),
        *("--data-dir", str(tmp_path / "data"), "--topics", "a,b,c", "--groups", "1"),
        *("--records", str(records), "--deliveries", str(records)),
        *("--document", json.dumps(document)),
    ]
    # It exits 0 only when its flush found none outstanding and every read got a record
    # within 30 s; run_to_end raises otherwise (a refused record ended it with status 1).
    done = run_to_end(command, 120, name="growth_engine.py")
    figures = json.loads(done.stdout_lines[-1])
    assert figures["produce"] > 0, figures
    assert figures["consume"] > 0, figures
