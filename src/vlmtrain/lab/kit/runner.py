"""One way to start a run from the lab: a Case's `python train.py` run with its command, env, run dir, log, timeout and
GPU slot.

Every process the lab starts begins here (sweeps, tune's trials, the overhead A/B, the GPU checks and the acceptance
suite), so they all see the same environment rules and leave the same files behind. `start` starts a Case's train.py
run; `start_ranks` a composed Case's ranks running its `module` (a check's rank: what `python train.py` launches,
with another module in place of vlmtrain.worker); `side_by_side` several cases on disjoint GPU slots; `spawn`, their
lower layer, starts any command the same way (the torchrun ranks of Bridge-only peers, a check's step in a process
of its own).

Each run is a session of its own (a process group): stopping or killing it takes the launcher, torchrun and every
rank with it, and a timeout kills the whole tree rather than leaving a rank holding the GPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from vlmtrain.config.compose import CONF_DIR
from vlmtrain.lab.kit.case import Case

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

ROOT = CONF_DIR.parent
"""The checkout: train.py, results/ and outputs/ (the lab runs from a source checkout)."""
TRAIN_PY = ROOT / "train.py"
STOP_GRACE_S = 30.0
"""How long stop() waits after SIGTERM (Bridge saves a checkpoint on it) before it kills the tree."""

_ports: set[int] = set()


def free_port() -> int:
    """A port free now and not yet handed to another run of this process: runs side by side on one node collided on
    a shared MASTER_PORT (EADDRINUSE at the rendezvous)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in _ports:
            _ports.add(port)
            return port


def argv(case: Case, run_dir: Path, subdir: str | None = None, checkout: Path = ROOT) -> list[str]:
    """`python train.py [-m] <the case's command line> hydra.run.dir=<run_dir>` (hydra.sweep.dir, and its subdir,
    for a multirun case), the train.py of `checkout` (default: this one)."""
    where = [f"hydra.sweep.dir={run_dir}", *([f"hydra.sweep.subdir={subdir}"] if subdir else [])] if case.multirun \
        else [f"hydra.run.dir={run_dir}"]
    return [sys.executable, str(checkout / TRAIN_PY.name), *(["-m"] if case.multirun else []), *case.command_line(),
            *where]


def recorded(case: Case) -> str:
    """The case's command as a results row records it: everything but the interpreter's path and the run dir."""
    return " ".join(["python train.py", *(["-m"] if case.multirun else []), *case.command_line()])


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL the launcher, torchrun, every rank and their helpers (an async checkpoint writer included): what a
    node failure or `kill -9` does. The tree is frozen first (SIGSTOP, until a fresh look finds no new process:
    a stopped process cannot fork, and a killed parent's children would move to init), then killed at once.
    Returns how many processes were killed."""
    tree: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):  # it may have died on its own: the caller sees its status
        root = psutil.Process(proc.pid)
        while new := {p.pid: p for p in [root, *root.children(recursive=True)] if p.pid not in tree}:
            for p in new.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGSTOP)
            tree |= new
    for p in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs([p for p in tree.values() if p.pid != proc.pid], timeout=30)
    proc.wait()  # Popen reaps its own child: psutil reaping it would leave returncode 0 instead of -9
    return len(tree)


class Run:
    """A started run: its process (the session leader), run dir, log and deadline."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, log: Path, timeout_s: float | None):
        self.proc, self.run_dir, self.log = proc, run_dir, log
        self.t0 = time.monotonic()
        self.deadline = None if timeout_s is None else self.t0 + timeout_s
        self.timed_out = False
        """Whether wait() killed the run at its timeout."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit status once the run ended, else None."""
        return self.proc.poll()

    def wall_s(self) -> float:
        return time.monotonic() - self.t0

    def wait(self, timeout_s: float | None = None) -> int:
        """The exit status; past `timeout_s` from now (default: what is left of the run's own timeout) the whole tree
        is killed and its status (-9) returned."""
        if timeout_s is None and self.deadline is not None:
            timeout_s = max(0.0, self.deadline - time.monotonic())
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
            return self.proc.returncode

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM to the run's process group, the tree killed if it has not ended after `grace_s`."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL the whole tree at once (kill_tree); how many processes it held."""
        return kill_tree(self.proc)


def spawn(cmd: Sequence[str], run_dir: Path, *, log: Path | None = None, env: Mapping[str, str] | None = None,
          gpus: Sequence[int] | None = None, port: int | None = None, timeout_s: float | None = None,
          fresh: bool = False, cwd: Path = ROOT) -> Run:
    """Start `cmd` in its own session in `cwd` (default: this checkout), stdout and stderr into `log` (default
    run_dir/train.log), with os.environ plus `env`, CUDA_VISIBLE_DEVICES=`gpus` and MASTER_PORT=`port` (each when
    given) and PYTHONUNBUFFERED=1; `fresh` empties run_dir first (a re-run must not append to old files)."""
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = log or run_dir / "train.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    if gpus is not None:
        full["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if port is not None:
        full["MASTER_PORT"] = str(port)
    with log.open("wb") as out:  # the child holds its own copy of the file
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=full, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Run(proc, run_dir, log, timeout_s)


def start(case: Case, run_dir: Path, *, subdir: str | None = None, log: Path | None = None,
          env: Mapping[str, str] | None = None, gpus: Sequence[int] | None = None, port: int | None = None,
          timeout_s: float | None = None, fresh: bool = False, checkout: Path = ROOT) -> Run:
    """The case's `python train.py [-m] ...` into run_dir (hydra.run.dir, or hydra.sweep.dir for a multirun case),
    run in `checkout`: see `argv` for the command and `spawn` for the rest. A single run gets MASTER_PORT (`env`'s,
    else `port`, else a free one); a multirun's jobs take their own (launch.local: a free one each; launch.slurm: one
    from the job id)."""
    if not case.multirun and not (env or {}).get("MASTER_PORT"):
        port = port or free_port()
    return spawn(argv(case, run_dir, subdir, checkout), run_dir, log=log, env=env, gpus=gpus, port=port,
                 timeout_s=timeout_s, fresh=fresh, cwd=checkout)


def side_by_side(cases: list[Case], out: Path) -> list[tuple[Case, int, Path, float]]:
    """The cases started at once, each in a fresh out/<name> on GPU slots of its own (CUDA_VISIBLE_DEVICES), then
    waited for: (case, exit status, run dir, wall seconds) each."""
    runs, next_gpu = [], 0
    for case in cases:
        gpus = list(range(next_gpu, next_gpu + (case.gpus or 1)))
        runs.append((case, start(case, out / case.name, gpus=gpus, fresh=True)))
        next_gpu = gpus[-1] + 1
    return [(c, r.wait(), r.run_dir, r.wall_s()) for c, r in runs]


def start_ranks(case: Case, run: RunConfig, res: Resolved, *, log: Path | None = None,
                gpus: Sequence[int] | None = None, timeout_s: float | None = None) -> Run:
    """The ranks of the case's run, composed and resolved (`run`, `res`), launched as `python train.py` launches them
    (its saved run config, torchrun, the resolved env vars unless set, a free MASTER_PORT), each running the case's
    `module` on the saved config instead of vlmtrain.worker; the run dir is the run's output_dir. The caller has run
    preflight and the data scan, as vlmtrain.flow does before it launches."""
    from vlmtrain.launch import local

    assert case.module, f"{case.name}: start_ranks runs a case's own rank module"
    path, lay, port = local.save_run_config(run, res), res.layout, free_port()
    env = local.rank_env(res)
    return spawn(local.torchrun(case.module, [str(path)], lay.gpus_per_node, lay.nodes, port), Path(run.output_dir),
                 log=log, env=env, gpus=gpus, port=port, timeout_s=timeout_s)
