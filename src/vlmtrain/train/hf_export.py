"""`vlmtrain export <run dir> [--iteration N] --out <dir>`: a Hugging Face checkpoint from a run's own checkpoints.

Everything that can be wrong is checked before any heavy import (`locate`): the run dir holds the composed config
(run_config.yaml), its checkpoint dir (train.checkpoint_dir) holds finished iter_XXXXXXX dirs, the asked iteration
is one of them (default: the one latest_checkpointed_iteration.txt names), and the output dir is empty. The format
is read from the iteration's files, as Bridge's loader detects it: metadata.json is torch_dist, .metadata is
fsdp_dtensor (PyTorch DCP).

The conversion is Megatron Bridge's own: `AutoBridge.export_ckpt` builds the model from the checkpoint's saved
provider with CPU-initialized weights in a gloo group (Transformer Engine's layers still need a CUDA device to be
built: export runs on a GPU machine), loads its weights, and `save_hf_pretrained` writes config.json and the
safetensors through the same parameter mapping that imports HF weights. The HF config and processor come from
the run: its `model.hf_path` dir when set, else the model group's `hf_config` and vlmtrain's offline processor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vlmtrain.launch.local import RUN_CONFIG

TRACKER = "latest_checkpointed_iteration.txt"
DONE = "train_state.pt"
"""Bridge writes iter_N/train_state.pt once iteration N's checkpoint is whole; a dir without it was cut short."""
FORMATS = {"metadata.json": "torch_dist", ".metadata": "fsdp_dtensor"}
"""The file each format's finished iteration dir holds (megatron.bridge.training.checkpointing's detection)."""


class ExportError(ValueError):
    """A wrong run dir, a missing iteration or a non-empty output dir: named before any model is built."""


@dataclass(frozen=True)
class Source:
    run_dir: Path
    iteration: int
    iter_dir: Path
    ckpt_format: str


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


def checkpoint_dir(run_dir: Path) -> Path:
    """The run's train.checkpoint_dir; a relative one is relative to the dir train.py ran in, the repo root."""
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
    return ckpt


def locate(run_dir: Path, iteration: int | None, out: Path) -> Source:
    """The checkpoint to export, or an ExportError naming what is wrong."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run dir: no such directory")
    ckpt = checkpoint_dir(run_dir)
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
    return Source(run_dir, iteration, d, checkpoint_format(d))


def export(src: Source, out: Path, say=print) -> Path:
    """Write the HF checkpoint of `src` into `out` (config.json, safetensors, processor files); returns `out`."""
    from vlmtrain.config.compose import load_run

    run = load_run(src.run_dir / RUN_CONFIG)
    if src.ckpt_format != "torch_dist":
        raise ExportError(f"{src.iter_dir}: {src.ckpt_format} checkpoints cannot be exported yet (torch_dist only: "
                          "train with parallelism=3d)")
    say(f"exporting {src.iter_dir} (iteration {src.iteration}, {src.ckpt_format}) to {out}")
    import torch  # noqa: F401  (before transformer_engine, which Bridge imports)
    from megatron.bridge import AutoBridge

    hf_path = run.model.hf_path
    if hf_path:
        say(f"HF config and processor from model.hf_path={hf_path}")
        bridge, source = AutoBridge.from_hf_pretrained(hf_path), hf_path
    else:
        from vlmtrain.config.groups.model import hf_config
        from vlmtrain.data.processor import build_processor, vision_token_ids

        say("HF config: the model group's hf_config; processor: vlmtrain's offline one")
        build_processor(out)  # first: it moves its finished folder into place
        bridge, source = AutoBridge.from_hf_config(hf_config(run.model, vision_token_ids(out))), None
    say("loading the Megatron checkpoint on CPU and converting to HF weights")
    bridge.export_ckpt(str(src.iter_dir), str(out), show_progress=True, source_path=source)
    say(f"done: {out}")
    return out


def main(run_dir: Path, iteration: int | None, out: Path) -> int:
    import sys

    try:
        export(locate(run_dir, iteration, Path(out)), Path(out))
    except ExportError as e:
        print(f"vlmtrain export: {e}", file=sys.stderr)
        return 2
    return 0
