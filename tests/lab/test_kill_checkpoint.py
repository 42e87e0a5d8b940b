"""A checkpoint killed while being written is never the one Bridge loads (issue 25 item 2), on CPU: real torch_dist
checkpoints written by Megatron's dist_checkpointing.save (one gloo rank), the tracker files as Bridge's
save_checkpoint writes them once a save is complete, and Bridge's own loader (`_resolve_checkpoint_iteration`,
`_load_base_checkpoint`, as load_checkpoint calls them) reading them back.

A partial newer iter dir is a real save of step 4 cut back to what a SIGKILL leaves at three moments: right after
rank 0 made the dir (`created`), with the shard half written (`mid_write`: no .metadata, no metadata.json, which
the save writes last), and with the data written but not finalized (`unfinalized`: an async save killed before
its finalize). The GPU check (vlmtrain.lab.checks.kill_checkpoint) kills a real training run instead; its
detection and Bridge-pick helpers are checked here on the same files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from vlmtrain.lab.checks import kill_checkpoint

KINDS = ("created", "mid_write", "unfinalized")
SHAPE = (512, 256)  # 512 KiB of float32: a shard file big enough to cut in half


def _state(step: int) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    return {"w": ShardedTensor.from_rank_offsets("w", torch.full(SHAPE, float(step))), "iteration": step}


def _save(root: Path, step: int) -> Path:
    """A real torch_dist save of step into root/iter_<step> (save_checkpoint: rank 0 makes the dir, then
    dist_checkpointing.save)."""
    from megatron.bridge.training.checkpointing import get_checkpoint_name
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    d = Path(get_checkpoint_name(str(root), step))
    d.mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(_state(step), str(d), TorchDistSaveShardedStrategy("torch_dist", 1))
    return d


def _commit(root: Path, step: int) -> None:
    """What save_checkpoint's train_state_finalize_fn writes after the data is complete: iter_N/train_state.pt,
    its copy latest_train_state.pt, then latest_checkpointed_iteration.txt."""
    from megatron.bridge.training.checkpointing import (
        TRACKER_PREFIX,
        get_checkpoint_name,
        get_checkpoint_tracker_filename,
        get_checkpoint_train_state_filename,
    )
    from megatron.bridge.training.state import TrainState

    ts = TrainState()
    ts.step = step
    local = get_checkpoint_train_state_filename(get_checkpoint_name(str(root), step))
    torch.save(ts.state_dict(), local)
    shutil.copy(local, get_checkpoint_train_state_filename(str(root), prefix=TRACKER_PREFIX))
    Path(get_checkpoint_tracker_filename(str(root))).write_text(str(step))


def _cut(d: Path, kind: str) -> None:
    """Leave d as a SIGKILL at `kind` leaves it."""
    for name in (".metadata", "metadata.json"):  # Megatron writes both after the shards (finalize)
        (d / name).unlink()
    shard = d / "__0_0.distcp"
    if kind == "created":
        shard.unlink()
    elif kind == "mid_write":
        os.truncate(shard, shard.stat().st_size // 2)


def _load(root: Path, cfg) -> tuple[str, list[float]]:
    """Bridge's full load of the checkpoint it picks in root: (its dir name, the distinct values of w)."""
    from megatron.bridge.training.checkpointing import _load_base_checkpoint

    state, name, _, _ = _load_base_checkpoint(str(root), cfg, rank0=False, sharded_state_dict=_state(0),
                                              pg_collection=None)
    return Path(name).name, sorted(set(state["w"].flatten().tolist()))


def _rank(rank: int, port: int, tmp: str, out: dict) -> None:
    import torch.distributed as dist

    torch.cuda.synchronize = lambda *a, **k: None  # no GPU here: the writer syncs the device before its copy
    torch.cuda.current_device = lambda: "cpu"  # and its finalize all-reduces a flag on the current device (gloo)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    from megatron.bridge.training.checkpointing import _resolve_checkpoint_iteration
    from megatron.bridge.training.config import CheckpointConfig
    from megatron.bridge.training.utils.checkpoint_utils import read_train_state

    for kind in KINDS:
        root = Path(tmp) / kind
        cfg = CheckpointConfig(save=str(root), load=str(root), ckpt_format="torch_dist")
        _save(root, 2)
        _commit(root, 2)
        partial = _save(root, 4)
        _cut(partial, kind)
        shutil.copytree(root, Path(tmp) / f"{kind}_at_kill")  # for the GPU check's helpers, below
        r = {"resolved": _resolve_checkpoint_iteration(str(root), None),
             "pick": kill_checkpoint.bridge_pick(root, "torch_dist"), "loaded": _load(root, cfg)}
        try:  # the partial dir loaded directly (what a tracker naming it would make the relaunch do)
            direct = CheckpointConfig(save=str(root), load=str(partial), ckpt_format="torch_dist")
            r["partial_direct_load"] = _load(partial, direct)
        except Exception as e:  # noqa: BLE001 - which error it is does not matter, only that it fails
            r["partial_direct_load"] = type(e).__name__
        _save(root, 4)  # the resumed run's save of step 4 into the partial dir
        _commit(root, 4)
        read_train_state.cache_clear()  # Bridge caches the tracker's read per process: the next launch's own read
        r["after_next_save"] = (_resolve_checkpoint_iteration(str(root), None), _load(root, cfg))
        out[kind] = r
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, dict]:
    if importlib.util.find_spec("megatron.bridge") is None:  # found, not imported: the rank imports it
        pytest.skip("needs megatron-bridge")
    tmp = tmp_path_factory.mktemp("kill_ckpt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(port, str(tmp), out), nprocs=1)
    return tmp, dict(out)


@pytest.mark.parametrize("kind", KINDS)
def test_bridge_resumes_from_the_previous_checkpoint(killed, kind) -> None:
    r = killed[1][kind]
    assert r["resolved"] == (2, False)  # the tracker still names step 2
    assert r["pick"] == {"bridge_loads": "iter_0000002", "bridge_common_iteration": 2}
    assert r["loaded"] == ("iter_0000002", [2.0])  # step 2's tensor, whole


@pytest.mark.parametrize("kind", ["mid_write", "unfinalized"])
def test_the_partial_dir_itself_does_not_load(killed, kind) -> None:
    """The control that makes the test above mean something: loading the partial dir fails, so a loader that
    picked it would not have produced step 2's tensor."""
    assert isinstance(killed[1][kind]["partial_direct_load"], str), killed[1][kind]["partial_direct_load"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_next_save_overwrites_the_partial_dir(killed, kind) -> None:
    """The resumed run saves step 4 into the leftover dir (Megatron: "Overwriting old incomplete / corrupted
    checkpoint") and Bridge then loads that save, whole."""
    assert killed[1][kind]["after_next_save"] == ((4, False), ("iter_0000004", [4.0]))


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_check_sees_the_write_in_progress(killed, kind) -> None:
    """kill_checkpoint.watch kills only once the newer dir holds data and no train_state.pt: `created` (no bytes
    yet) is not a mid-write kill, the two others are."""
    root = killed[0] / f"{kind}_at_kill"
    assert kill_checkpoint.tracker(root) == 2
    with subprocess.Popen(["sleep", "30"]) as proc:
        seen = kill_checkpoint.watch(proc, root, time.time() + 0.5)
        proc.kill()
    state = kill_checkpoint.partial_state(root / "iter_0000004")
    assert not state["partial_has_train_state"] and not state["partial_has_metadata"]
    if kind == "created":
        assert seen is None and state["partial_bytes"] == 0
    else:
        assert seen == {"target_step": 4, "tracker_at_kill": 2, "partial_bytes_at_kill": state["partial_bytes"]}
        assert state["partial_bytes"] > 0
