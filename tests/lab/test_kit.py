"""The kit's own rules on CPU: which machine run a row belongs to (a tag, else this host and its GPUs' batch begun
less than WINDOW_H hours ago, else a new one), results files read and written through the store, and the schedule:
the (case, run) pairs still to run, alternating, a failed case not run again, the budget, the summary after a case's
last run."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from vlmtrain.lab.kit import schedule, store
from vlmtrain.lab.kit.case import Case


def stamped(hours_ago: float, host: str | None = None) -> str:
    began = store._began() - dt.timedelta(hours=hours_ago)
    return f"{host or store.host()}-{began.strftime(store.STAMP)}"


def test_a_machine_run_is_a_tag_or_this_host_s_recent_batch() -> None:
    new = store.machine_run()
    assert new == stamped(0) and new.startswith(store.host()) and store.machine_run() == new  # one per process
    assert store.machine_run("node7-week2") == "node7-week2"
    recent, old = stamped(store.WINDOW_H - 1), stamped(store.WINDOW_H + 1)
    assert store.machine_run(None, [old, recent]) == recent  # continued: the same batch of measurements
    assert store.machine_run(None, [recent, old]) == recent  # the latest that is still open
    assert store.machine_run(None, [old]) == new  # too long ago: a batch of its own
    assert store.machine_run(None, [stamped(1, "another-host-cpu"), "boot-1a2b3c4d"]) == new
    assert store.machine_run(None, [stamped(-1)]) == new  # a start after this process began is no batch of it


def test_rows_go_through_the_store(tmp_path: Path) -> None:
    path = tmp_path / "results" / "x.jsonl"
    assert store.read(path) == [] and store.machine_runs(path) == []
    a = store.append(path, "a", "cmd", {"step_s": 1.0}, machine_run="m1")
    b = store.append(path, "b", "cmd", {"step_s": 2.0})
    store.append(path, "a", "cmd", {"step_s": 3.0}, machine_run="m1")
    assert store.read(path)[:2] == [a, b] and b["machine_run"] == store.machine_run()
    assert store.machine_runs(path) == ["m1", store.machine_run()]
    assert [r["metrics"]["step_s"] for r in store.latest(store.read(path))] == [3.0, 2.0]


def run_row(path: Path, name: str, i: int, useful: float, machine_run: str = "m") -> None:
    store.append(path, name, "cmd", {"useful_tokens_per_s_per_gpu": useful, "step_s": 1.0}, machine_run=machine_run,
                 run=i)


def test_the_schedule_alternates_and_skips_recorded_runs(tmp_path: Path) -> None:
    path, a, b = tmp_path / "r.jsonl", Case("a"), Case("b")
    run_row(path, "a", 0, 10.0)
    run_row(path, "a", 1, 11.0, machine_run="other")  # another machine run's: not this one's
    todo = schedule.pending([a, b], 3, lambda c: schedule.done(path, c.name, "m"), "t", "m")
    assert [(c.name, i) for c, i in todo] == [("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]

    ran, summarized = [], []

    def measure(case: Case, i: int) -> bool:
        ran.append((case.name, i))
        if case.name == "b" and i == 1:
            return False
        run_row(path, case.name, i, 10.0 + i)
        return True

    failed = schedule.run(todo, measure, repeats=3, tag="t", machine_run="m",
                          after_last=lambda c: summarized.append(schedule.summary(path, c.name, "m", "cmd")))
    assert failed == {"b"} and ran == [("b", 0), ("a", 1), ("b", 1), ("a", 2)]  # b's run 2 not started
    (row,) = summarized
    m, u = row["metrics"], schedule.USEFUL
    assert row["name"] == "a_summary" and (m["runs"], m[u], m[u + "_min"], m[u + "_max"]) == (3, 11.0, 10.0, 12.0)


def test_no_run_starts_past_the_budget() -> None:
    todo = [(Case("a"), 0), (Case("a"), 1), (Case("a"), 2)]
    ran: list[int] = []

    def measure(case: Case, i: int) -> bool:
        ran.append(i)
        time.sleep(0.2)
        return True

    assert schedule.run(todo, measure, repeats=3, tag="t", machine_run="m", budget_s=0.5) == set()
    assert ran == [0, 1]  # the third would end past 0.5 s at the slowest run so far
    ran.clear()
    schedule.run(todo, measure, repeats=3, tag="t", machine_run="m", budget_s=0.5, first_s=1.0)
    assert ran == []  # the estimate before any run says the first would not fit
