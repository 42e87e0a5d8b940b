"""`vlmtrain export`: the checkpoint it picks and every error it names before building a model, on run dirs and
checkpoint dirs laid out as a run writes them (run_config.yaml from the composed config; iter_XXXXXXX dirs with
train_state.pt and the format's metadata file; latest_checkpointed_iteration.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmtrain.cli import main as cli_main
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.launch.local import save_run_config
from vlmtrain.train import hf_export
from vlmtrain.train.hf_export import ExportError, locate


def run_dir(tmp: Path, save_interval: int | None = 2) -> tuple[Path, Path]:
    """A run dir whose run_config.yaml is the composed config, and its (still empty) checkpoint dir."""
    ckpt = tmp / "ckpt"
    overrides = [f"train.checkpoint_dir={ckpt}"]
    if save_interval:
        overrides.append(f"train.save_interval={save_interval}")
    run = compose(overrides)
    run.output_dir = str(tmp / "run")
    save_run_config(run, resolve(run))
    return tmp / "run", ckpt


def checkpoint(ckpt: Path, iteration: int, marker: str = "metadata.json", done: bool = True,
               latest: bool = True) -> Path:
    d = ckpt / f"iter_{iteration:07d}"
    d.mkdir(parents=True)
    (d / marker).write_text("{}")
    if done:
        (d / "train_state.pt").write_bytes(b"")
    if latest:
        (ckpt / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return d


def test_latest_by_default_and_format_from_files(tmp_path: Path) -> None:
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2)
    d4 = checkpoint(ckpt, 4)
    checkpoint(ckpt, 6, done=False, latest=False)  # killed mid-save: no train_state.pt
    src = locate(run, None, tmp_path / "out")
    assert (src.iteration, src.iter_dir, src.ckpt_format) == (4, d4, "torch_dist")
    assert hf_export.saved_iterations(ckpt) == [2, 4]


def test_an_asked_iteration_and_the_format_from_files(tmp_path: Path) -> None:
    run, ckpt = run_dir(tmp_path)
    d2 = checkpoint(ckpt, 2)
    checkpoint(ckpt, 4)
    src = locate(run, 2, tmp_path / "out")
    assert (src.iteration, src.iter_dir, src.ckpt_format, src.ranks) == (2, d2, "torch_dist", 0)
    assert hf_export.checkpoint_format(checkpoint(ckpt, 6, marker=".metadata")) == "fsdp_dtensor"


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no such directory"):
        locate(tmp_path / "missing", None, tmp_path / "out")
    with pytest.raises(ExportError, match="has no run_config.yaml"):
        locate(tmp_path, None, tmp_path / "out")


def test_no_checkpoints(tmp_path: Path) -> None:
    run, _ = run_dir(tmp_path)
    with pytest.raises(ExportError, match="no finished checkpoint"):
        locate(run, None, tmp_path / "out")
    run, _ = run_dir(tmp_path / "never", save_interval=None)
    with pytest.raises(ExportError, match="saved no checkpoints"):
        locate(run, None, tmp_path / "out")


def test_iteration_not_saved_lists_the_saved_ones(tmp_path: Path) -> None:
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2)
    checkpoint(ckpt, 4)
    with pytest.raises(ExportError, match="iteration 3 was not saved .*; saved: 2, 4"):
        locate(run, 3, tmp_path / "out")


def test_output_dir_not_empty(tmp_path: Path) -> None:
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2)
    out = tmp_path / "out"
    out.mkdir()
    assert locate(run, None, out).iteration == 2  # an empty dir is fine
    (out / "config.json").write_text("{}")
    with pytest.raises(ExportError, match="is not empty"):
        locate(run, None, out)


def test_cli_names_the_error_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2)
    assert cli_main(["export", str(run), "--iteration", "8", "--out", str(tmp_path / "out")]) == 2
    assert "vlmtrain export: iteration 8 was not saved" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_fsdp_dtensor_needs_the_runs_world_on_this_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An fsdp_dtensor export runs on the run's own ranks: on a node with fewer GPUs (this CPU machine has none)
    it is refused, naming both, before the output dir is created."""
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2, marker=".metadata")
    assert cli_main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "exported on the run's own world (1 node(s) x 8 GPUs) on one node, and this node has 0 GPU(s)" in err
    assert not (tmp_path / "out").exists()
