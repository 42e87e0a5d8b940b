"""A training run that must stop says why, once, in its log and in a record the report reads.

- Non-finite loss or gradient (`train.on_nonfinite=stop`, the default): Megatron's own checks raise: the loss
  function's `rerun_state_machine.validate_result` (rerun_state_machine.check_for_nan_in_loss: "Unexpected result
  nan/inf") and the gradient buckets' check before the data-parallel reduce (ddp.check_for_nan_in_grad; Megatron-
  FSDP's "Detected NaN or Inf in wgrad"); the metrics callback raises NonFiniteStep for a non-finite loss or grad
  norm that got past them (under `train.on_nonfinite=stop_at_step_end`, which turns Megatron's checks off, it is the
  check). The record names the step, the sample ids of this rank's micro-batches of that step
  (vlmtrain.data.sample_ids; the last one is the micro-batch whose loss was checked when a loss check fired) and
  the last checkpoint saved before it ("none" when there is none).
- Out of memory (torch.OutOfMemoryError, or the CPU allocator's failure): the component the step timer was inside
  (observe.timing: vision / projector / decoder / optimizer / data / other) and the memory estimate's verdict with
  its suggested overrides (check.preflight.memory, the text preflight prints for memory_fits).

Each failing rank writes `<run dir>/failure-rank<N>.json`; `read()` returns them for the report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

RECORD_GLOB = "failure-rank*.json"
EXIT = {"nonfinite": 4, "oom": 5}
"""The rank's exit status of each kind; train.py exits with it too (exit_status)."""
MEGATRON_NONFINITE = re.compile(r"Unexpected result (?:tensor\()?[-+]?(?:nan|inf)|Detected NaN or Inf in wgrad",
                                re.IGNORECASE)
CPU_OOM = "DefaultCPUAllocator: can't allocate memory"


class NonFiniteStep(RuntimeError):
    """A step whose loss or grad norm is not finite (raised by the metrics callback under on_nonfinite=stop)."""


def kind(error: BaseException) -> str | None:
    """"nonfinite", "oom" or None (any other error: not ours to describe)."""
    import torch

    if isinstance(error, torch.OutOfMemoryError) or CPU_OOM in str(error):
        return "oom"
    if isinstance(error, NonFiniteStep) or MEGATRON_NONFINITE.search(str(error)):
        return "nonfinite"
    return None


def last_checkpoint(save_dir: str | None) -> str:
    """The newest checkpoint Bridge finished writing in `save_dir` (its tracker file), else "none"."""
    if not save_dir:
        return "none"
    from megatron.bridge.training.utils.checkpoint_utils import get_checkpoint_name, get_checkpoint_tracker_filename

    tracker = Path(get_checkpoint_tracker_filename(save_dir))
    if not tracker.is_file():
        return "none"
    return get_checkpoint_name(save_dir, int(tracker.read_text().strip()), release=False)


def oom_advice(run: RunConfig, res: Resolved) -> str:
    """The memory estimate's verdict and the overrides it suggests (the memory_fits message)."""
    from vlmtrain.check import memory
    from vlmtrain.check.preflight.memory import memory_message

    return memory_message(run, res, memory.estimate(run, res), "ran out of memory")


def record(run: RunConfig, res: Resolved, error: BaseException, *, rank: int, step: int | None,
           micro_batches: list[list[int | None]], component: str) -> dict[str, Any] | None:
    """Write this rank's failure record for a non-finite or OOM `error`; None (nothing written) for any other."""
    found = kind(error)
    if found is None:
        return None
    rec: dict[str, Any] = {"kind": found, "rank": rank, "step": step,
                           "error": f"{type(error).__name__}: {error}"[:2000],
                           "last_checkpoint": last_checkpoint(run.train.checkpoint_dir if run.train.save_interval
                                                              else None)}
    if found == "nonfinite":
        rec.update(micro_batches=micro_batches, on_nonfinite=run.train.on_nonfinite)
    else:
        rec.update(component=component, advice=oom_advice(run, res))
    path = Path(run.output_dir) / f"failure-rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    rec["path"] = str(path)
    return rec


def message(rec: dict[str, Any]) -> str:
    """One paragraph for the log."""
    step = rec["step"]
    # metrics.jsonl counts steps from 0; Bridge's log lines ("iteration N/M") from 1
    where = f"step {step}" + (f" (Bridge's log: iteration {step + 1})" if isinstance(step, int) else "")
    where += f" on rank {rec['rank']}"
    if rec["kind"] == "nonfinite":
        ids = rec["micro_batches"]
        culprit = ("any of them: the step's loss and grad norm were checked at its end"
                   if rec.get("on_nonfinite") == "stop_at_step_end"
                   else "the last one being the one whose loss was checked")
        return (f"[vlmtrain] STOPPED: non-finite loss or gradient at {where} ({rec['error'][:300]}). This rank's "
                f"micro-batches of that step held samples {ids} (sample_index: rows of the prepared dataset; "
                f"samples.jsonl lists every step's), {culprit}. "
                f"Last good checkpoint: {rec['last_checkpoint']}. Relaunching the same command resumes from it; "
                f"train.on_nonfinite=skip skips such steps instead. Record: {rec['path']}.")
    return (f"[vlmtrain] STOPPED: out of memory at {where} while in the {rec['component']} component "
            f"({rec['error'][:300]}). Memory estimate: {rec['advice']} Record: {rec['path']}.")


def read(run_dir: str | Path, since: float = 0.0) -> list[dict[str, Any]]:
    """Every failure record a run wrote, by rank (`since`: only those written at or after that time.time())."""
    out = []
    for path in sorted(Path(run_dir).glob(RECORD_GLOB)):
        try:
            if path.stat().st_mtime < since:
                continue
            out.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return out


def exit_status(rc: int, run_dir: str | Path, since: float) -> int:
    """train.py's status after a local launch: torchrun exits 1 for any failed rank, so a rank that stopped with a
    record written since the launch began gives its kind's status (4 non-finite, 5 OOM), and scripts can tell why."""
    if rc == 0:
        return rc
    recs = read(run_dir, since=since)
    return EXIT[recs[0]["kind"]] if recs else rc
