"""The Hugging Face round trip on one GPU, per model family: a Hugging Face checkpoint in, training, a Hugging
Face checkpoint out, each step checked against transformers. One row per check appended to `--results`.

    vlmtrain lab verification --results results/verification.jsonl [--families qwen3_vl qwen35_vl]
        [--checks parity_trained export_fsdp ...]

Per family (qwen3_vl: Qwen3-VL-MoE; qwen35_vl: Qwen3.5-MoE), in `--work`/<family>:

1. `tiny_hf.build`: a random-init checkpoint of the real config layout, saved with transformers' save_pretrained.
2. parity_import: logits of a real-photo prompt, transformers vs vlmtrain's model imported from it
   (vlmtrain.lab.checks.hf_parity, whose docstring justifies the tolerance).
3. resume: run A trains STEPS steps uninterrupted (`model.hf_path=<dir>`, `vision=frozen`, parallelism=3d:
   torch_dist checkpoints every SAVE_INTERVAL steps); run B, the same command on its own checkpoint dir, is killed
   once it has checkpointed and logged step KILL_AFTER, then relaunched (vlmtrain.lab.checks.resume's pattern);
   its losses from the checkpoint on must match A's within resume.TOLERANCE.
4. export: `vlmtrain export <run A dir> --out <dir>`, the real command.
5. reload: the export through transformers' from_pretrained, every weight found and none left over.
6. frozen: the exported ViT weights (vision=frozen: every `model.visual.*` but the mergers) bit-identical to the
   input checkpoint's, and at least one language-model weight changed by training (the control).
7. parity_trained: logits of the exported model in transformers vs run A's trained model loaded from its checkpoint.
8. export_fsdp, reload_fsdp, frozen_fsdp: run C, the same model on parallelism=fsdp (Megatron-FSDP, fsdp_dtensor
   checkpoints) for SAVE_INTERVAL steps, then steps 4-6 on its last checkpoint (the other format `vlmtrain export`
   reads).

Every row's metrics carry `cosine` and `max_abs_diff` (logits for the parity rows, weights for frozen, the loss
curves for resume; null for export and reload, which compare nothing numeric), `passed`, and `wall_s`: the seconds
since the family's previous row (or its start), so a later GPU run can be planned to fit a time limit.
`--checks` runs a subset with what it rests on: `parity_trained` alone trains run A and exports it (the export's row
is written too), but skips run B.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmtrain.config.groups.model import Family
from vlmtrain.lab.checks import resume, tiny_hf
from vlmtrain.lab.kit import experiments, runner, store
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.kit.runner import ROOT

Emit = Callable[[str, str, dict[str, Any]], None]
"""emit(check, command, metrics): writes a check's row (writer)."""
LAYERS = 4
STEPS = 8
SAVE_INTERVAL = 4
KILL_AFTER = 5
"""B is killed once it has logged step 5 (0-based) with step 4's checkpoint written: it resumes from 4."""
FAMILIES = ("qwen3_vl", "qwen35_vl")
CHECKS = ("parity_import", "resume", "export", "reload", "frozen", "parity_trained", "export_fsdp", "reload_fsdp",
          "frozen_fsdp")
"""`--checks` runs a subset in a fresh work dir, with the runs it rests on (Qwen3.5's whole family, kernels compiled
on first use, takes about 12 minutes on an H100: split it over shorter GPU jobs)."""
TIMEOUT_S = 600


def frozen(name: str) -> bool:
    """vision=frozen freezes the ViT and trains its mergers (conf/vision/frozen.yaml)."""
    return name.startswith("model.visual.") and "merger" not in name


def tensors(hf_dir: Path) -> dict[str, Any]:
    """Every tensor of an HF checkpoint dir, sharded or not."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def weight_check(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Frozen tensors bit-identical, and at least one language-model tensor changed (the training was real)."""
    import torch

    names = sorted(n for n in before if frozen(n))
    missing = [n for n in names if n not in after]
    shared = [n for n in names if n in after]
    differ = [n for n in shared if not torch.equal(before[n], after[n])]
    a = torch.cat([before[n].double().flatten() for n in shared]) if shared else torch.zeros(1)
    b = torch.cat([after[n].double().flatten() for n in shared]) if shared else torch.zeros(1)
    lm = [n for n in before if n.startswith("model.language_model.") and n in after]
    changed = sum(not torch.equal(before[n], after[n]) for n in lm)
    return {"cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
            "max_abs_diff": float((a - b).abs().max()), "frozen_tensors": len(names), "frozen_differ": differ,
            "frozen_missing": missing, "language_tensors_changed": changed,
            "passed": bool(shared) and not differ and not missing and changed > 0}


def loss_check(ref: dict[int, float], got: dict[int, float], checkpoint_step: int | None) -> dict[str, Any]:
    """The resumed run's losses against the uninterrupted run's over the steps both logged."""
    import torch

    shared = [s for s in sorted(got) if s in ref]
    a = torch.tensor([ref[s] for s in shared] or [0.0], dtype=torch.float64)
    b = torch.tensor([got[s] for s in shared] or [1.0], dtype=torch.float64)
    diff = resume.max_loss_diff(ref, got)
    return {"cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)), "max_abs_diff": diff,
            "tolerance": resume.TOLERANCE, "checkpoint_step": checkpoint_step,
            "first_step_after_resume": min(got, default=None), "steps_compared": len(shared),
            "passed": checkpoint_step is not None and bool(shared) and diff <= resume.TOLERANCE}


def python(args: list[str], log: Path, gpu: int) -> int:
    """A `python -m ...` step in a process of its own (its own CUDA context and process group), logged to `log`;
    past TIMEOUT_S its tree is killed and its status is -9."""
    return runner.spawn([sys.executable, "-m", *args], log.parent, log=log, gpus=[gpu], timeout_s=TIMEOUT_S).wait()


def parity(work: Path, name: str, reference: Path, option: str, gpu: int, hf: Path | None = None,
           megatron: Path | None = None) -> tuple[str, dict[str, Any]]:
    args = ["vlmtrain.lab.checks.hf_parity", "--reference", str(reference), "--model-option", option,
            "--out", str(work / f"{name}.json")]
    args += ["--hf", str(hf)] if hf else []
    args += ["--megatron", str(megatron)] if megatron else []
    rc = python(args, work / f"{name}.log", gpu)
    result = work / f"{name}.json"
    metrics = json.loads(result.read_text()) if result.is_file() else {"cosine": None, "max_abs_diff": None,
                                                                        "passed": False}
    return "python -m " + " ".join(args), {**metrics, "rc": rc}


def reload(export: Path) -> dict[str, Any]:
    """from_pretrained of the export on CPU: every weight of the model class found in the files, none left over."""
    import torch
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(str(export), dtype=torch.bfloat16,
                                                              local_files_only=True, output_loading_info=True)
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    return {"cosine": None, "max_abs_diff": None, "class": type(model).__name__, "missing_keys": missing,
            "unexpected_keys": unexpected, "passed": not missing and not unexpected}


def needed(checks: tuple[str, ...]) -> dict[str, bool]:
    """Which runs and exports the asked checks rest on (run A: 3d with a checkpoint of step STEPS; B: the killed and
    resumed run; C: fsdp)."""
    on = set(checks)
    export = bool(on & {"export", "reload", "frozen", "parity_trained"})
    return {"a": export or "resume" in on, "b": "resume" in on, "export": export,
            "c": bool(on & {"export_fsdp", "reload_fsdp", "frozen_fsdp"})}


def family_checks(family: str, work: Path, gpu: int, emit: Emit, checks: tuple[str, ...] = CHECKS) -> None:
    """The steps of the module docstring for one family that `checks` (names of CHECKS) rest on; a step another
    rests on (an export) writes its row too. `emit(check, command, metrics)` writes a row."""
    shutil.rmtree(work, ignore_errors=True)  # a left-over checkpoint dir would make a run resume
    work.mkdir(parents=True)
    option = tiny_hf.OPTIONS[Family(family)]
    hf = tiny_hf.build(family, work / "hf", num_layers=LAYERS)
    model = [f"model={option}", f"model.num_layers={LAYERS}", f"model.hf_path={hf}", "vision=frozen"]
    need, runs = needed(checks), training(work, model)
    if "parity_import" in checks:
        emit("parity_import", *parity(work, "parity_import", hf, option, gpu))
    if need["a"]:
        checks_3d(work, hf, option, runs, gpu, emit, checks)
    if need["c"]:
        checks_fsdp(work, hf, runs["c"], gpu, emit, checks)


def training(work: Path, model: list[str]) -> dict[str, Case]:
    """The family's training runs, each with its own checkpoint dir: A (3d, STEPS steps, a checkpoint every
    SAVE_INTERVAL), B (A's training, killed after it logged step KILL_AFTER, then relaunched) and C (fsdp,
    SAVE_INTERVAL steps)."""
    def run(name: str, parallelism: str, iterations: int) -> Case:
        return resume.case(name, parallelism, work / f"ckpt_{name}", iterations=iterations,
                           save_interval=SAVE_INTERVAL, model=model)

    return {"a": run("a", "3d", STEPS), "b": run("b", "3d", STEPS), "c": run("c", "fsdp", SAVE_INTERVAL)}


def checks_3d(work: Path, hf: Path, option: str, runs: dict[str, Case], gpu: int, emit: Emit,
              checks: tuple[str, ...]) -> None:
    """Steps 3-7: runs A and B (resume), export, reload, frozen, parity of the trained model."""
    need, a, b_case = needed(checks), runs["a"], runs["b"]
    run_a = resume.launch(a, work / "a", gpu)  # B runs beside A
    b = kill_and_resume(b_case, work, gpu) if need["b"] else None
    rc_a = run_a.wait()
    if b is not None:
        checked = loss_check(resume.losses(work / "a"), resume.losses(work / "b_resumed"), b["checkpoint_step"])
        emit("resume", runner.recorded(b_case), {**checked, "killed_after_step": b["killed_after_step"],
                                                 "rc_uninterrupted": rc_a, "rc_resumed": b["rc_resumed"],
                                                 "passed": checked["passed"] and rc_a == b["rc_resumed"] == 0})
    if not need["export"]:
        return
    if rc_a != 0:
        emit("export", runner.recorded(a), {"cosine": None, "max_abs_diff": None, "rc_train": rc_a,
                                                 "passed": False})
        return
    export = export_checks(work, "a", "", hf, gpu, emit, checks)
    if export is not None and "parity_trained" in checks:
        last = work / "ckpt_a" / f"iter_{STEPS:07d}"
        emit("parity_trained", *parity(work, "parity_trained", export, option, gpu, hf=hf, megatron=last))


def kill_and_resume(b: Case, work: Path, gpu: int) -> dict[str, Any]:
    """Run B: killed once it has checkpointed and logged step KILL_AFTER, then relaunched unchanged."""
    killed_at = resume.kill_after(resume.launch(b, work / "b_killed", gpu), work / "ckpt_b", work / "b_killed",
                                  KILL_AFTER)
    checkpoint_step = resume.tracker(work / "ckpt_b")
    return {"killed_after_step": killed_at, "checkpoint_step": checkpoint_step,
            "rc_resumed": resume.launch(b, work / "b_resumed", gpu).wait()}


def checks_fsdp(work: Path, hf: Path, c: Case, gpu: int, emit: Emit, checks: tuple[str, ...]) -> None:
    """Step 8: run C on Megatron-FSDP, then export, reload and frozen on its fsdp_dtensor checkpoint."""
    rc_c = resume.launch(c, work / "c", gpu).wait()
    if rc_c != 0:
        emit("export_fsdp", runner.recorded(c), {"cosine": None, "max_abs_diff": None, "rc_train": rc_c,
                                                      "passed": False})
        return
    export_checks(work, "c", "_fsdp", hf, gpu, emit, checks)


def export_checks(work: Path, run: str, suffix: str, hf: Path, gpu: int, emit: Emit,
                  checks: tuple[str, ...]) -> Path | None:
    """`vlmtrain export` of run dir `run`, then reload and frozen (those asked) on its output (rows export<suffix>,
    ...); the export dir, or None when the command failed."""
    export = work / f"export{suffix}"
    args = ["vlmtrain.cli", "export", str(work / run), "--out", str(export)]
    rc = python(args, work / f"export{suffix}.log", gpu)
    files = sorted(p.name for p in export.iterdir()) if export.is_dir() else []
    emit(f"export{suffix}", "python -m " + " ".join(args),
         {"cosine": None, "max_abs_diff": None, "rc": rc, "files": files, "passed": rc == 0 and "config.json" in files})
    if rc != 0:
        return None
    if f"reload{suffix}" in checks:
        emit(f"reload{suffix}", f"AutoModelForImageTextToText.from_pretrained({export})", reload(export))
    if f"frozen{suffix}" in checks:
        emit(f"frozen{suffix}", f"safetensors of {hf} vs {export}", weight_check(tensors(hf), tensors(export)))
    return export


def writer(results: Path, family: str, driver: str, verdicts: list[bool],
           commit: str) -> Emit:
    """`emit(check, command, metrics)`: appends the family's row for `check` with `wall_s` (seconds since its
    previous row, or since this writer was made) and the commit checked, prints it and keeps its verdict."""
    since = time.monotonic()

    def emit(check: str, command: str, metrics: dict[str, Any]) -> None:
        nonlocal since
        now = time.monotonic()
        metrics = {**metrics, "wall_s": round(now - since, 1)}
        since = now
        row = store.append(results, f"verify_{family}_{check}", command, metrics, passed=bool(metrics["passed"]),
                           runner=driver, commit=commit)
        verdicts.append(row["passed"])
        print(json.dumps({"name": row["name"], "passed": row["passed"], "cosine": metrics.get("cosine"),
                          "max_abs_diff": metrics.get("max_abs_diff"), "wall_s": metrics["wall_s"]}), flush=True)

    return emit


def add_arguments(ap: argparse.ArgumentParser) -> None:
    experiments.add_results(ap, "verification.jsonl")
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "verification")
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    ap.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS),
                    help="a subset, with the runs and exports it rests on (their rows too)")
    ap.add_argument("--gpu", type=int, default=0)
    experiments.add_commit(ap)


def run(a: argparse.Namespace) -> int:
    driver = (f"{experiments.command(__name__)} --families {' '.join(a.families)} "
              f"--checks {' '.join(a.checks)} --gpu {a.gpu}")
    verdicts: list[bool] = []

    for family in a.families:
        emit = writer(a.results, family, driver, verdicts, a.commit)
        family_checks(family, a.work / family, a.gpu, emit, tuple(a.checks))
    return 0 if verdicts and all(verdicts) else 1
