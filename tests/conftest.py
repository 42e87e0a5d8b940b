"""Shared fixtures, built once for every module that reads them: compose the shipped configs exactly as train.py does
(Hydra's compose API), the Bridge import and a data cache (once per worker: an import, and a cache that holds one
realistic dataset at a time), the tiny HF checkpoints (once per session: the workers share a folder), train.py's dry
run in process. And how many workers `-n auto` (pyproject's addopts) starts."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 0)):  # set by xdist before it imports this file
    # each worker's torch would start one thread per CPU: together they would spin on more threads than CPUs
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // workers)))

MAX_WORKERS = 4
"""A worker holds Bridge, torch and what its tests build (several GB at its peak), and some tests start Bridge processes
of their own: more workers would crowd memory."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker per CPU this process may use, at most MAX_WORKERS; none for a GPU run (`-m gpu`): its tests share
    the node's GPUs, so they run one after another unless `-n N` asks otherwise."""
    marks = config.option.markexpr
    if "gpu" in marks and "not gpu" not in marks:
        return 0
    return min(len(os.sched_getaffinity(0)), MAX_WORKERS)


@pytest.fixture(scope="session")
def compose() -> Callable[..., object]:
    """compose(*overrides) -> RunConfig, through Hydra's compose API (no global Hydra state is kept)."""
    from vlmtrain.config.compose import compose as vlm_compose

    def _compose(*overrides: str, output_dir: str = "outputs/test") -> object:
        return vlm_compose(list(overrides), output_dir=output_dir)

    return _compose


@pytest.fixture(scope="session")
def bridge() -> object:
    """Import Megatron Bridge (with real Transformer Engine) once per session; ~40 s on 2 cores."""
    import megatron.bridge.training.config as config

    return config


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data cache_dir for the session: the sample photos are written once (per worker) for every data test."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session shares (the session's base temp dir; the worker's own without
    xdist): what is built there is built once, under `once`'s lock."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (root / "shared").mkdir(exist_ok=True)
    return root / "shared"


@contextlib.contextmanager
def once(path: Path) -> Iterator[bool]:
    """Holds `path`'s lock; yields whether `path` still needs building (another worker may have built it)."""
    with path.with_name(path.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield not path.exists()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_checkpoint(shared: Path) -> Callable[[str], Path]:
    """tiny_checkpoint(family) -> a 4-layer HF checkpoint of qwen3_vl or qwen35_vl (lab.checks.tiny_hf), built once
    per session for every test that reads one; a test that changes one works on its own copy."""
    from vlmtrain.lab.checks import tiny_hf

    def _checkpoint(family: str) -> Path:
        ckpt = shared / f"tiny_{family}"
        with once(ckpt) as missing:
            if missing:  # built beside, then moved into place: a checkpoint that exists is whole
                partial = shared / f".{family}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                tiny_hf.build(family, partial, num_layers=4).rename(ckpt)
        return ckpt

    return _checkpoint


@pytest.fixture(scope="session")
def dry_run(bridge: object) -> Callable[..., tuple[int, str]]:
    """dry_run(*overrides, run_dir=...) -> (exit status, printed plan): what `python train.py <overrides>
    dry_run=true hydra.run.dir=<run_dir>` does on a machine without GPUs (vlmtrain.flow.main: compose, place on the
    declared world, plan.dry_run), in this process, so the test pays no Bridge import of its own. tests/unit/
    test_runner.py runs the real train.py subprocess."""
    from vlmtrain.build import plan
    from vlmtrain.check.defaults import placed
    from vlmtrain.config.compose import compose as vlm_compose

    def _dry_run(*overrides: str, run_dir: Path) -> tuple[int, str]:
        run = vlm_compose([*overrides, "dry_run=true"], output_dir=str(run_dir))
        _, res = placed(run, 0)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = plan.dry_run(run, res)
        return status, printed.getvalue()

    return _dry_run


@pytest.fixture(autouse=True)
def _bridge_patches_undone() -> Iterator[None]:
    """Code a test ran in process (an export, the collate benchmark) may install Bridge replacements the way a
    training process does; they are undone after it, so no later test on the worker sees them."""
    import sys

    yield
    if (replace := sys.modules.get("vlmtrain.train.bridge_patches.replace")) is not None and replace.installed():
        replace.uninstall()
