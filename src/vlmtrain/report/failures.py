"""A job's outcome class (ok, OOM, non-finite, NCCL timeout, crash, ...) and the log line or failure record that
shows it (the record a stopping rank writes: vlmtrain.observe.failure)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out")
"""PyTorch's ProcessGroupNCCL watchdog lines (not its init banner, which prints the TIMEOUT(ms) setting)."""
RANK_PREFIX = re.compile(r"^\[(?:rank|Rank )?\d+\]:\s?")
BRIDGE_FAILURE = re.compile(r"Pretrain failed on rank=\d+ with (\w+): (.*?)(?:\. Bridge is aborting.*)?$")
EXIT_CODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
WRAPPER_EXCEPTIONS = ("ChildFailedError",)
"""Launcher exceptions that only say a rank failed; the rank's own exception is the one to report."""
LOG_TAIL_BYTES = 4 << 20
LOG_GLOBS = ("*.log", "*.err", "*.out")


def _tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    with path.open("rb") as f:
        f.seek(max(path.stat().st_size - limit, 0))
        return f.read().decode("utf-8", errors="replace")


def log_text(job_dir: Path) -> str:
    """The tail of every log the job wrote into its directory (Hydra's train.log, launcher .out/.err)."""
    files = sorted({p for g in LOG_GLOBS for p in job_dir.glob(g) if p.is_file()})
    return "\n".join(_tail(p) for p in files)


def exception_lines(text: str) -> list[str]:
    """The exception line that ends each Python traceback in a log, in order ('[rankN]: ' prefixes dropped)."""
    out, in_tb = [], False
    for raw in text.splitlines():
        line = RANK_PREFIX.sub("", raw)
        if line.startswith("Traceback (most recent call last)"):
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace():
            out.append(line.strip())
            in_tb = False
    return out


def _root_exception(text: str) -> str | None:
    """The last exception that is not a launcher wrapper, else the wrapper with the rank's exit code."""
    lines = exception_lines(text)
    own = [ln for ln in lines if not any(w in ln.split(":")[0] for w in WRAPPER_EXCEPTIONS)]
    if own:
        return own[-1]
    if lines:
        codes = EXIT_CODE.findall(text)
        return lines[-1].rstrip(": ") + (f" (exitcode {codes[-1]})" if codes else "")
    return None


def _matching_line(pattern: re.Pattern[str], text: str, last: bool = False) -> str | None:
    hits = [RANK_PREFIX.sub("", ln).strip() for ln in text.splitlines() if pattern.search(ln)]
    return (hits[-1] if last else hits[0]) if hits else None


def from_record(rec: dict[str, Any]) -> tuple[str, str]:
    """(status, reason) from a failure record: the step, and the OOM's component and advice or the non-finite
    step's samples and last good checkpoint."""
    if rec.get("kind") == "refused":
        return "refused", rec.get("error", "")
    if rec.get("kind") == "oom":
        return "oom", f"step {rec.get('step')}, in the {rec.get('component')} component. {rec.get('advice', '')}"
    return "nonfinite", (f"step {rec.get('step')}: samples {rec.get('micro_batches')}; last good checkpoint "
                         f"{rec.get('last_checkpoint')}")


def classify(text: str, steps: int, expected_steps: int | None = None, dry_run: bool = False,
             ended: bool | None = None, record: dict[str, Any] | None = None) -> tuple[str, str]:
    """(status, reason) of a job from its failure record when it wrote one, else its log text, how many metric
    rows it wrote and whether its end-of-training checks ran (`ended`; None when unknown)."""
    if record is not None:
        return from_record(record)
    if line := _matching_line(OOM, text, last=True):
        return "oom", line
    if line := _matching_line(NCCL_TIMEOUT, text):
        return "nccl_timeout", line
    if line := _root_exception(text):
        return "crash", line
    if m := BRIDGE_FAILURE.search(text):
        return "crash", f"{m.group(1)}: {m.group(2)}"
    if steps == 0 and dry_run:
        return "dry_run", "bridge_config.yaml only"
    if steps == 0:
        return "incomplete", "no metrics and no error in the logs"
    if expected_steps and steps < expected_steps:
        return "incomplete", f"{steps}/{expected_steps} steps and no error in the logs"
    if ended is False:
        return "incomplete", "checks.json has no end-of-training checks: the run stopped after its last step"
    return "ok", ""
