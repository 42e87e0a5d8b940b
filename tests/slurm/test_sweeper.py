"""The vlmtrain sweeper (preflight before launch, job numbering, failures) with Hydra's basic launcher, and
`hydra/launcher=slurm`'s resources per job. No Slurm needed: tests/slurm/test_slurm_sweep.py runs the real one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from vlmtrain import launch
from vlmtrain.compose import CONF_DIR
from vlmtrain.schema import register

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


def test_preflight_table_numbering_and_file(tmp_path: Path) -> None:
    out = multirun(tmp_path, "hydra.sweeper.preflight_only=true", "hardware=gb200,h100",
                   "train.micro_batch_size=1,2,3", "gpus_per_node=2")
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["launched"] == [[f"hardware={h}", f"train.micro_batch_size={m}", "gpus_per_node=2"]
                                  for h in ("gb200", "h100") for m in (1, 2)]
    assert [s["job"] for s in report["skipped"]] == [f"hardware={h} train.micro_batch_size=3 gpus_per_node=2"
                                                    for h in ("gb200", "h100")]
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
    assert out.returncode == 1
    assert message in out.stderr
    assert json.loads((tmp_path / "preflight.json").read_text())["launched"] == []
    assert job_dirs(tmp_path) == []


def test_failing_job_does_not_stop_the_sweep(tmp_path: Path) -> None:
    """Job 0 passes preflight (its rule is ignored) but Bridge's validation fails (status 3): the basic launcher
    still runs job 1, the sweep report is written, and the sweep exits 1 naming the failed job. Real dry runs
    (imports Bridge once, ~30-90 s)."""
    out = multirun(tmp_path, "dry_run=true", "train.global_batch_size=7,8",
                   "preflight.ignore=[global_batch_divisible]",
                   "+hydra.callbacks.report._target_=vlmtrain.report.ReportCallback", timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 of 2 launched job(s) failed" in out.stderr
    assert "#0 dry_run=True train.global_batch_size=7" in out.stderr
    assert "RunFailed: run ended with status 3" in out.stderr
    first, second = job_dirs(tmp_path)
    assert first.name.startswith("0_") and not (first / "bridge_config.yaml").exists()
    assert second.name.startswith("1_") and (second / "bridge_config.yaml").is_file()
    assert "sweep done: 1 of 2 launched job(s) completed, 1 failed" in out.stdout
    # on_multirun_end still ran (Hydra skips it when the sweep raises): the sweep report covers the failure
    assert (tmp_path / "report.md").is_file()


def test_rank_record_keeps_earlier_attempts(tmp_path: Path) -> None:
    """A requeued job restarts in the same run dir: the first attempt's record moves under "previous"."""
    first = {"rank": 0, "slurm": {"job_id": "7", "restart_count": None}, "env": {}}
    launch.write_rank_record(str(tmp_path), first)
    launch.write_rank_record(str(tmp_path), {**first, "signal": {"name": "SIGUSR2"}})  # same attempt: an update
    launch.write_rank_record(str(tmp_path), {**first, "slurm": {"job_id": "7", "restart_count": "1"}})
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert record["slurm"]["restart_count"] == "1"
    assert [(p["slurm"]["restart_count"], p["signal"]["name"]) for p in record["previous"]] == [(None, "SIGUSR2")]
