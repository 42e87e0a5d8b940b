"""The startup spans of a run's first metrics row (vlmtrain.observe.startup) from this test process's real start
time, and their way into a benchmark row's metrics (run_summary.summarize_rows) from a recorded GPU run's rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from vlmtrain.observe import run_summary, startup

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_cases"
CASE = CASES / "30b-shape-l4_fsdp_ep1_trainable_recompute-none_graph-none_1gpu"


def test_a_rank_started_by_the_launcher_counts_the_launcher_span_up_to_its_own_start() -> None:
    rank_start = psutil.Process().create_time()
    env = {startup.LAUNCH_ENV: repr(rank_start - 40.0)}
    row = startup.first_row(train_start=rank_start + 25.0, now=rank_start + 55.0, env=env)
    assert row == pytest.approx({"startup_launcher_s": 40.0, "startup_rank_setup_s": 25.0,
                                 "startup_first_step_s": 30.0})


def test_a_rank_that_is_the_launchers_own_process_has_no_launcher_span() -> None:
    """A Slurm task runs flow.main and trains in one process: flow.main began after that process started."""
    rank_start = psutil.Process().create_time()
    row = startup.first_row(rank_start + 20.0, rank_start + 26.0, env={startup.LAUNCH_ENV: repr(rank_start + 5.0)})
    assert row == pytest.approx({"startup_launcher_s": 0.0, "startup_rank_setup_s": 15.0, "startup_first_step_s": 6.0})


def test_mark_launch_hands_the_time_to_the_ranks_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(startup.LAUNCH_ENV, raising=False)
    startup.mark_launch()
    assert float(os.environ[startup.LAUNCH_ENV]) >= psutil.Process().create_time()


def test_the_summary_carries_the_first_rows_spans_not_a_later_rows() -> None:
    rows = [json.loads(line) for line in (CASE / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and not any(k in rows[0] for k in startup.KEYS)  # recorded before the spans existed
    assert not any(k in run_summary.summarize_rows(rows) for k in startup.KEYS)
    rows[0] |= {"startup_launcher_s": 48.0, "startup_rank_setup_s": 19.5, "startup_first_step_s": 24.1}
    rows[5] |= {"startup_launcher_s": 999.0}  # only the first row's count
    summary = run_summary.summarize_rows(rows)
    assert {k: summary[k] for k in startup.KEYS} == {"startup_launcher_s": 48.0, "startup_rank_setup_s": 19.5,
                                                     "startup_first_step_s": 24.1}
