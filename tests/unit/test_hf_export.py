"""`vlmtrain export`: the checkpoint it picks and every error it names before building a model, on run dirs and
checkpoint dirs laid out as a run writes them (run_config.yaml from the composed config; iter_XXXXXXX dirs with
train_state.pt and the format's metadata file; latest_checkpointed_iteration.txt); a failed export leaves --out as
it was; the fsdp_dtensor ranks' container, built without the run's data (real Bridge, on CPU)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from vlmtrain.build import container
from vlmtrain.cli import main as cli_main
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.data.export import export as export_data
from vlmtrain.lab.checks import tiny_hf
from vlmtrain.launch import slurm
from vlmtrain.launch.local import save_run_config
from vlmtrain.train import hf_export
from vlmtrain.train.hf_export import ExportError, locate


def run_dir(tmp: Path, save_interval: int | None = 2, *more: str) -> tuple[Path, Path]:
    """A run dir whose run_config.yaml is the composed config (`more`: its overrides), and its (still empty)
    checkpoint dir."""
    ckpt = tmp / "ckpt"
    overrides = [f"train.checkpoint_dir={ckpt}", *more]
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


def test_fsdp_dtensor_needs_gpu_ranks_and_names_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An fsdp_dtensor export runs on GPU ranks: on this CPU machine it is refused, naming a GPU node (resharded
    into its GPUs) or the run's own world through Slurm, before the output dir is created."""
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2, marker=".metadata")
    assert cli_main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is an fsdp_dtensor checkpoint, loaded by GPU ranks, and this node has no GPU" in err
    assert "or on the run's own world (1 node(s) x 8 GPUs) through Slurm" in err
    assert not (tmp_path / "out").exists()


def siblings(out: Path) -> list[str]:
    """What an export left beside `out` (its staged dirs are `.<name>.export-*`)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_a_failed_export_leaves_the_output_dir_as_it_was(bridge, tmp_path: Path) -> None:
    """The export writes the processor, then Bridge fails on the checkpoint (here: a torch_dist dir cut to its
    metadata.json): the user's empty --out is left empty and nothing else is left behind, so the retry is not
    refused as "not empty"."""
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2)
    out = tmp_path / "out"
    out.mkdir()
    src = locate(run, None, out)
    with pytest.raises(Exception):  # noqa: B017  (Bridge's loader raises what it raises)
        hf_export.export(src, out)
    assert out.is_dir() and list(out.iterdir()) == []
    assert siblings(out) == []
    assert locate(run, None, out).iteration == 2  # the retry


def test_a_complete_export_is_moved_into_place(tmp_path: Path) -> None:
    out = tmp_path / "new" / "out"
    with hf_export.staged(out) as into:
        (into / "config.json").write_text("{}")
        assert not out.exists()  # nothing half-written where the user looks
    assert (out / "config.json").read_text() == "{}"
    assert siblings(out) == []


def test_torch_dist_needs_a_gpu_and_says_so_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Transformer Engine's layers need a CUDA device: on this GPU-less node the export is refused before anything
    loads or is written."""
    run, ckpt = run_dir(tmp_path)
    d = checkpoint(ckpt, 2)
    assert cli_main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"vlmtrain export: {d} is a torch_dist checkpoint" in err and "this node has no GPU" in err
    assert "run `vlmtrain export` on a GPU node" in err
    assert not (tmp_path / "out").exists() and siblings(tmp_path / "out") == []


def test_a_moved_hf_path_is_named_with_the_fix(tiny_checkpoint, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The run started from a HF checkpoint that has moved since: named up front (not transformers' "network
    issues" from its hub fallback), and `--hf-path` takes where it is now, checked against the run's model."""
    first = tiny_hf.build("qwen3_vl", tmp_path / "hf", num_layers=2)
    run, ckpt = run_dir(tmp_path, 2, f"model.hf_path={first}", "model.num_layers=2")
    checkpoint(ckpt, 2)
    moved = first.rename(tmp_path / "hf-moved")
    out = tmp_path / "out"
    assert cli_main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"model.hf_path={first} has no config.json (found: no such directory)" in err
    assert f"put the checkpoint the run started from back at {first}, or pass --hf-path <the dir it moved to>" in err
    assert not out.exists()
    assert locate(run, None, out, str(moved)).run.model.hf_path == str(moved)
    other = tiny_checkpoint("qwen3_vl")  # the shared 4-layer one
    with pytest.raises(ExportError, match="model.num_layers=2 but config.json text_config.num_hidden_layers=4"):
        locate(run, None, out, str(other))
    # a run that started from no HF checkpoint has none to find: --hf-path would swap in another's config
    scratch, scratch_ckpt = run_dir(tmp_path / "scratch", 2, "model.num_layers=2")
    checkpoint(scratch_ckpt, 2)
    with pytest.raises(ExportError, match="the run started from no Hugging Face checkpoint"):
        locate(scratch, None, out, str(moved))


def test_the_fsdp_export_ranks_build_the_runs_model_without_its_data(bridge, cache: Path, tmp_path: Path) -> None:
    """The fsdp_dtensor export's ranks stop before any dataset is built, but building the run's container scans
    its data: they build the run with Bridge's mock data instead, so an export still works once the training data
    is gone, and their model is the run's (its packed row length included)."""
    data = export_data("jsonl", tmp_path / "data", cache=cache)
    run, ckpt = run_dir(tmp_path, 2, *data["overrides"], "parallelism=fsdp", "data.packing=8192",
                        "train.micro_batch_size=1", f"data.cache_dir={tmp_path / 'cache'}")
    checkpoint(ckpt, 2, marker=".metadata")
    src = locate(run, None, tmp_path / "out")
    trained = container.build(src.run, resolve(src.run)).model
    shutil.rmtree(tmp_path / "data")
    with pytest.raises(FileNotFoundError):  # what the run's own container needs now
        container.build(src.run, resolve(src.run))
    ranks = hf_export.export_run(src)
    built = container.build(ranks, resolve(ranks)).model
    assert type(built) is type(trained) and built.seq_length == trained.seq_length == 8192

    def fields(provider: object) -> dict[str, object]:
        return {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider)
                if isinstance(getattr(provider, f.name), (int, float, str, bool, type(None), tuple, list))}

    assert fields(built) == fields(trained)
    assert ranks.output_dir == str(run / "export-iter_0000002") and ranks.train.checkpoint_dir == str(ckpt)


def test_a_release_tracker_is_named_with_the_saved_iterations(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron's tracker holds `release` for a release checkpoint: one message and status 2, not int()'s traceback;
    --iteration picks a saved one."""
    run, ckpt = run_dir(tmp_path)
    checkpoint(ckpt, 2)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release\n")
    assert cli_main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "holds 'release' (a release checkpoint, in" in err and "pass --iteration N, one of 2" in err
    assert locate(run, 2, tmp_path / "out").iteration == 2


def test_a_bad_hf_path_is_named_as_the_flag(tiny_checkpoint, tmp_path: Path) -> None:
    """--hf-path pointing at no checkpoint is reported as --hf-path, the setting the user typed."""
    first = tiny_checkpoint("qwen3_vl")
    run, ckpt = run_dir(tmp_path, 2, f"model.hf_path={first}", "model.num_layers=4")
    checkpoint(ckpt, 2)
    with pytest.raises(ExportError, match=f"--hf-path={tmp_path / 'nowhere'} has no config.json"):
        locate(run, None, tmp_path / "out", str(tmp_path / "nowhere"))


EXPERTS = 8  # model=tiny's
SAVED_RANKS, EXPORT_RANKS = 4, 2


def dcp_rank(rank: int, world: int, ckpt: str, store: str, load: bool, experts: int) -> None:
    """One gloo rank of a Megatron-FSDP-shaped fsdp_dtensor checkpoint: every tensor a DTensor sharded on dim 0 over
    the ranks, experts under global indices; `load`: read it back into this (different) world, through torch DCP's
    own planner, and compare with the values saved."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = {"model.decoder.layers.0.self_attention.linear_qkv.weight": torch.arange(96.0).reshape(24, 4)}
    full |= {f"model.decoder.layers.0.mlp.experts.linear_fc1.weight{e}": torch.full((8, 4), float(e))
             for e in range(experts)}
    sharded = {k: distribute_tensor(v if not load else torch.zeros_like(v), mesh, [Shard(0)]) for k, v in full.items()}
    if load:
        dcp.load(sharded, checkpoint_id=ckpt)
        assert all(torch.equal(sharded[k].full_tensor(), v) for k, v in full.items())
    else:
        dcp.save({**sharded, "optimizer.state.step": torch.tensor(3.0)}, checkpoint_id=ckpt)
    dist.destroy_process_group()


def dcp_world(tmp: Path, world: int, ckpt: Path, load: bool = False, experts: int = EXPERTS) -> None:
    import torch.multiprocessing as mp

    mp.spawn(dcp_rank, args=(world, str(ckpt), str(tmp / f"store-{world}-{load}"), load, experts), nprocs=world)


def test_a_multi_node_fsdp_checkpoint_reshards_into_this_nodes_gpus(tmp_path: Path) -> None:
    """A run of 2 nodes x 2 GPUs saved real DCP files (4 gloo ranks): on a node with 2 GPUs the export reshards it
    (its plan: every tensor covered, all experts under global indices, EP re-sized to the 2 GPUs), the memory
    estimate of the resharded state fits, and torch DCP's planner reads those files into 2 ranks exactly."""
    run, ckpt = run_dir(tmp_path, 2, "parallelism=fsdp", "nodes=2", "gpus_per_node=2")
    d = checkpoint(ckpt, 2, marker="train_state.pt")
    dcp_world(tmp_path, SAVED_RANKS, d)
    src = locate(run, None, tmp_path / "out")
    assert (src.ckpt_format, src.ranks) == ("fsdp_dtensor", 4)
    where = hf_export.check_node(src, EXPORT_RANKS)
    assert where == hf_export.Where(EXPORT_RANKS, resharded=True)
    lay = hf_export.export_layout(src, EXPORT_RANKS)
    assert (lay.nodes, lay.world_size, lay.ep) == (1, 2, 2)
    plan = hf_export.reshard_plan(d, src.run, lay)
    assert plan.tensors == 1 + EXPERTS and plan.experts == {"model.decoder.layers.0.mlp.experts": set(range(8))}
    assert plan.model_bytes == (96 + EXPERTS * 32) * 4  # the optimizer's keys are not read
    ranks = hf_export.export_run(src, EXPORT_RANKS)
    assert (ranks.nodes, ranks.gpus_per_node, ranks.train.global_batch_size % 2) == (1, 2, 0)
    dcp_world(tmp_path, EXPORT_RANKS, d, load=True)


def test_a_checkpoint_missing_experts_is_named_before_any_rank(tmp_path: Path) -> None:
    run, ckpt = run_dir(tmp_path, 2, "parallelism=fsdp", "nodes=2", "gpus_per_node=2")
    d = checkpoint(ckpt, 2, marker="train_state.pt")
    dcp_world(tmp_path, SAVED_RANKS, d, experts=EXPERTS - 2)
    with pytest.raises(ExportError, match=r"mlp.experts holds 6 of model.num_experts=8 experts \(missing \[6, 7\]\)"):
        hf_export.check_node(locate(run, None, tmp_path / "out"), EXPORT_RANKS)


def test_the_seeds_16_node_run_exports_through_slurm_on_its_own_world(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """experiment=fsdp_first_gb200 (16 nodes x 4 GB200): here (no GPU) the export names both ways; with
    hydra/launcher=slurm it is submitted as training is, one task per GPU of the run's 16 nodes (the launcher
    config resolved as a -m job's, mapped onto submitit's executor as hydra-submitit-launcher maps it)."""
    run, ckpt = run_dir(tmp_path, 2, "experiment=fsdp_first_gb200")
    checkpoint(ckpt, 2, marker=".metadata")
    assert cli_main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "this node has no GPU" in err and f"vlmtrain export {run} --out <dir> hydra/launcher=slurm" in err
    src = locate(run, None, tmp_path / "out")
    where = hf_export.check_node(src, 0, ["hydra/launcher=slurm", "hydra.launcher.partition=batch"])
    assert where.gpus == 64 and not where.resharded
    init, params = slurm.executor_params(where.slurm, str(tmp_path / "slurm"))
    assert init == {"folder": str(tmp_path / "slurm"), "slurm_max_num_timeout": 3}
    assert (params["nodes"], params["tasks_per_node"], params["gpus_per_node"]) == (16, 4, 4)
    assert params["slurm_partition"] == "batch" and params["slurm_signal_delay_s"] == 300
    with pytest.raises(ExportError, match="the export takes hydra/launcher=slurm"):
        hf_export.check_node(src, 0, ["hydra.launcher.partition=batch"])
