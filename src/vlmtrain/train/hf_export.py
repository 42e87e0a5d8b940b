"""`vlmtrain export <run dir> [--iteration N] --out <dir> [hydra/launcher=slurm ...]`: a Hugging Face checkpoint
from a run's own checkpoints.

Everything that can be wrong is checked before any heavy import (`locate`, `check_node`): the run dir holds the
composed config (run_config.yaml), its checkpoint dir (train.checkpoint_dir) holds finished iter_XXXXXXX dirs, the
asked iteration is one of them (default: the one latest_checkpointed_iteration.txt names), the output dir is empty,
the run's `model.hf_path` (or `--hf-path`, where it moved) is still a checkpoint of its model, and this node (or the
Slurm launcher) can run what the format needs (`check_node`). The format is read from the iteration's files, as
Bridge's loader detects it: metadata.json is torch_dist, .metadata is fsdp_dtensor (PyTorch DCP). The export writes
into a new sibling of the output dir and moves it into place once complete (`staged`): a failed export leaves the
output dir as it was, so the retry runs.

The conversion is Megatron Bridge's own, with the same parameter mapping that imports HF weights.
- torch_dist: `AutoBridge.export_ckpt` builds the model from the checkpoint's saved provider with CPU-initialized
  weights in a gloo group (Transformer Engine's layers still need a CUDA device to be built: export runs on a GPU
  machine), loads its weights, and `save_hf_pretrained` writes config.json and the safetensors.
- fsdp_dtensor (Megatron-FSDP's PyTorch DCP shards, which export_ckpt cannot read): GPU ranks load the iteration
  as a resume does and call save_hf_pretrained, which gathers each sharded weight (`export_sharded`): the run's own
  world where this node has it; else this node's GPUs, into which torch DCP reshards every saved DTensor (Megatron
  saves experts under global indices, so any EP that divides them reads them: `reshard_plan` checks the files and
  the memory estimate the resharded state first); or, with `hydra/launcher=slurm`, the run's own world through
  Slurm, as training is launched (`slurm_rank`). They build the run with Bridge's mock data in place of its
  training data, which the export never reads and which may be gone by now (`export_run`).
The HF config and processor come from the run: its `model.hf_path` dir when set, else the model group's
`hf_config` and vlmtrain's offline processor.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.launch.local import RUN_CONFIG

if TYPE_CHECKING:
    from vlmtrain.config import world
    from vlmtrain.config.schema import RunConfig

TRACKER = "latest_checkpointed_iteration.txt"
DONE = "train_state.pt"
"""Bridge writes iter_N/train_state.pt once iteration N's checkpoint is whole; a dir without it was cut short."""
EXPORT_LOG = "export.log"
FORMATS = {"metadata.json": "torch_dist", ".metadata": "fsdp_dtensor"}
"""The file each format's finished iteration dir holds (megatron.bridge.training.checkpointing's detection)."""


class ExportError(ValueError):
    """A wrong run dir, a missing iteration, a non-empty output dir, a moved HF checkpoint or too few GPUs: named
    before any model is built."""


@dataclass(frozen=True)
class Source:
    run_dir: Path
    run: RunConfig
    iteration: int
    iter_dir: Path
    ckpt_format: str
    ranks: int
    """The GPUs an fsdp_dtensor export launches (the run's world); 0 for torch_dist, converted in this process."""
    gpus_per_node: int
    """The run's GPUs per node (an fsdp_dtensor export needs them all on this node)."""


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


def tracked_iteration(ckpt: Path, saved: list[int]) -> int:
    """The iteration latest_checkpointed_iteration.txt names (Megatron's tracker), else the last saved one; an
    ExportError where it names none (Megatron writes `release` for a release checkpoint, kept in release/)."""
    tracked = ckpt / TRACKER
    if not tracked.is_file():
        return saved[-1]
    text = tracked.read_text().strip()
    if not text.isdigit():
        kind = f" (a release checkpoint, in {ckpt / 'release'})" if text == "release" else ""
        raise ExportError(f"{tracked} holds {text!r}{kind}, not an iteration: `vlmtrain export` reads the "
                          f"iter_XXXXXXX dirs a run saved; pass --iteration N, one of {', '.join(map(str, saved))}")
    return int(text)


def locate(run_dir: Path, iteration: int | None, out: Path, hf_path: str | None = None) -> Source:
    """The checkpoint to export, or an ExportError naming what is wrong. `hf_path`: where the run's `model.hf_path`
    checkpoint is now, when it moved (`--hf-path`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run dir: no such directory")
    run, ckpt = saved_run(run_dir)
    saved = saved_iterations(ckpt) if ckpt.is_dir() else []
    if not saved:
        raise ExportError(f"{run_dir}: no finished checkpoint in {ckpt}")
    if iteration is None:
        iteration = tracked_iteration(ckpt, saved)
    if iteration not in saved:
        raise ExportError(f"iteration {iteration} was not saved in {ckpt}; saved: {', '.join(map(str, saved))}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} is not empty: give an empty or new output dir")
    hf_checkpoint_of(run, hf_path)
    d = iter_dirs(ckpt)[iteration]
    fmt = checkpoint_format(d)
    from vlmtrain.config import world

    gpn = world.gpus_per_node(run)
    return Source(run_dir, run, iteration, d, fmt, run.nodes * gpn if fmt == "fsdp_dtensor" else 0, gpn)


def hf_checkpoint_of(run: RunConfig, hf_path: str | None) -> None:
    """The run's HF checkpoint (model.hf_path, or `hf_path` where it moved: set on the run), checked to be a
    checkpoint of the run's model: the export reads its config and processor, and the run's weights map onto it."""
    from vlmtrain.config import hf_checkpoint

    if hf_path and not run.model.hf_path:
        raise ExportError(f"--hf-path {hf_path}: the run started from no Hugging Face checkpoint (its model.hf_path "
                          "is unset), so there is none to find: leave --hf-path out")
    path = hf_path or run.model.hf_path
    if not path:
        return
    fix = ("pass --hf-path <the dir of the checkpoint the run started from>" if hf_path else
           f"put the checkpoint the run started from back at {path}, or pass --hf-path <the dir it moved to>")
    try:
        saved = hf_checkpoint.read(path, "--hf-path" if hf_path else "model.hf_path")
        diff = hf_checkpoint.mismatches(run.model, saved)
    except hf_checkpoint.CheckpointError as e:
        raise ExportError(f"the export reads the run's HF config and processor from its checkpoint, and {e} Fix: "
                          f"{fix}.") from e
    if diff:
        raise ExportError(f"{path} is not a checkpoint of the run's model: {'; '.join(diff)}. Fix: {fix}.")
    run.model.hf_path = str(path)


SLURM = "hydra/launcher=slurm"
"""The export's launcher override that sends it to the run's own world through Slurm, as training goes."""


@dataclass(frozen=True)
class Where:
    """Where an fsdp_dtensor export's ranks run: this node's `gpus` (the run's world, or the checkpoint resharded
    into this node's GPUs), or the run's own world through Slurm (`slurm`: the resolved launcher config)."""

    gpus: int
    resharded: bool = False
    slurm: dict[str, Any] | None = None


def check_node(src: Source, gpus: int, launcher: list[str] | None = None) -> Where | None:
    """Where this export runs, named before anything loads (`gpus`: the GPUs nvidia-smi lists; `launcher`: the
    command's Hydra launcher overrides). torch_dist builds Transformer Engine's layers, which need a CUDA device
    (None: converted in this process). fsdp_dtensor runs the run's own world: on this node where it has the GPUs, else
    resharded into this node's GPUs (torch DCP reads each saved DTensor into any sharding; `reshard_plan` checks the
    files, the memory estimate the resharded model state), or through Slurm on the run's own nodes."""
    run, launcher = src.run, launcher or []
    if src.ckpt_format == "torch_dist":
        if launcher:
            raise ExportError(f"{' '.join(launcher)}: a torch_dist checkpoint is converted in this process (on a GPU "
                              "node); the launcher overrides are for fsdp_dtensor checkpoints")
        if gpus == 0:
            raise ExportError(f"{src.iter_dir} is a torch_dist checkpoint: Bridge converts it on CPU, but Transformer "
                              "Engine's layers need a CUDA device to be built, and this node has no GPU (nvidia-smi "
                              "lists none): run `vlmtrain export` on a GPU node")
        return None
    world = f"{run.nodes} node(s) x {src.gpus_per_node} GPUs"
    via_slurm = (f"or on the run's own world ({world}) through Slurm: vlmtrain export {src.run_dir} --out <dir> "
                 f"{SLURM} hydra.launcher.partition=<partition>")
    if launcher:
        if SLURM not in launcher:
            raise ExportError(f"{' '.join(launcher)}: the export takes {SLURM} and its hydra.launcher.* overrides "
                              "(nothing else: the run's own config is exported)")
        from vlmtrain.launch import slurm

        world_overrides = [f"hardware={run.hardware.name}", f"nodes={run.nodes}", f"gpus_per_node={src.gpus_per_node}"]
        return Where(src.ranks, slurm=slurm.launcher_params(launcher, world_overrides))
    if gpus == 0:
        raise ExportError(f"{src.iter_dir} is an fsdp_dtensor checkpoint, loaded by GPU ranks, and this node has no "
                          "GPU (nvidia-smi lists none): run `vlmtrain export` on a GPU node (the checkpoint is "
                          f"resharded into its GPUs where the run's world was larger), {via_slurm}")
    if run.nodes == 1 and src.ranks <= gpus:
        return Where(src.ranks)
    reshard_plan(src.iter_dir, run, export_layout(src, gpus))
    need, hw = resharded_gib(src, gpus), run.hardware
    if need > hw.memory_gib:
        raise ExportError(f"resharded into this node's {gpus} GPU(s), each export rank would hold ~{need:.0f} GiB of "
                          f"model state (params, grads, FP32 main weights), more than hardware={hw.name}'s "
                          f"{hw.memory_gib:g} GiB: run it on a node with more GPUs, {via_slurm}")
    return Where(gpus, resharded=True)


def export_layout(src: Source, gpus: int) -> world.Layout:
    """The layout the export ranks build on this node's `gpus` (EP re-sized to divide them)."""
    from vlmtrain.config.resolve import resolve

    return resolve(export_run(src, gpus)).layout


def resharded_gib(src: Source, gpus: int) -> float:
    """GiB per export rank of the model state resharded over this node's `gpus`: BF16 params, FP32 grads and FP32
    main weights (Adam's moments come only with a step), one FSDP unit gathered, the CUDA context."""
    from vlmtrain.check import memory
    from vlmtrain.config.resolve import resolve

    run = export_run(src, gpus)
    b = memory.estimate(run, resolve(run))
    main_weights = b.optimizer * memory.GRAD_BYTES / memory.OPTIMIZER_BYTES
    return b.params + b.grads + main_weights + b.fsdp_gather + b.overhead + b.context


EXPERT_KEY = re.compile(r"^(?P<layer>.*\.mlp\.experts)\."
                        r"(?:linear_fc\d\.weight(?P<grouped>\d+)|local_experts\.(?P<seq>\d+)\.)")
"""Megatron-FSDP's expert keys in an fsdp_dtensor checkpoint, with the expert's global index (Megatron Core's
fsdp_dtensor_checkpoint.get_expert_index_from_key: saved under global indices, so any EP reads them)."""


@dataclass(frozen=True)
class ReshardPlan:
    """What the export ranks read of an fsdp_dtensor checkpoint (its DCP metadata, no tensor loaded)."""

    tensors: int
    """Model tensors (`model.*` keys; the optimizer's are not loaded)."""
    model_bytes: int
    experts: dict[str, set[int]]
    """Expert key prefix (one MoE layer's experts) -> the global expert indices saved."""


def reshard_plan(iter_dir: Path, run: RunConfig, lay: world.Layout) -> ReshardPlan:
    """The model tensors of the checkpoint in `iter_dir` as torch DCP's metadata lists them, checked readable into
    `lay`: every tensor's saved chunks cover it (a cut-short save does not), every MoE layer saved all
    model.num_experts experts under global indices, and EP divides them. An ExportError names what is wrong."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    model = {k: v for k, v in meta.items() if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}
    if not model:
        raise ExportError(f"{iter_dir}: its DCP metadata lists no model tensor (model.*): not a Megatron-FSDP "
                          "checkpoint of a model")
    experts: dict[str, set[int]] = {}
    total = 0
    for key, tensor in model.items():
        numel = math.prod(tensor.size)
        if sum(math.prod(c.sizes) for c in tensor.chunks) != numel:
            raise ExportError(f"{iter_dir}: {key}'s saved shards do not cover its {list(tensor.size)} elements: the "
                              "checkpoint is incomplete; export another --iteration")
        total += numel * tensor.properties.dtype.itemsize
        if m := EXPERT_KEY.match(key):
            experts.setdefault(m["layer"], set()).add(int(m["grouped"] or m["seq"]))
    n = run.model.num_experts
    for layer, saved in experts.items():
        if saved != set(range(n)):
            missing = sorted(set(range(n)) - saved)[:8]
            raise ExportError(f"{iter_dir}: {layer} holds {len(saved)} of model.num_experts={n} experts (missing "
                              f"{missing}): the checkpoint is not the run's model, or is incomplete")
    if experts and n % lay.ep:
        raise ExportError(f"{n} experts do not divide over EP {lay.ep} of the export's {lay.world_size} GPU(s)")
    return ReshardPlan(len(model), total, experts)


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new sibling dir of `out` to write the export into, moved to `out` (absent or empty: locate checked) once
    the export is complete and removed when it fails, so a failed export leaves `out` as it was."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.export-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    mode = tmp.stat().st_mode  # the umask's: the processor is moved in from a private temp dir
    try:
        yield tmp
        tmp.chmod(mode)
        tmp.replace(out)  # replaces an empty `out` dir
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def hf_side(run: RunConfig, out: Path, say: Callable[[str], None] = print) -> None:
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


def export(src: Source, out: Path, say=print, where: Where | None = None) -> Path:
    """Write the HF checkpoint of `src` into `out` (config.json, safetensors, processor files), through a staged
    sibling dir; returns `out`."""
    say(f"exporting {src.iter_dir} (iteration {src.iteration}, {src.ckpt_format}) to {out}")
    with staged(out) as into:
        write(src, into, say, where)
    say(f"done: {out}")
    return out


def write(src: Source, into: Path, say=print, where: Where | None = None) -> None:
    """The export's files, into the staged dir `into` (`where`: check_node's answer for fsdp_dtensor)."""
    run = src.run
    hf_side(run, into, say)
    if src.ckpt_format == "fsdp_dtensor":
        export_sharded(src, into, say, where or Where(src.ranks))
        return
    bridge, source = bridge_for(run, into)
    from vlmtrain.train import bridge_patches

    bridge_patches.install(run)  # the checkpoint's saved model config builds only as the run's was (wgrad_fusion)
    say("loading the Megatron checkpoint on CPU and converting to HF weights")
    bridge.export_ckpt(str(src.iter_dir), str(into), show_progress=True, source_path=source)


def export_run(src: Source, gpus: int | None = None) -> RunConfig:
    """The run the fsdp_dtensor export ranks build: the run as it trained (model, layout, kernels, precision; the
    row length its model was built for), its own output dir, the iteration's checkpoint dir, and Bridge's mock data
    in place of the training data: the ranks stop before any dataset is built (`save_hf`), but the container's
    build scans the data it names, which may be gone by now. `gpus`: resharded onto one node of that many GPUs (EP
    re-sized to divide them; the parallelism group's other degrees kept)."""
    from vlmtrain.config import world as worlds
    from vlmtrain.config.groups.data import DataConfig, Kind
    from vlmtrain.config.resolve import resolve

    run = copy.deepcopy(src.run)
    run.output_dir = str(src.run_dir / f"export-{src.iter_dir.name}")
    run.train.checkpoint_dir = str(src.iter_dir.parent)  # absolute: the ranks may start elsewhere
    run.train.seq_length = resolve(run).seq_length  # model.seq_length: a packed run's capacity
    run.train.eval_interval = None  # no held-out samples either
    run.data = DataConfig(kind=Kind.mock, packing=False, cache_dir=run.data.cache_dir)
    if gpus is not None:
        run.nodes, run.gpus_per_node, run.parallelism.ep = 1, gpus, None
        model = dict(worlds.bridge_section(run, "model"))
        if model.pop(worlds.BRIDGE_FIELDS["ep"], None) is not None:
            run.bridge = {**run.bridge, "model": model}
    run.train.global_batch_size = run.train.micro_batch_size * resolve(run).layout.dp  # divides on any world
    return run


def export_sharded(src: Source, into: Path, say=print, where: Where | None = None) -> None:
    """fsdp_dtensor: the run's ranks rebuild its Megatron-FSDP model, load the iteration as a resume would
    (Bridge's load_fsdp_dtensor_checkpoint, no optimizer state) and write the HF checkpoint through Bridge's
    save_hf_pretrained, which gathers each sharded weight (`rank_main`): on this node (`where.resharded`: into its
    GPUs) or on the run's own world through Slurm. Rank logs: <run dir>/export-iter_N."""
    from vlmtrain.config.resolve import resolve
    from vlmtrain.launch import local

    where = where or Where(src.ranks)
    run = export_run(src, where.gpus if where.resharded else None)
    res = resolve(run)
    args = (str(into), str(src.iteration))
    if where.slurm is not None:
        from vlmtrain.launch import slurm

        path = local.save_run_config(run, res)
        say(f"submitting the export to Slurm on the run's world ({res.layout.nodes} node(s) x "
            f"{res.layout.gpus_per_node} GPUs; logs: {run.output_dir}/slurm)")
        job = slurm.submit(slurm_rank, (str(path), *args), where.slurm, f"{run.output_dir}/slurm/%j")
        say(f"Slurm job {job.job_id}: waiting for it")
        job.wait()
        rc, log = (0 if job.state == "COMPLETED" else 1), f"{run.output_dir}/slurm"
    else:
        how = f"resharded from the run's {src.ranks} into this node's {where.gpus}" if where.resharded else \
            "the run's own world"
        say(f"launching {res.layout.world_size} rank(s) ({how}) to load the Megatron-FSDP checkpoint and gather its "
            f"weights (log: {run.output_dir}/{EXPORT_LOG})")
        rc = local.launch(run, res, module=__name__, log=EXPORT_LOG, args=args)
        log = f"{run.output_dir}/{EXPORT_LOG}"
    if rc != 0 or not (into / "config.json").is_file():
        raise ExportError(f"the export ranks ended with status {rc} and wrote no config.json: see {log}")


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
    """One export rank (`python -m vlmtrain.train.hf_export <run_config.yaml> <out> <iteration>`)."""
    from vlmtrain.launch import local

    export_rank(*local.loaded(config), out=out, iteration=iteration)


def slurm_rank(config: str, out: str, iteration: str) -> int:
    """One export rank as a Slurm task (submitit): Slurm's variables to torch.distributed's and the run's env before
    torch (vlmtrain.launch.slurm.in_process), then `export_rank`."""
    from functools import partial

    from vlmtrain.launch import local, slurm

    run, res = local.loaded(config)
    return slurm.in_process(run, res, partial(export_rank, out=out, iteration=iteration))


def export_rank(run: RunConfig, res: Any, out: str, iteration: str) -> None:
    """The run's container as training builds it, set to load `iteration` without optimizer or RNG state, through
    pretrain(), which stops in `save_hf` once the model is loaded."""
    from functools import partial

    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain.config.groups import data
    from vlmtrain.train import trainer

    cfg, _ = trainer.build(run, res)
    cfg.checkpoint.ckpt_step = int(iteration)
    cfg.checkpoint.load_optim = False
    cfg.checkpoint.load_rng = False
    callbacks = CallbackManager()
    callbacks.register("on_data_init_start", partial(save_hf, run, Path(out)))
    pretrain(cfg, data.forward_step(run), callbacks=callbacks)
    raise RuntimeError("pretrain() returned without firing on_data_init_start: nothing was exported")


def main(run_dir: Path, iteration: int | None, out: Path, hf_path: str | None = None,
         launcher: list[str] | None = None) -> int:
    from vlmtrain.config import world as worlds

    try:
        src = locate(run_dir, iteration, Path(out), hf_path)
        where = check_node(src, worlds.local_gpus(), launcher)
        export(src, Path(out), where=where)
    except ExportError as e:
        print(f"vlmtrain export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    rank_main(*sys.argv[1:])
