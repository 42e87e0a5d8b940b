"""The vlmtrain sweeper (preflight before launch, job numbering, failures) with Hydra's basic launcher, and
`hydra/launcher=slurm`'s resources per job. No Slurm needed: tests/slurm/test_slurm_sweep.py runs the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from vlmtrain.config import world
from vlmtrain.config.compose import CONF_DIR, compose
from vlmtrain.config.schema import register
from vlmtrain.launch import slurm

ROOT = Path(__file__).resolve().parents[2]


def multirun(tmp_path: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={tmp_path}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name[0].isdigit())


@pytest.mark.parametrize(("overrides", "resources"), [
    (["hardware=gb200"], (1, 4, 4)),
    (["hardware=h100"], (1, 8, 8)),
    (["hardware=h100", "nodes=2", "gpus_per_node=2"], (2, 2, 2)),
])
def test_slurm_resources_follow_the_job(overrides: list[str], resources: tuple[int, int, int]) -> None:
    """nodes / tasks per node / GPUs per node come from the job's nodes, gpus_per_node and hardware group."""
    register()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra.compose(config_name="train", overrides=["hydra/launcher=slurm", *overrides],
                            return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert (params["nodes"], params["tasks_per_node"], params["gpus_per_node"]) == resources
    assert params["_target_"].endswith("SlurmLauncher")
    assert params["signal_delay_s"] > 0 and params["max_num_timeout"] > 0
    assert "requeue" not in params["additional_parameters"]  # only when asked


def gpu_node(tmp_path: Path, gpus: int) -> dict[str, str]:
    """The environment of a node with `gpus` GPUs as world.local_gpus sees it: an `nvidia-smi -L` on PATH
    listing them (this machine has no GPU and no nvidia-smi; 0 = none on PATH)."""
    env = dict(os.environ)
    if gpus:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        lines = "\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})" for i in range(gpus))
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{lines}\nEOF\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


MBS_1_2 = ["hydra.sweeper.preflight_only=true", "train.micro_batch_size=1,2", "train.global_batch_size=8"]


@pytest.mark.parametrize(("gpus", "overrides", "world", "rows"), [
    # GBS 8 (set: unset, the defaults raise it) = MBS x DP x accumulation: MBS 2 fits 1 GPU, not the hardware's 8
    (1, [], "1 node x 1 GPU (local)", ["0", "1"]),
    (1, ["hydra/launcher=submitit_local"], "1 node x 1 GPU (local)", ["0", "1"]),
    (1, ["dry_run=true"], "1 node x 8 GPUs (declared, dry run)", ["0", "SKIP"]),
    (0, [], "1 node x 8 GPUs (declared, dry run)", ["0", "SKIP"]),
    (0, ["hydra/launcher=slurm", "dry_run=false", "hardware=h100"], "1 node x 8 GPUs (Slurm)", ["0", "SKIP"]),
    (0, ["hydra/launcher=slurm", "dry_run=false", "hydra.launcher.tasks_per_node=1",
         "hydra.launcher.gpus_per_node=1"], "1 node x 1 GPU (Slurm)", ["0", "1"]),
])
def test_jobs_are_checked_against_the_world_they_run_on(tmp_path: Path, gpus: int, overrides: list[str], world: str,
                                                         rows: list[str]) -> None:
    """A training job launched locally is checked on this node's GPUs, one sent to Slurm on the tasks per node its
    launcher requests, a dry run on what it declares (the hardware group's GPUs per node); the table says which."""
    cmd = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *MBS_1_2, *overrides]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=gpu_node(tmp_path, gpus))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if "train.micro_batch_size=" in line]
    assert [line.split()[0] for line in lines] == rows
    assert all(f"  {world}  " in line for line in lines), lines
    # preflight-only sweeps get their report too: the jobs that passed are not called failures
    assert "| #0 | passed preflight (preflight_only: not launched) |" in (tmp_path / "sweep" / "report.md").read_text()


def test_training_on_a_node_without_gpus_is_refused(tmp_path: Path) -> None:
    out = multirun(tmp_path, *MBS_1_2, "dry_run=false")
    assert out.returncode == 2
    assert out.stdout.count("[error] world: dry_run=false, but this node has no GPU") == 2
    assert "preflight rejected all 2 job(s)" in out.stderr


@pytest.mark.parametrize(("overrides", "node_gpus", "slurm_tasks", "expected"), [
    (["dry_run=true"], 4, None, (8, "declared, dry run")),
    (["dry_run=true", "gpus_per_node=2"], 4, 4, (2, "declared, dry run")),
    ([], 0, None, (8, "declared, dry run")),
    ([], 1, None, (1, "local")),
    (["gpus_per_node=2"], 4, None, (2, "local")),
    ([], 4, 4, (4, "Slurm")),
    (["hardware=gb200"], 4, 2, (2, "Slurm")),
])
def test_placement_rule(overrides: list[str], node_gpus: int, slurm_tasks: int | None,
                        expected: tuple[int, str]) -> None:
    """vlmtrain.config.world.placement, the rule train.py (vlmtrain.flow.main) and the sweeper both apply."""
    place = world.placement(compose(overrides), node_gpus, slurm_tasks_per_node=slurm_tasks)
    assert (place.gpus_per_node, place.where) == expected


def test_placement_refuses_training_without_a_gpu() -> None:
    with pytest.raises(world.NoGpuError, match="no GPU"):
        world.placement(compose(["dry_run=false"]), 0)


def test_preflight_table_numbering_and_file(tmp_path: Path) -> None:
    out = multirun(tmp_path, "hydra.sweeper.preflight_only=true", "hardware=gb200,h100",
                   "train.micro_batch_size=1,2,3", "gpus_per_node=2", "train.global_batch_size=8")
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["launched"] == [] and report["passed"] == [
        [f"hardware={h}", f"train.micro_batch_size={m}", "gpus_per_node=2", "train.global_batch_size=8"]
        for h in ("gb200", "h100") for m in (1, 2)]
    assert [s["job"] for s in report["skipped"]] == [
        f"hardware={h} train.micro_batch_size=3 gpus_per_node=2 train.global_batch_size=8" for h in ("gb200", "h100")]
    assert all(s["findings"][0].startswith("[error] global_batch_divisible: ") for s in report["skipped"])
    rows = [line.split()[0] for line in out.stdout.splitlines() if "train.micro_batch_size=" in line]
    assert rows == ["0", "1", "SKIP", "2", "3", "SKIP"]
    assert job_dirs(tmp_path) == []


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.global_batch_size=7,8", "preflight.fail_sweep=true"], "preflight.fail_sweep=true and 1 job(s)"),
    (["train.global_batch_size=7,9"], "preflight rejected all 2 job(s)"),
])
def test_nothing_launches_when_preflight_stops_the_sweep(tmp_path: Path, overrides: list[str], message: str) -> None:
    out = multirun(tmp_path, "dry_run=true", *overrides)
    assert out.returncode == 2  # refused before any GPU work, as train.py refuses one run
    assert message in out.stderr and "Traceback" not in out.stderr
    assert json.loads((tmp_path / "preflight.json").read_text())["launched"] == []
    assert job_dirs(tmp_path) == []


def test_failing_job_does_not_stop_the_sweep(tmp_path: Path) -> None:
    """Job 0 passes preflight (its rule is ignored) but Bridge's validation fails (status 3): the basic launcher
    still runs job 1, the sweep report is written, and the sweep exits 1 with one message naming the failed job and
    why, no traceback. Real dry runs (imports Bridge once, ~30-90 s)."""
    out = multirun(tmp_path, "dry_run=true", "train.global_batch_size=7,8",
                   "preflight.ignore=[global_batch_divisible]", timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "1 of 2 launched job(s) failed" in out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("  #0 ")]
    assert "train.global_batch_size=7" in line and ": refused (status 3): Bridge's validation FAILED for " in line
    first, second = job_dirs(tmp_path)
    assert first.name.startswith("0_") and not (first / "bridge_config.yaml").exists()
    assert second.name.startswith("1_") and (second / "bridge_config.yaml").is_file()
    assert "sweep done: 1 of 2 launched job(s) completed, 1 failed" in out.stdout
    # conf/train.yaml's report callback still ran (Hydra skips on_multirun_end when the sweeper does not return):
    # the sweep report covers both jobs, the failed one with the reason its plan gave
    md = (tmp_path / "report.md").read_text()
    assert "| #0 | refused before any GPU work | Bridge's validation FAILED for " in md
    assert "| #1 | dry run (planned, not trained) |" in md


def test_a_job_the_data_scan_refuses_is_reported_with_its_reason(tmp_path: Path) -> None:
    """Training jobs on a corrupt export (dry_run=false on a 1-GPU node): each is refused by the data scan before
    torchrun; the sweep ends with status 1, one message per job and why, no traceback, and the report quotes the
    scan where it said "incomplete: no metrics and no error in the logs". No Bridge import."""
    from vlmtrain.data.export import export

    data = export("jsonl", tmp_path / "data", corrupt=1)
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep}", *data["overrides"], "dry_run=false",
           "gpus_per_node=1", "train.micro_batch_size=1,2"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=gpu_node(tmp_path, 1))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "2 of 2 launched job(s) failed" in out.stderr
    assert out.stderr.count("refused (status 2): data=jsonl") == 2
    md = (sweep / "report.md").read_text()
    assert md.count("| refused before any GPU work | data=jsonl ") == 2 and "| incomplete |" not in md


def test_rank_record_keeps_earlier_attempts(tmp_path: Path) -> None:
    """A requeued job restarts in the same run dir: the first attempt's record moves under "previous"."""
    first = {"rank": 0, "slurm": {"job_id": "7", "restart_count": None}, "env": {}}
    slurm.write_rank_record(str(tmp_path), first)
    slurm.write_rank_record(str(tmp_path), {**first, "signal": {"name": "SIGUSR2"}})  # same attempt: an update
    slurm.write_rank_record(str(tmp_path), {**first, "slurm": {"job_id": "7", "restart_count": "1"}})
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert record["slurm"]["restart_count"] == "1"
    assert [(p["slurm"]["restart_count"], p["signal"]["name"]) for p in record["previous"]] == [(None, "SIGUSR2")]


def test_a_path_override_keeps_each_job_dir_one_level_down(tmp_path: Path) -> None:
    """A path value in the overrides (train.checkpoint_dir=/...) stays inside the job's directory name: Hydra's
    override_dirname keeps its '/', which nested the job's run dir four levels under the sweep dir, where neither
    the sweep report nor the Slurm preemption check looked (GPU run of 2026-12-02). Real dry runs."""
    out = multirun(tmp_path, "dry_run=true", f"train.checkpoint_dir={tmp_path}/ckpt/a", "train.iterations=2,3",
                   timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    jobs = job_dirs(tmp_path)
    assert [j.name[:2] for j in jobs] == ["0_", "1_"]
    for job in jobs:
        assert f"train.checkpoint_dir={str(tmp_path).replace('/', '_')}_ckpt_a" in job.name
        assert (job / "bridge_config.yaml").is_file()
