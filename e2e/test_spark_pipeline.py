"""`make pipeline` on a part of the flights, on each engine: the script starts its own
gateway, streams the flights through the Spark sink and back through the `rafka` source,
finds the same aggregates as the batch job, and leaves no process behind."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.support.child_process import run_to_end
from tests.support.engines import GATEWAY_ENGINES

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "clients" / "spark" / "flights_pipeline.py"
FLIGHTS = 2000


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("engine", GATEWAY_ENGINES)
def test_pipeline_streams_the_flights_and_matches_the_batch_job(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "kafka" and request.config.getoption("no_broker"):
        pytest.skip("needs a Kafka broker (--no-broker)")
    # Through backends.process: the script (and so its gateway and Spark) dies with the
    # test run, even a SIGKILLed one.
    run = run_to_end(
        [sys.executable, str(SCRIPT), "--engine", engine, "--limit", str(FLIGHTS)],
        360,
        check=False,
        cwd=REPO,
        env={"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    out = "\n".join(run.stdout_lines)
    stderr = "\n".join(run.stderr_lines)
    assert run.returncode == 0, f"exit {run.returncode}\n{out}\n{stderr[-3000:]}"
    assert f"sink: batch 0: {FLIGHTS:,} flights sent" in out, out
    assert f"source: {FLIGHTS:,} flights read from topic flights" in out, out
    summary = re.search(r"(\d+) carrier-months, ([\d,]+) flights streamed.*; (\d+) differ", out)
    assert summary is not None, out
    assert summary[2] == f"{FLIGHTS:,}" and summary[3] == "0", summary[0]
    assert "the streamed result equals the batch job's" in out
    # The gateway it started is gone (its pid is on the console), Tansu and stores too.
    started = re.search(r"gateway started \(\w+ engine\) on port \d+, pid (\d+)", out)
    assert started is not None, out
    assert not alive(int(started[1])), "the pipeline left its gateway running"
    assert "gateway stopped (exit status 0)" in out


def test_bad_arguments_are_refused_before_anything_starts(tmp_path: Path) -> None:
    """--limit 0 ended in a traceback reading a Parquet file never written; a --work
    directory of an earlier run in FileExistsError, after the Spark session and the
    gateway had started (found in review)."""
    earlier = tmp_path / "earlier"
    (earlier / "months").mkdir(parents=True)
    for arguments, error in (
        (["--limit", "0"], "--limit must be at least 1, got 0"),
        (["--work", str(earlier)], f"--work {earlier} is not empty: give a new or empty"),
    ):
        run = run_to_end([sys.executable, str(SCRIPT), *arguments], 60, check=False, cwd=REPO)
        stderr = "\n".join(run.stderr_lines)
        assert run.returncode == 2, f"{arguments}: exit {run.returncode}\n{stderr[-3000:]}"
        assert f"error: {error}" in stderr, stderr
