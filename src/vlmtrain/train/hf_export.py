"""`vlmtrain export <run dir> [--iteration N] --out <dir>`: a Hugging Face checkpoint from a run's own checkpoints.

Everything that can be wrong is checked before any heavy import (`locate`): the run dir holds the composed config
(run_config.yaml), its checkpoint dir (train.checkpoint_dir) holds finished iter_XXXXXXX dirs, the asked iteration
is one of them (default: the one latest_checkpointed_iteration.txt names), the output dir is empty, and an
fsdp_dtensor export has the run's GPUs on this node. The format is read from the iteration's files, as Bridge's
loader detects it: metadata.json is torch_dist, .metadata is fsdp_dtensor (PyTorch DCP).

The conversion is Megatron Bridge's own, with the same parameter mapping that imports HF weights.
- torch_dist: `AutoBridge.export_ckpt` builds the model from the checkpoint's saved provider with CPU-initialized
  weights in a gloo group (Transformer Engine's layers still need a CUDA device to be built: export runs on a GPU
  machine), loads its weights, and `save_hf_pretrained` writes config.json and the safetensors.
- fsdp_dtensor (Megatron-FSDP's PyTorch DCP shards, which export_ckpt cannot read): the run's own ranks, on its
  world on one node, load the iteration as a resume does and call save_hf_pretrained, which gathers each sharded
  weight (`export_sharded`).
The HF config and processor come from the run: its `model.hf_path` dir when set, else the model group's
`hf_config` and vlmtrain's offline processor.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.launch.local import RUN_CONFIG

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

TRACKER = "latest_checkpointed_iteration.txt"
DONE = "train_state.pt"
"""Bridge writes iter_N/train_state.pt once iteration N's checkpoint is whole; a dir without it was cut short."""
EXPORT_LOG = "export.log"
FORMATS = {"metadata.json": "torch_dist", ".metadata": "fsdp_dtensor"}
"""The file each format's finished iteration dir holds (megatron.bridge.training.checkpointing's detection)."""


class ExportError(ValueError):
    """A wrong run dir, a missing iteration or a non-empty output dir: named before any model is built."""


@dataclass(frozen=True)
class Source:
    run_dir: Path
    run: RunConfig
    iteration: int
    iter_dir: Path
    ckpt_format: str
    ranks: int
    """The GPUs an fsdp_dtensor export launches (the run's world); 0 for torch_dist, converted in this process."""


def iter_dirs(ckpt: Path) -> dict[int, Path]:
    """Every iter_XXXXXXX dir in ckpt by its iteration, finished or not."""
    return {int(p.name[5:]): p for p in ckpt.glob("iter_*") if p.is_dir() and p.name[5:].isdigit()}


def saved_iterations(ckpt: Path) -> list[int]:
    """The iterations whose checkpoint is whole (train_state.pt written), ascending."""
    return sorted(i for i, d in iter_dirs(ckpt).items() if (d / DONE).is_file())


def checkpoint_format(iter_dir: Path) -> str:
    for name, fmt in FORMATS.items():
        if (iter_dir / name).is_file():
            return fmt
    raise ExportError(f"{iter_dir} holds neither metadata.json (torch_dist) nor .metadata (fsdp_dtensor)")


def saved_run(run_dir: Path) -> tuple[RunConfig, Path]:
    """The run's composed config and its train.checkpoint_dir; a relative one is relative to the dir train.py ran
    in, the repo root."""
    from vlmtrain.config.compose import CONF_DIR, load_run

    config = run_dir / RUN_CONFIG
    if not config.is_file():
        raise ExportError(f"{run_dir} is not a run dir: it has no {RUN_CONFIG}")
    run = load_run(config)
    if not run.train.checkpoint_dir or not run.train.save_interval:
        raise ExportError(f"{run_dir} saved no checkpoints (train.save_interval is not set)")
    ckpt = Path(run.train.checkpoint_dir)
    if not ckpt.is_absolute():
        ckpt = CONF_DIR.parent / ckpt
    return run, ckpt


def locate(run_dir: Path, iteration: int | None, out: Path) -> Source:
    """The checkpoint to export, or an ExportError naming what is wrong."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run dir: no such directory")
    run, ckpt = saved_run(run_dir)
    saved = saved_iterations(ckpt) if ckpt.is_dir() else []
    if not saved:
        raise ExportError(f"{run_dir}: no finished checkpoint in {ckpt}")
    if iteration is None:
        tracked = ckpt / TRACKER
        iteration = int(tracked.read_text().strip()) if tracked.is_file() else saved[-1]
    if iteration not in saved:
        raise ExportError(f"iteration {iteration} was not saved in {ckpt}; saved: {', '.join(map(str, saved))}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} is not empty: give an empty or new output dir")
    d = iter_dirs(ckpt)[iteration]
    fmt = checkpoint_format(d)
    return Source(run_dir, run, iteration, d, fmt, ranks_for(run) if fmt == "fsdp_dtensor" else 0)


def hf_side(run: RunConfig, out: Path, say=print) -> None:
    """Say where the HF config and processor come from; without `model.hf_path`, write vlmtrain's offline
    processor into `out` first (it moves its finished folder into place), for `bridge_for` to read."""
    if run.model.hf_path:
        say(f"HF config and processor from model.hf_path={run.model.hf_path}")
        return
    from vlmtrain.data.processor import build_processor

    say("HF config: the model group's hf_config; processor: vlmtrain's offline one")
    build_processor(out)


def bridge_for(run: RunConfig, out: Path) -> tuple[Any, str | None]:
    """(AutoBridge, source_path for save_hf_pretrained) of the run: its `model.hf_path` dir, else its model group's
    hf_config with the vision token ids of the processor hf_side wrote into `out`."""
    import torch  # noqa: F401  (before transformer_engine, which Bridge imports)
    from megatron.bridge import AutoBridge

    if run.model.hf_path:
        return AutoBridge.from_hf_pretrained(run.model.hf_path), run.model.hf_path
    from vlmtrain.config.groups.model import hf_config
    from vlmtrain.data.processor import vision_token_ids

    return AutoBridge.from_hf_config(hf_config(run.model, vision_token_ids(out))), None


def export(src: Source, out: Path, say=print) -> Path:
    """Write the HF checkpoint of `src` into `out` (config.json, safetensors, processor files); returns `out`."""
    run = src.run
    say(f"exporting {src.iter_dir} (iteration {src.iteration}, {src.ckpt_format}) to {out}")
    hf_side(run, out, say)
    if src.ckpt_format == "fsdp_dtensor":
        return export_sharded(src, out, say)
    bridge, source = bridge_for(run, out)
    from vlmtrain.train import bridge_patches

    bridge_patches.install(run)  # the checkpoint's saved model config builds only as the run's was (wgrad_fusion)
    say("loading the Megatron checkpoint on CPU and converting to HF weights")
    bridge.export_ckpt(str(src.iter_dir), str(out), show_progress=True, source_path=source)
    say(f"done: {out}")
    return out


def ranks_for(run: RunConfig) -> int:
    """The GPUs an fsdp_dtensor export takes: the run's own world, on this node (its Megatron-FSDP layout loads
    the DCP shards as the run's resume does)."""
    from vlmtrain.config import world

    want, have = run.nodes * world.gpus_per_node(run), world.local_gpus()
    if run.nodes > 1 or want > have:
        raise ExportError(f"an fsdp_dtensor checkpoint is exported on the run's own world ({run.nodes} node(s) x "
                          f"{world.gpus_per_node(run)} GPUs) on one node, and this node has {have} GPU(s): run "
                          "`vlmtrain export` on a node with that many GPUs")
    return want


def export_sharded(src: Source, out: Path, say=print) -> Path:
    """fsdp_dtensor: the run's own ranks rebuild its Megatron-FSDP model, load the iteration as a resume would
    (Bridge's load_fsdp_dtensor_checkpoint, no optimizer state) and write the HF checkpoint through Bridge's
    save_hf_pretrained, which gathers each sharded weight (`rank_main`). Rank logs: <run dir>/export-iter_N."""
    from vlmtrain.config.resolve import resolve
    from vlmtrain.launch import local

    run = copy.deepcopy(src.run)  # the launch's own output and checkpoint dirs
    run.output_dir = str(src.run_dir / f"export-{src.iter_dir.name}")
    run.train.checkpoint_dir = str(src.iter_dir.parent)  # absolute: the ranks may start elsewhere
    say(f"launching {src.ranks} rank(s) to load the Megatron-FSDP checkpoint and gather its weights "
        f"(log: {run.output_dir}/{EXPORT_LOG})")
    rc = local.launch(run, resolve(run), module=__name__, log=EXPORT_LOG, args=(str(out), str(src.iteration)))
    if rc != 0 or not (out / "config.json").is_file():
        raise ExportError(f"the export ranks ended with status {rc} and no {out}/config.json: see "
                          f"{run.output_dir}/{EXPORT_LOG}")
    say(f"done: {out}")
    return out


def save_hf(run: RunConfig, out: Path, context: Any) -> None:
    """Bridge's on_data_init_start, fired once setup() has built the model and loaded the checkpoint and before
    any dataset is opened: every rank joins save_hf_pretrained, then the process ends (the export needs nothing else
    of the run: no data loader, step or save)."""
    import os

    import torch

    bridge, source = bridge_for(run, out)
    rank0 = torch.distributed.get_rank() == 0
    bridge.save_hf_pretrained(context.model, str(out), show_progress=rank0, source_path=source, strict=False)
    torch.distributed.barrier()
    if rank0:
        print(f"[vlmtrain] export: HF checkpoint written to {out}", flush=True)
    os._exit(0)  # Bridge would go on to build the data and train: the export is complete


def rank_main(config: str, out: str, iteration: str) -> None:
    """One export rank (`python -m vlmtrain.train.hf_export <run_config.yaml> <out> <iteration>`): the run's
    container as training builds it, set to load `iteration` without optimizer or RNG state, through pretrain()."""
    from functools import partial

    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain.config.groups import data
    from vlmtrain.train import trainer
    from vlmtrain.worker import loaded

    run, res = loaded(config)
    cfg, _ = trainer.build(run, res)
    cfg.checkpoint.ckpt_step = int(iteration)
    cfg.checkpoint.load_optim = False
    cfg.checkpoint.load_rng = False
    callbacks = CallbackManager()
    callbacks.register("on_data_init_start", partial(save_hf, run, Path(out)))
    pretrain(cfg, data.forward_step(run), callbacks=callbacks)
    raise RuntimeError("pretrain() returned without firing on_data_init_start: nothing was exported")


def main(run_dir: Path, iteration: int | None, out: Path) -> int:
    try:
        export(locate(run_dir, iteration, Path(out)), Path(out))
    except ExportError as e:
        print(f"vlmtrain export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    rank_main(*sys.argv[1:])
