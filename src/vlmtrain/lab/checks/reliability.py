"""The GPU reliability checks: each runs a real tiny `python train.py` on one GPU and
returns (passed, metrics) from what the run wrote. This module's command runs them and appends a row per check to
results/reliability.jsonl (a check that raises still writes its row, with the reason); tests/gpu/test_reliability.py
asserts the same checks.

    vlmtrain lab reliability [--only secrets,oom] [--out outputs/reliability]
    vlmtrain lab reliability --only kill_ckpt_3d,kill_ckpt_3d_async    # ~3-4 min on one H200

- secrets: planted env secrets (WANDB_API_KEY, HF_TOKEN, HUGGING_FACE_HUB_TOKEN) and `+bridge.logger.*` overrides
  holding them, 4 steps with a checkpoint every 2; every file of the run dir and the checkpoint dir (Bridge's
  iter_*/run_config.yaml included) and the run's output are searched for each secret.
- nonfinite_stop: `+bridge.model.init_method_std=1e20` makes the first forward overflow BF16, so the loss is NaN at
  step 0 (a way to a real NaN, not yet seen on a GPU: if the loss stays finite the check fails saying so); the
  run must stop with exit status 4 and a record naming step 0, its sample ids and "none" (no checkpoint yet).
- nonfinite_stop_at_step_end: the same with train.on_nonfinite=stop_at_step_end (Megatron's checks off, the step's
  loss and grad norm checked at its end): the same status and record.
- nonfinite_skip: the same with train.on_nonfinite=skip: the run ends normally and metrics.jsonl counts every
  step as skipped.
- oom: MBS 256 at seq 4096 (the logits alone need ~1 TB; preflight.ignore=[memory_fits]) must stop (status 5) with a
  record naming the component (the logits are the decoder's) and the estimate's suggested overrides.
- kill_ckpt_3d, kill_ckpt_3d_async, kill_ckpt_fsdp: SIGKILL while a checkpoint is being written (torch_dist
  sync and async save, fsdp_dtensor sync); the previous checkpoint stays the one Bridge loads and the relaunch
  resumes from it with the uninterrupted run's losses (vlmtrain.lab.checks.kill_checkpoint).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from vlmtrain.lab.checks.kill_checkpoint import MODES, kill_mid_checkpoint
from vlmtrain.lab.kit import experiments, runner, store
from vlmtrain.lab.kit.baselines import TINY
from vlmtrain.lab.kit.case import Case
from vlmtrain.observe import failure, run_summary, timing

SECRETS = {"WANDB_API_KEY": "wandb-gpu-planted-7d6c5b4a", "HF_TOKEN": "hf_gpuPlantedToken3e2d1c",
           "HUGGING_FACE_HUB_TOKEN": "hfhub-gpu-planted-9f8e7d"}
SECRET_OVERRIDES = ["+bridge.logger.wandb_exp_name=exp-${oc.env:HF_TOKEN}",
                    "+bridge.logger.wandb_entity=" + SECRETS["HUGGING_FACE_HUB_TOKEN"]]
NAN_INIT = "+bridge.model.init_method_std=1e20"


def tiny(name: str, *overrides: str) -> Case:
    """A check's run: the tiny model on one GPU, 2 samples a step in micro-batches of 1."""
    return Case(name, 1, [*TINY, "train.global_batch_size=2", "train.micro_batch_size=1", *overrides], dry_run=False)


def train(run_dir: Path, case: Case, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The case's run into run_dir, its output in run_dir/console.txt; (exit status, its output)."""
    run = runner.start(case, run_dir, log=run_dir / "console.txt", env=env)
    rc = run.wait()
    return rc, run.log.read_text(errors="replace")


def secrets(out: Path) -> tuple[bool, dict[str, Any], str]:
    ckpt = out / "secrets_ckpt"
    case = tiny("secrets", "train.iterations=4", "train.save_interval=2", f"train.checkpoint_dir={ckpt}",
                "wandb.mode=offline", *SECRET_OVERRIDES)  # W&B on, offline: its files are searched too
    rc, output = train(out / "secrets", case, SECRETS)
    files = [p for root in (out / "secrets", ckpt) for p in root.rglob("*") if p.is_file()]
    hits = {name: [str(p) for p in files if v.encode() in p.read_bytes()] + (["output"] if v in output else [])
            for name, v in SECRETS.items()}
    configs = sorted(ckpt.glob("iter_*/run_config.yaml"))
    redacted = bool(configs) and all("<redacted>" in p.read_text() for p in configs)
    metrics = {"rc": rc, "files_searched": len(files), "checkpoint_run_configs": len(configs),
               "checkpoint_configs_redacted": redacted, "leaks": {k: v for k, v in hits.items() if v}}
    return rc == 0 and redacted and not metrics["leaks"], metrics, runner.recorded(case)


def nonfinite_stop(out: Path, mode: str = "stop") -> tuple[bool, dict[str, Any], str]:
    run_dir = out / ("nonfinite_stop" if mode == "stop" else f"nonfinite_{mode}")
    case = tiny(run_dir.name, "train.iterations=3", NAN_INIT, f"train.on_nonfinite={mode}")
    rc, output = train(run_dir, case)
    recs = failure.read(run_dir)
    rec = recs[0] if recs else {}
    ids = [i for mb in rec.get("micro_batches", []) for i in mb]
    metrics = {"rc": rc, "records": len(recs), "kind": rec.get("kind"), "step": rec.get("step"),
               "sample_ids": rec.get("micro_batches"), "last_checkpoint": rec.get("last_checkpoint"),
               "paragraph_in_log": "STOPPED: non-finite" in output, "error": rec.get("error", output[-500:])}
    ok = (rc == failure.EXIT["nonfinite"] and rec.get("kind") == "nonfinite" and rec.get("step") == 0 and bool(ids)
          and all(isinstance(i, int) for i in ids) and rec.get("last_checkpoint") == "none"
          and metrics["paragraph_in_log"])
    return ok, metrics, runner.recorded(case)


def nonfinite_skip(out: Path) -> tuple[bool, dict[str, Any], str]:
    case = tiny("nonfinite_skip", "train.iterations=3", NAN_INIT, "train.on_nonfinite=skip")
    rc, _ = train(out / "nonfinite_skip", case)
    rows = run_summary.read_jsonl(out / "nonfinite_skip" / "metrics.jsonl")
    skipped = [r.get("skipped_steps") for r in rows]
    metrics = {"rc": rc, "steps": len(rows), "skipped_steps": skipped,
               "records": len(failure.read(out / "nonfinite_skip"))}
    return rc == 0 and len(rows) == 3 and skipped == [1, 2, 3], metrics, runner.recorded(case)


def oom(out: Path) -> tuple[bool, dict[str, Any], str]:
    case = tiny("oom", "train.micro_batch_size=256", "train.global_batch_size=256", "train.iterations=2",
                "data.pad_to_max_length=true", "preflight.ignore=[memory_fits]")
    rc, output = train(out / "oom", case)
    recs = failure.read(out / "oom")
    rec = recs[0] if recs else {}
    metrics = {"rc": rc, "records": len(recs), "kind": rec.get("kind"), "component": rec.get("component"),
               "step": rec.get("step"), "advice": rec.get("advice"),
               "paragraph_in_log": "STOPPED: out of memory" in output}
    components = (*timing.COMPONENTS, timing.OTHER)
    ok = rc == failure.EXIT["oom"] and rec.get("kind") == "oom" and rec.get("component") in components
    return ok and "train.micro_batch_size" in (rec.get("advice") or ""), metrics, runner.recorded(case)


CHECKS: dict[str, Callable[[Path], tuple[bool, dict[str, Any], str]]] = {
    "secrets": secrets, "nonfinite_stop": nonfinite_stop,
    "nonfinite_stop_at_step_end": partial(nonfinite_stop, mode="stop_at_step_end"), "nonfinite_skip": nonfinite_skip,
    "oom": oom,
    **{f"kill_ckpt_{mode}": partial(kill_mid_checkpoint, mode=mode) for mode in MODES}}


def checks(text: str) -> list[str]:
    """--only's names, each one of CHECKS (refused at parse time otherwise)."""
    names = text.split(",")
    if unknown := [n for n in names if n not in CHECKS]:
        raise argparse.ArgumentTypeError(f"unknown check(s) {unknown}: --only takes a comma-separated list of "
                                         f"{', '.join(CHECKS)}")
    return names


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", default=list(CHECKS), type=checks,
                    help=f"a comma-separated list of {', '.join(CHECKS)}")
    experiments.add_out(ap, "reliability")
    experiments.add_results(ap, "reliability.jsonl")


def run(a: argparse.Namespace) -> int:
    ok = True
    for name in a.only:
        print(f"[reliability] {name} ...", flush=True)
        try:
            passed, metrics, cmd = CHECKS[name](a.out)
        except Exception as e:  # noqa: BLE001 - a failing check is a row with its reason, not a crash without one
            passed, metrics, cmd = False, {"reason": f"{type(e).__name__}: {e}"}, "(the check raised before its run)"
        store.append(a.results, f"reliability_{name}_tiny_1gpu", cmd, {**metrics, "passed": passed},
                       runner=f"{experiments.command(__name__)} --only {name}")
        print(json.dumps({"check": name, "passed": passed, **metrics}, default=str), flush=True)
        ok &= passed
    return 0 if ok else 1
