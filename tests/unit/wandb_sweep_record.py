"""Records tests/fixtures/wandb_sweep_mbs: the W&B offline runs the recorded MBS sweep (tests/fixtures/gpu_acceptance/
tiny_sweep_mbs, 1x H200) writes with W&B on, through vlmtrain's own W&B code and the real wandb library.

    PYTHONPATH=src .venv/bin/python tests/unit/wandb_sweep_record.py

Each job's W&B run is opened by observe.wandb_run.init from the job's saved run_config.yaml (wandb.enabled=true, its
directory without the `wandb.enabled=False` override; Bridge's real ConfigContainer built from it), gets every
metrics.jsonl row through wandb_run.log_row and, at the same iterations, Bridge's own numbers as its log printed
them (ranks.log's `iteration N/ M | ...` lines), logged through Bridge's GlobalState.wandb_logger under the names
Bridge's training_log gives them; then wandb_run.summarize with the job's checks.json and rows, and Bridge's finish.
Only the .wandb record logs are kept: what the views read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "gpu_acceptance" / "tiny_sweep_mbs"
FIXTURE = ROOT / "tests" / "fixtures" / "wandb_sweep_mbs"
WANDB_OFF = ",wandb.enabled=False"
"""The recorded sweep's override that kept W&B off; the fixture's job dirs are named without it."""
BRIDGE_NAMES = {"consumed samples": "samples vs steps", "learning rate": "learning-rate",
                "global batch size": "batch-size", "lm loss": "lm loss", "load_balancing_loss": "load_balancing_loss",
                "grad norm": "grad-norm"}
"""Bridge's console names (training_log's log string) -> the W&B keys training_log and the MoE tracker log."""
SKIPPED = "number of skipped iterations"
"""Bridge's count of skipped updates per logged iteration: the rows of this sweep predate metrics.jsonl's
cumulative `skipped_steps`, which the recording takes from it."""
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|(.*)$")


def bridge_numbers(log: Path) -> dict[int, dict[str, float]]:
    """Bridge's printed numbers per iteration, by their console names."""
    out: dict[int, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        if m := ITERATION.search(line):
            pairs = (p.split(":", 1) for p in m.group(2).split("|") if ":" in p)
            out[int(m.group(1))] = {k.strip(): float(v) for k, v in pairs}
    return out


def record_job(job: Path) -> Path:
    """One job's W&B run, written where the job ran (its run_config.yaml's output_dir, under /tmp/acc); returns its
    .wandb record log."""
    from megatron.bridge.training.state import GlobalState

    from vlmtrain.build import container
    from vlmtrain.config.compose import load_run
    from vlmtrain.config.resolve import resolve
    from vlmtrain.observe import keys, wandb_run
    from vlmtrain.observe.run_summary import read_jsonl
    from vlmtrain.report.wandb_runs import read_wandb_file

    run = load_run(job / "run_config.yaml")
    run.wandb.enabled = True
    run.output_dir = run.output_dir.replace(WANDB_OFF, "")
    run.train.checkpoint_dir = str(run.train.checkpoint_dir).replace(WANDB_OFF, "")
    res = resolve(run)
    bridge_cfg = container.build(run, res)
    state = GlobalState()
    state._cfg = bridge_cfg  # the cfg setter would also install Bridge's signal handler in this process
    wb = wandb_run.init(run, bridge_cfg, res)
    wandb_run.hand_to_bridge(state, wb)
    rows = read_jsonl(job / "metrics.jsonl")
    bridge = bridge_numbers(job / "ranks.log")
    skipped = 0
    for row in rows:
        printed = bridge[row["step"] + 1]
        skipped += int(printed[SKIPPED])
        row.setdefault(keys.SKIPPED_STEPS, skipped)
        wandb_run.log_row(wb, row)
        for name, key in BRIDGE_NAMES.items():  # training_log logs one key per call
            state.wandb_logger.log({key: printed[name]}, row["step"] + 1)
    wandb_run.summarize(wb, json.loads((job / "checks.json").read_text()), rows)
    state.wandb_logger.finish()
    [record] = sorted(Path(run.output_dir).glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + 120  # W&B's service process writes the record log after finish() returns
    while read_wandb_file(record)["exit_code"] is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return record


def main() -> None:
    os.environ["WANDB_MODE"] = "offline"
    shutil.rmtree(FIXTURE, ignore_errors=True)
    for job in sorted(d for d in RECORDED.iterdir() if (d / "metrics.jsonl").exists()):
        record = record_job(job)
        run_dir = record.parents[2]
        target = FIXTURE / run_dir.name / record.relative_to(run_dir)
        target.parent.mkdir(parents=True)
        shutil.copy2(record, target)
        shutil.rmtree(run_dir / "wandb")
        print(f"recorded {target.relative_to(ROOT)} ({target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
