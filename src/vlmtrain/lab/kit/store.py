"""The results store: every row the lab writes and reads, one JSON row per measured run in results/<topic>.jsonl,
the rule that picks a name's current row, and the machine run that groups rows measured together.

A row is {name, command, date, machine, machine_run, metrics, ...}; metric keys carry units (a run's own figures
come from vlmtrain.observe.run_summary). `record` is a finished case's row from its run dir; the repeats of a case
on one machine run and their summary row are vlmtrain.lab.kit.schedule's.

A machine run is one batch of measurements on one machine: medians and ratios compare only runs of one machine run,
since two machines of one kind (or one machine on another day) differ by more than the effects measured. It is
`--machine-run TAG` where an experiment is given one; otherwise `<host>-<GPUs>-<start>`: this host, a hash of its
GPUs' serial numbers (`cpu` without GPUs) and when the batch began (UTC). A batch this host and its GPUs began less
than WINDOW_H hours ago in the same results file is continued; else one begins now.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.lab.kit.runner import recorded
from vlmtrain.observe import run_summary

if TYPE_CHECKING:
    from vlmtrain.lab.kit.case import Case

IDENTITY = ("date", "machine", "machine_run")
"""What a row says about where and when it was measured: this machine today, unless the row is derived from rows
or runs of another machine or day and keeps theirs."""
WINDOW_H = 12
"""How long after its start a machine run takes more runs of the same host and GPUs."""
STAMP = "%Y%m%dT%H%MZ"


def read(results: Path) -> list[dict[str, Any]]:
    """Every row of a results file, in order ([] when there is none yet)."""
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


def latest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per name, in first-seen order: a later row of a name replaces an earlier one (a re-run, or a row
    re-summarized from the same run's files); rows marked `superseded` (their command no longer means what it
    measured) are left out."""
    by_name = {r["name"]: r for r in rows if "superseded" not in r}
    return [by_name[n] for n in dict.fromkeys(r["name"] for r in rows) if n in by_name]


@functools.cache
def _gpus() -> list[tuple[str, str]]:
    """(name, serial) of each GPU nvidia-smi lists; [] without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,serial", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [(name.strip(), serial.strip()) for name, _, serial in (line.partition(",") for line in out.splitlines())
            if name.strip()]


def machine() -> str:
    gpus = _gpus()
    return f"{len(gpus)}x {gpus[0][0]}" if gpus else "cpu"


def host() -> str:
    """This host and its GPUs: `<hostname>-<first 8 hex of the hash of the GPUs' serials>`, or `<hostname>-cpu`."""
    serials = ",".join(sorted(s for _, s in _gpus()))
    return f"{socket.gethostname()}-" + (hashlib.sha1(serials.encode()).hexdigest()[:8] if serials else "cpu")


@functools.cache
def _began() -> dt.datetime:
    """When this process began a machine run: every new one it names starts then."""
    return dt.datetime.now(dt.UTC).replace(second=0, microsecond=0, tzinfo=None)


def machine_runs(results: Path) -> list[str]:
    """The machine runs a results file's rows name, in order of their first row."""
    return list(dict.fromkeys(r["machine_run"] for r in read(results) if r.get("machine_run")))


def machine_run(tag: str | None = None, seen: Iterable[str] = ()) -> str:
    """The machine run this process's measurements belong to (module docstring): `tag` when given; else the latest
    of `seen` (the machine runs a results file or a run folder holds) that this host and its GPUs began less than
    WINDOW_H hours ago; else a new one, begun when this process first asked."""
    if tag:
        return tag
    prefix, now = f"{host()}-", _began()
    for name in reversed(list(seen)):
        try:
            start = dt.datetime.strptime(name.removeprefix(prefix), STAMP) if name.startswith(prefix) else None
        except ValueError:
            continue
        if start is not None and dt.timedelta(0) <= now - start < dt.timedelta(hours=WINDOW_H):
            return name
    return prefix + now.strftime(STAMP)


def row(name: str, command: Any, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A results row: name, command, the IDENTITY fields (today and this machine's, where `extra` does not give
    them), metrics, then `extra`."""
    today = {"date": lambda: dt.date.today().isoformat(), "machine": machine, "machine_run": machine_run}
    ident = {k: extra.pop(k) if k in extra else today[k]() for k in IDENTITY}
    return {"name": name, "command": command, **ident, "metrics": metrics, **extra}


def append(results: Path, name: str, command: Any, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """`row(...)` appended to the results file; returns it."""
    out = row(name, command, metrics, **extra)
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:
        f.write(json.dumps(out) + "\n")
    return out


def rewrite(results: Path, rows: list[dict[str, Any]]) -> None:
    """A results file that is derived whole from other rows (the memory estimates of the measured peaks): written
    again from `rows`, each made by `row`."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))


def record(case: Case, rc: int, run_dir: Path, wall_s: float, results: Path, **extra: Any) -> dict[str, Any] | None:
    """A finished case's row from its run dir (vlmtrain.observe.run_summary's figures, checks.json), appended; None,
    and the log's tail printed, when it failed."""
    summary = run_summary.summarize(run_dir, keys=run_summary.SUMMARY_KEYS)
    checks_file = run_dir / "checks.json"
    checks = json.loads(checks_file.read_text()) if checks_file.exists() else {}
    status = "ok" if rc == 0 and summary else f"failed (rc={rc})"
    print(f"[cases] {case.name}: {status} in {wall_s:.0f}s {json.dumps(summary)}", flush=True)
    if status != "ok":
        log = run_dir / "train.log"
        print(log.read_text()[-4000:] if log.exists() else f"(no {log})", flush=True)
        return None
    return append(results, case.name, recorded(case), summary, checks=checks, wall_s=round(wall_s, 1), **extra)
