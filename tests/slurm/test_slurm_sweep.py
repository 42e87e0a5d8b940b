"""A real `-m` sweep through hydra-submitit-launcher on the single-node Slurm that .ci/run starts (.ci/slurm.sh:
fake GPUs, accounting). Each job runs the real vlmtrain task as a dry run in two Slurm tasks: both map Slurm's
variables to torch.distributed's and record them in <run dir>/rank<R>.json, rank 0 builds and validates the
Bridge ConfigContainer and writes bridge_config.yaml. Jobs preflight rejects are never submitted.

Runtime on 2 cores (NCPUS=8 FAKE_GPUS=8, as .ci/run starts it): ~2 min for the sweep (two jobs side by side, each
rank importing Bridge), ~2.5 min for the requeue test (two attempts plus Slurm's requeue delay, CRED_EXPIRE+1 s).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
GPUS = 2  # fake GPUs (and tasks) per job
SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.timeout_min=20", f"gpus_per_node={GPUS}", "dry_run=true"]


def _sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def slurm() -> None:
    """Skip (with the reason) unless the local Slurm is up, idle, accounts jobs and has >= 2 GPUs on the node."""
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm here (sinfo missing): .ci/run starts it with .ci/slurm.sh start")
    state = _sh("sinfo", "-h", "-n", "localhost", "-o", "%T").stdout.strip()
    if state != "idle":
        pytest.skip(f"Slurm node localhost is {state or 'absent'!r}, not idle (bash .ci/slurm.sh start)")
    if _sh("sacct", "-n", "-X", "-S", "now").returncode:
        pytest.skip("Slurm accounting is off (sacct fails): submitit could wait forever on a lost job")
    gres = _sh("sinfo", "-h", "-n", "localhost", "-o", "%G").stdout.strip()
    gpus = re.search(r"gpu:(\d+)", gres)
    if not gpus or int(gpus.group(1)) < GPUS:
        pytest.skip(f"the Slurm node has fewer than {GPUS} (fake) GPUs: gres {gres!r}")


def run_dirs(sweep_dir: Path) -> dict[int, Path]:
    return {int(p.name.split("_", 1)[0]): p for p in sweep_dir.iterdir() if p.is_dir() and p.name[0].isdigit()}


def sacct_states(job: str, timeout_s: float = 120) -> list[str]:
    """Every state the job went through (-D: requeued attempts too), array tasks as <array>_<task>|STATE, once
    Slurm has recorded the end (the launcher returns on the result file, while the task may still be exiting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = _sh("sacct", "-n", "-X", "-D", "-P", "-j", job, "--format=JobID,State")
        assert out.returncode == 0, out.stderr
        states = [line for line in out.stdout.split() if line]
        if not any(s.endswith(("|RUNNING", "|PENDING", "|COMPLETING")) for s in states) or time.monotonic() > deadline:
            return states
        time.sleep(2)


def train_value(bridge_config: Path, section: str, key: str) -> str:
    """A top-level section's scalar in Bridge's to_yaml() output (no custom YAML tags needed)."""
    text = bridge_config.read_text()
    body = re.search(rf"^{section}:\n((?:[ \t]+.*\n)+)", text, re.M)
    assert body, f"no {section}: section in {bridge_config}"
    value = re.search(rf"^  {key}: (.*)$", body.group(1), re.M)
    assert value, f"no {section}.{key} in {bridge_config}"
    return value.group(1).strip()


def test_slurm_sweep(slurm: None, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # a global batch the user set is kept, and refused where it does not divide (unset, the defaults would fit it)
    cmd = [sys.executable, "train.py", "-m", *SLURM, "train.global_batch_size=8", f"hydra.sweep.dir={sweep}",
           "hardware=gb200,h100", "train.micro_batch_size=2,3"]
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    print(f"slurm sweep wall time: {time.monotonic() - start:.0f} s")
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert "sweep done: 2 of 2 launched job(s) completed" in out.stdout

    # preflight: MBS 3 (GBS 8 is not a multiple of 3 x DP 2) is skipped on both hardware kinds, never submitted
    report = json.loads((sweep / "preflight.json").read_text())
    assert [s["job"] for s in report["skipped"]] == [
        f"gpus_per_node={GPUS} dry_run=True train.global_batch_size=8 hardware={h} train.micro_batch_size=3"
        for h in ("gb200", "h100")]
    expected = {i: (h, 2) for i, h in enumerate(("gb200", "h100"))}
    assert report["launched"] == [[f"gpus_per_node={GPUS}", "dry_run=True", "train.global_batch_size=8",
                                   f"hardware={h}", f"train.micro_batch_size={m}"] for h, m in expected.values()]
    dirs = run_dirs(sweep)
    assert sorted(dirs) == sorted(expected)
    assert not any("micro_batch_size=3" in p.name for p in sweep.iterdir())
    # dry runs are checked against the world they declare, and the table says so
    assert out.stdout.count(f"  1 node x {GPUS} GPUs (declared, dry run)  ") == 4
    # conf/train.yaml's report callback (pickled into the submitit jobs too) wrote the sweep report
    md = (sweep / "report.md").read_text()
    assert md.count("| dry run (planned, not trained) |") == 2 and md.count("| skipped by preflight |") == 2

    array_ids = set()
    for num, (hw, mbs) in expected.items():
        run_dir = dirs[num]
        assert f"hardware={hw}" in run_dir.name and f"train.micro_batch_size={mbs}" in run_dir.name
        # per-job output: rank 0's Bridge config for this job's MBS
        assert train_value(run_dir / "bridge_config.yaml", "train", "micro_batch_size") == str(mbs)
        ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(GPUS)]
        for r, rec in enumerate(ranks):
            assert (rec["rank"], rec["local_rank"], rec["world_size"], rec["local_world_size"]) == (r, r, GPUS, GPUS)
            assert rec["master_addr"] == "localhost" and rec["master_port"] == ranks[0]["master_port"]
            assert rec["slurm"]["procid"] == str(r) and rec["slurm"]["ntasks"] == str(GPUS)
            assert rec["slurm"]["array_task_id"] == str(num)
            assert len(rec["cuda_visible_devices"].split(",")) == GPUS  # the fake GRES
            assert rec["torch_imported_before_env"] is False
            assert rec["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
            if hw == "gb200":  # hardware group env + HybridEP topology (dispatcher=auto -> hybridep on GB200)
                assert rec["env"]["NCCL_NVLS_ENABLE"] == "0" and rec["env"]["NVLINK_DOMAIN_SIZE"] == "72"
                assert rec["env"]["USE_MNNVL"] == "1" and rec["env"]["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "2"
            else:
                assert not {"NCCL_NVLS_ENABLE", "NVLINK_DOMAIN_SIZE", "USE_MNNVL"} & set(rec["env"])
            array_ids.add(rec["slurm"]["array_job_id"])
    assert len(array_ids) == 1
    (array,) = array_ids
    # Slurm saw exactly the two valid jobs (one array), both completed
    assert sorted(sacct_states(array)) == [f"{array}_{i}|COMPLETED" for i in range(2)]
    assert "#SBATCH --array=0-1%" in next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()


def test_slurm_requeue_resumes_in_run_dir(slurm: None, tmp_path: Path) -> None:
    """Slurm's timeout/preemption signal (USR2: `--signal=USR2@signal_delay_s`; sent here with scancel, as
    submitit's own job._interrupt() does) reaches the running task; vlmtrain relays it (SIGTERM for Bridge), the
    task ends, submitit's checkpoint() resubmits the same job and requeues it; the second attempt runs in the same
    run dir with the same checkpoint.load as the first attempt's checkpoint.save, and the sweep completes."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", *SLURM, f"hydra.sweep.dir={sweep}", "hardware=h100",
           "train.save_interval=5"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list(sweep.glob("0_*/rank0.json")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        (record_path,) = sweep.glob("0_*/rank0.json")
        job_id = json.loads(record_path.read_text())["slurm"]["job_id"]
        assert _sh("scancel", "--signal=USR2", job_id).returncode == 0
        # attempt 1 finishes its plan, records the signal and hands back to submitit (requeue ~CRED_EXPIRE s later)
        while "signal" not in json.loads(record_path.read_text()) and time.monotonic() < deadline + 300:
            time.sleep(0.5)
        bridge_config = record_path.parent / "bridge_config.yaml"
        first_ckpt = [train_value(bridge_config, "checkpoint", k) for k in ("load", "save")]
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"{stdout}\n{stderr}"
    assert "sweep done: 1 of 1 launched job(s) completed" in stdout

    record = json.loads(record_path.read_text())
    assert record["slurm"]["restart_count"] == "1" and "signal" not in record
    (first,) = record["previous"]
    assert first["slurm"]["restart_count"] is None and first["slurm"]["job_id"] == job_id
    assert first["signal"]["name"] == "SIGUSR2" and first["signal"]["forwarded"] == "SIGTERM"
    states = [s.split("|")[1] for s in sacct_states(job_id)]
    assert states == ["REQUEUED", "COMPLETED"], states
    log = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_0_log.out"))
    assert "Calling checkpoint method." in log and "Requeued job" in log
    # the requeued attempt resumes where the first saved: same checkpoint.load/save (Bridge loads it when it exists)
    assert first_ckpt[0] == first_ckpt[1] != "null"
    assert [train_value(bridge_config, "checkpoint", k) for k in ("load", "save")] == first_ckpt
