"""Launch under Slurm (hydra-submitit-launcher): submitit starts one task per GPU; each maps Slurm's variables to
RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, exports the hardware group's env vars before torch is imported,
records what it saw in `<run dir>/rank<R>.json` and runs the training entry it is given (or, for a dry run, rank 0
prints the plan) in-process. Slurm's timeout/preemption notice (submitit's USR2) becomes SIGTERM for Bridge's exit
handler (checkpoint, then exit), then submitit requeues the job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from vlmtrain.config.resolve import save as save_run_json

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def under_slurm() -> bool:
    return "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ


def slurm_rank_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """torch.distributed's variables from Slurm's (srun tasks, one per GPU)."""
    nodelist = environ.get("SLURM_JOB_NODELIST", "localhost")
    master = environ.get("MASTER_ADDR") or _first_host(nodelist)
    port = environ.get("MASTER_PORT") or str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000)
    return {
        "RANK": environ["SLURM_PROCID"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_WORLD_SIZE": environ.get("SLURM_NTASKS_PER_NODE", environ["SLURM_NTASKS"]).split("(")[0],
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
    }


def _first_host(nodelist: str) -> str:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return nodelist.split(",")[0].split("[")[0]


def export_env(res: Resolved) -> dict[str, str]:
    """Put the run's resolved env vars into this process's environment (explicit user settings win) and return
    them."""
    env = res.env_vars
    for k, v in env.items():
        os.environ.setdefault(k, v)
    return env


SLURM_KEYS = ("JOB_ID", "ARRAY_JOB_ID", "ARRAY_TASK_ID", "PROCID", "LOCALID", "NODEID", "NTASKS",
              "NTASKS_PER_NODE", "JOB_NODELIST", "RESTART_COUNT")


def describe_rank(env: dict[str, str], torch_was_imported: bool) -> dict[str, Any]:
    """What this rank saw as it started: its torch.distributed variables, the run's env vars as set in this
    process (user settings win over the hardware group's), the GPUs Slurm gave it, and whether torch was already
    imported when the env vars were exported (it must not be: some are read at import or CUDA init)."""
    return {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "master_addr": os.environ["MASTER_ADDR"],
        "master_port": int(os.environ["MASTER_PORT"]),
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "env": {k: os.environ.get(k) for k in sorted(env)},
        "torch_imported_before_env": torch_was_imported,
        "slurm": {k.lower(): os.environ.get(f"SLURM_{k}") for k in SLURM_KEYS},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_rank_record(output_dir: str, record: dict[str, Any]) -> Path:
    """`<run dir>/rank<R>.json` (one file per rank, so ranks never write the same file). A requeued job starts in
    the same run dir: the earlier attempts' records move under "previous"."""
    path = Path(output_dir) / f"rank{record['rank']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    previous: list[dict[str, Any]] = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
            if old.get("slurm", {}).get("restart_count") == record["slurm"]["restart_count"] and (
                old.get("slurm", {}).get("job_id") == record["slurm"]["job_id"]):
                previous = old.get("previous", [])  # same attempt: an update (e.g. the signal seen)
            else:
                previous = [*old.pop("previous", []), old]
        except (ValueError, AttributeError):
            pass
    tmp = path.with_suffix(f".json.{os.getpid()}")
    tmp.write_text(json.dumps({**record, "previous": previous}, indent=2) + "\n")
    tmp.replace(path)
    return path


def requeue_signal() -> signal.Signals:
    """The signal submitit asks Slurm for (`--signal=USR2@signal_delay_s`, SUBMITIT_PREEMPT_SIGNAL overrides)."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


class PreemptionRelay:
    """Make submitit's timeout/preemption signal and Bridge's exit signal agree.

    Slurm sends USR2 `signal_delay_s` before the time limit (and on preemption where the cluster sends the user
    signal). submitit's own USR2 handler requeues at once and exits, so rank 0 would die mid-step with nothing
    saved. Instead, while the task runs this relay owns USR2: it sends SIGTERM to this process (Bridge's
    `train.exit_signal`; re-sent every `resend_s` in case Bridge had not installed its handler yet), so Bridge
    saves a checkpoint at the end of the step on every rank and exits; then `hand_back()` runs submitit's
    handler, which on rank 0 resubmits the same job (hydra-submitit-launcher's checkpoint()) and requeues it.
    Outside submitit (no Python handler for USR2) it does nothing, and so does a process forked inside it."""

    def __init__(self, resend_s: float = 30.0):
        self.sig = requeue_signal()
        self.resend_s = resend_s
        self.received: float | None = None
        self._submitit_handler: Callable[[int, FrameType | None], Any] | None = None
        self._stop = threading.Event()
        self._pid = os.getpid()

    def __enter__(self) -> PreemptionRelay:
        previous = signal.getsignal(self.sig)
        if callable(previous):
            self._submitit_handler = previous
            signal.signal(self.sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._submitit_handler is not None:
            signal.signal(self.sig, self._submitit_handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Slurm signals every process of the step; a forked DataLoader worker inherits this handler, and a SIGTERM
        # to itself (not from its parent) makes torch report the worker "killed by signal: Terminated"
        if os.getpid() != self._pid:
            return
        print(f"[vlmtrain] rank {os.environ.get('RANK')}: got {signal.Signals(signum).name} (Slurm timeout or "
              "preemption): SIGTERM to Bridge (checkpoint and exit), then submitit requeues", flush=True)
        if self.received is None:
            self.received = time.time()
            threading.Thread(target=self._resend, daemon=True).start()
        self._forward()

    def _forward(self) -> None:
        if callable(signal.getsignal(signal.SIGTERM)):  # Bridge's exit handler, or submitit's "bypass"
            os.kill(os.getpid(), signal.SIGTERM)

    def _resend(self) -> None:
        while not self._stop.wait(self.resend_s):
            self._forward()

    def hand_back(self) -> None:
        """submitit's handler, as if the signal arrived now: rank 0 checkpoints the submission, requeues, exits."""
        if self.received is not None and self._submitit_handler is not None:
            self._submitit_handler(self.sig, None)


def in_process(run: RunConfig, res: Resolved, train: Callable[[RunConfig, Resolved], None] | None) -> int:
    """One Slurm task: rank variables from Slurm, the run's resolved env before torch, a rank record, then (rank 0
    saving run.json) `train(run, res)`, the training entry flow.py passes, or for a dry run (`train` None)
    the plan on rank 0, with timeout/preemption relayed to Bridge and back to submitit."""
    torch_was_imported = "torch" in sys.modules
    os.environ.update(slurm_rank_env())
    env = export_env(res)
    record = describe_rank(env, torch_was_imported)
    lay = res.layout
    if record["world_size"] != lay.world_size or record["local_world_size"] != lay.gpus_per_node:
        raise RuntimeError(
            f"Slurm started {record['world_size']} task(s), {record['local_world_size']} per node, but the run "
            f"declares {lay.nodes} node(s) x {lay.gpus_per_node} GPUs: launch with hydra/launcher=slurm (tasks "
            "follow nodes/gpus_per_node/hardware) or set nodes/gpus_per_node to the allocation.")
    status = 0
    with PreemptionRelay() as relay:
        path = write_rank_record(run.output_dir, record)
        try:
            if train is not None:
                if record["rank"] == 0:
                    save_run_json(res, run.output_dir)
                train(run, res)
            elif record["rank"] == 0:
                from vlmtrain.build import plan

                status = plan.dry_run(run, res)
            else:
                print(f"[vlmtrain] rank {record['rank']}: dry run, the plan is built on rank 0; rank record {path}")
        except SystemExit as e:  # Bridge exits this way after the signal-triggered checkpoint
            if relay.received is None:
                raise
            status = e.code if isinstance(e.code, int) else 1
    if relay.received is not None:
        write_rank_record(run.output_dir, {**record, "signal": {
            "name": relay.sig.name, "received": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(relay.received)),
            "forwarded": "SIGTERM", "status": status}})
        relay.hand_back()
    return status


def launcher_params(overrides: list[str], world: list[str]) -> dict[str, Any]:
    """conf/hydra/launcher/slurm.yaml resolved for `world` (`nodes=`, `gpus_per_node=`, `hardware=` overrides) and
    the user's `hydra.launcher.*` overrides, as a -m sweep's job gets it: for a command that is no Hydra app
    (`vlmtrain export`) but submits like training does."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vlmtrain.config.compose import CONF_DIR
    from vlmtrain.config.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*world, *overrides], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(params, dict)
    return params


def executor_params(params: dict[str, Any], folder: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(submitit.AutoExecutor's init arguments, its update_parameters) from a resolved Slurm launcher config, mapped
    as hydra-submitit-launcher maps them (its own keys as they are, the rest `slurm_`-prefixed)."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    own = set(OmegaConf.structured(BaseQueueConf).keys())
    rest = {k: v for k, v in params.items() if k not in ("_target_", "submitit_folder", "max_num_timeout")}
    return ({"folder": folder, "slurm_max_num_timeout": params.get("max_num_timeout", 0)},
            {k if k in own else f"slurm_{k}": v for k, v in rest.items()})


def submit(fn: Callable[..., Any], args: tuple[Any, ...], params: dict[str, Any], folder: str) -> Any:
    """One Slurm job of `params`' shape running `fn(*args)` in each task (submitit); returns the submitit job."""
    import submitit

    init, update = executor_params(params, folder)
    executor = submitit.AutoExecutor(cluster="slurm", **init)
    executor.update_parameters(**update)
    return executor.submit(fn, *args)
