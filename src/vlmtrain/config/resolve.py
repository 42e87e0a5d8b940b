"""Resolve: every value derived from the composed RunConfig, computed once right after compose.

Preflight, the dry-run plan, the launchers (env vars), the training callbacks and the report read these values
from one `Resolved` instead of deriving them again, so no two of them can disagree on, say, DP or the padding.
The layout follows `+bridge.model.*` overrides of the parallel degrees (config.world), as the built container
does. Each run saves it as `run.json` in its run dir, next to `run_config.yaml`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config import world
from vlmtrain.config.tokens import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

RUN_JSON = "run.json"
ENV_GROUPS = ("hardware", "kernels", "model", "dispatcher", "cuda_graph")
"""The groups that contribute env vars, in the order they are merged (a later group wins)."""


@dataclass(frozen=True)
class Auto:
    """What an `auto` default was settled to where the run is placed (check.defaults), and why."""

    option: str
    """The option settled: `data.packing`, or `kernels.<field>` for each replacement."""
    value: str
    """What it runs with: the capacity, the field's value, or `off`."""
    why: str
    """The evidence it rests on, or why it was left off (preflight's info findings say it)."""


@dataclass(frozen=True)
class Resolved:
    layout: world.Layout
    """Nodes, GPUs per node and every parallel degree (auto EP resolved, `+bridge.model.*` overrides applied)."""
    stage_layers: tuple[range, ...]
    """Decoder layer indices of each pipeline stage (config.world.stage_layers)."""
    pad_to_max_length: bool
    """The dataset config's pad_to_max_length once Bridge has finalized it: what the data group asks for
    (data.pad_to_max_length, CUDA graphs' static shapes: config.groups.data.pads_to_max_length), or PP>1 or EP>1
    (Bridge's validate forces it there)."""
    pads_to_seq_length: bool
    """Every sample runs padded to train.seq_length: pad_to_max_length, unless data.packing (the packing collate
    keeps real tokens only)."""
    seq_length: int
    """Tokens per sample: exact when padded, else the upper bound (the capacity when packed)."""
    packing_capacity: int | None
    """data.packing: tokens per packed micro-batch row (one bin), None without packing."""
    packing_static: bool
    """A packed row is padded to exactly the capacity: data.packing_static, CUDA graphs (one static shape) or PP>1
    (Megatron's pipeline buffers are capacity x 1: vlmtrain does not ask for variable_seq_lengths)."""
    pack_align: int
    """Each sample's segment in a packed row is padded to a multiple of this: Bridge's CP/SP collate multiple
    (2 x CP, TP under sequence parallelism; training/config.py computes it only for its own dataset configs)
    and the quantized GEMMs' token multiple (config.groups.precision.GEMM_TOKEN_MULTIPLE)."""
    grad_accum: int
    """Micro-batches per step: train.global_batch_size / (micro_batch_size x DP) (preflight checks it divides)."""
    env: dict[str, dict[str, str]]
    """Env vars the launcher exports before torch is imported, by the group that asks for them (ENV_GROUPS)."""
    collate_image_tokens: tuple[int, int]
    """(fewest, most) LLM tokens of one image after Bridge's collate resizes it."""
    checkpoint_dir: str | None
    """train.checkpoint_dir (its default filled in by config.compose.to_run)."""
    auto: tuple[Auto, ...] = ()
    """The `auto` defaults check.defaults settled for this world (empty for a run resolved without placement)."""

    @property
    def left_off(self) -> tuple[Auto, ...]:
        """The auto replacements this run goes without (preflight says why)."""
        return tuple(a for a in self.auto if a.value == "off")

    @property
    def env_vars(self) -> dict[str, str]:
        """Every group's env vars merged, in ENV_GROUPS order."""
        return merge_env(self.env)

    @property
    def padded(self) -> bool:
        """The micro-batch row runs at seq_length: every sample padded to it, or the packed row to its capacity."""
        return self.pads_to_seq_length or self.packing_static

    @property
    def stage_sizes(self) -> list[int]:
        """Decoder layers per pipeline stage."""
        return [len(r) for r in self.stage_layers]

    def to_json(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "layout": {**dataclasses.asdict(lay), "world_size": lay.world_size, "dp": lay.dp,
                       "expert_dp": lay.expert_dp},
            "stage_layers": [[r.start, r.stop] for r in self.stage_layers],
            "pad_to_max_length": self.pad_to_max_length,
            "pads_to_seq_length": self.pads_to_seq_length,
            "seq_length": self.seq_length,
            "packing_capacity": self.packing_capacity,
            "packing_static": self.packing_static,
            "pack_align": self.pack_align,
            "grad_accum": self.grad_accum,
            "env": self.env,
            "collate_image_tokens": list(self.collate_image_tokens),
            "checkpoint_dir": self.checkpoint_dir,
            "auto": [dataclasses.asdict(a) for a in self.auto],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Resolved:
        names = {f.name for f in dataclasses.fields(world.Layout)}
        return cls(
            layout=world.Layout(**{k: v for k, v in data["layout"].items() if k in names}),
            stage_layers=tuple(range(a, b) for a, b in data["stage_layers"]),
            pad_to_max_length=bool(data["pad_to_max_length"]),
            pads_to_seq_length=bool(data["pads_to_seq_length"]),
            seq_length=int(data["seq_length"]),
            packing_capacity=data.get("packing_capacity"),
            packing_static=bool(data.get("packing_static", False)),
            pack_align=int(data.get("pack_align", 1)),
            grad_accum=int(data["grad_accum"]),
            env={g: dict(v) for g, v in data["env"].items()},
            collate_image_tokens=(int(data["collate_image_tokens"][0]), int(data["collate_image_tokens"][1])),
            checkpoint_dir=data.get("checkpoint_dir"),
            auto=tuple(Auto(**a) for a in data.get("auto", [])),
        )


def merge_env(env: dict[str, dict[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for group in (*ENV_GROUPS, *(g for g in env if g not in ENV_GROUPS)):
        out.update(env.get(group, {}))
    return out


def group_env(run: RunConfig, lay: world.Layout) -> dict[str, dict[str, str]]:
    """Env vars by group: the hardware's own, the kernels group's, the model group's (Qwen3.5's kernel caches and
    FLA backend), HybridEP topology when that dispatcher runs, and NCCL_GRAPH_REGISTER=0 when CUDA graphs meet
    expandable segments (Megatron asserts it: illegal memory access otherwise). Groups with none are left out."""
    from vlmtrain.config.groups import hardware, kernels, model

    env = {"hardware": {k: str(v) for k, v in run.hardware.env.items()}, "kernels": kernels.env(run),
           "model": model.env(run)}
    if run.dispatcher.backend == "hybridep":
        env["dispatcher"] = hardware.hybridep_env(run.hardware, lay.ep)
    if run.cuda_graph.modules and "expandable_segments:True" in merge_env(env).get("PYTORCH_CUDA_ALLOC_CONF", ""):
        env["cuda_graph"] = {"NCCL_GRAPH_REGISTER": "0"}
    return {g: v for g, v in env.items() if v}


def resolve(run: RunConfig) -> Resolved:
    """Every derived value of `run` (pure arithmetic on the config: no Bridge, no torch, no file access)."""
    from vlmtrain.config.groups import cuda_graph, precision
    from vlmtrain.config.groups.data import capacity, pads_to_max_length, row_length
    from vlmtrain.config.groups.train import global_batch_size

    lay = world.layout(run)
    t = run.train
    pad = pads_to_max_length(run) or lay.pp > 1 or lay.ep > 1
    cap = capacity(run)
    cp_sp = math.lcm(2 * lay.cp if lay.cp > 1 else 1, lay.tp if lay.tp > 1 else 1)
    return Resolved(
        layout=lay,
        stage_layers=tuple(world.stage_layers(run, lay)),
        pad_to_max_length=pad,
        pads_to_seq_length=pad and cap is None,
        seq_length=row_length(run),
        packing_capacity=cap,
        packing_static=cap is not None and (run.data.packing_static or cuda_graph.enabled(run) or lay.pp > 1),
        pack_align=math.lcm(cp_sp, precision.gemm_token_multiple(run)) if cap else 1,
        grad_accum=global_batch_size(run) // max(t.micro_batch_size * lay.dp, 1),
        env=group_env(run, lay),
        collate_image_tokens=(COLLATE_MIN_TOKENS, COLLATE_MAX_TOKENS),
        checkpoint_dir=t.checkpoint_dir,
    )


def save(resolved: Resolved, run_dir: str | Path) -> Path:
    """`<run dir>/run.json` (redacted: a hardware.env value may carry a credential)."""
    from vlmtrain.config import redact

    path = Path(run_dir) / RUN_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact.redact(resolved.to_json()), indent=2) + "\n")
    return path


def load(run_dir: str | Path) -> Resolved | None:
    """The run.json a run saved in `run_dir`; None for a run dir without one (older runs)."""
    path = Path(run_dir) / RUN_JSON
    if not path.is_file():
        return None
    try:
        return Resolved.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, IndexError):
        return None
