"""The candidate space of a search stage for one model and world, pruned before anything runs.

Layouts (`layout: fsdp`, `dp` or `3d` in a stage's `vary`, alone or in a list) are every degree set whose sizes
divide: `dp` is data parallelism alone (Megatron's DDP with the distributed optimizer, every model-parallel degree 1:
`3d-ep1`, so the 3D stage does not run it again), the layout with nothing to tune beside FSDP's; EP divides the
experts and the ranks of a stage, TP the GPUs of a node, PP the decoder layers, VPP a stage's layers; ETP only at
ETP = TP, and preflight's `etp_while_ep_fits` then refuses it where EP alone is enough (ETP only when
EP is not enough). A knob's `{around: [d, ...]}` is the parent's value plus each d (the capacity's finer steps near
the memory limit, once the stages before have changed what a row costs); a parent whose value is not a number gets
none. A packed candidate (data.packing=<capacity>, MBS 1) trains GBS in rows (`packed_rows`). Each
candidate is composed as train.py would, placed on the world it will run on and checked by preflight (its memory
estimate, which reads the capacity, included): a candidate with an error finding is pruned, its findings kept as why.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vlmtrain.lab.kit.case import Case, placed_resolved
from vlmtrain.lab.kit.spec import Spec, Stage

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

LAYOUT_KINDS = ("fsdp", "dp", "3d")
FLEX = ("hybridep", "deepep")
"""Dispatchers through DeepEP's package (built for the GPU, not on PyPI): pruned where it is not installed."""
MAX_TP, MAX_PP, VPP = 8, 8, 2
PROBLEM = ("model", "model.num_layers", "hardware", "data", "vision", "train.seq_length", "gpus_per_node", "nodes")
"""What a search is given, not what it searches: the model and its depth, the data, the hardware, which towers train,
the sequence length and the world (and GBS in samples, which a packed candidate turns into rows)."""


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (limit or n) + 1) if n % d == 0]


def _name(kind: str, tp: int = 1, pp: int = 1, vpp: int | None = None, cp: int = 1, ep: int = 1, etp: int = 1) -> str:
    """A layout's name (vlmtrain.lab.kit.spec.layout_overrides): the kind, then each degree above 1 (EP always)."""
    parts = [f"tp{tp}" * (tp > 1), f"pp{pp}" * (pp > 1), f"vpp{vpp}" if vpp else "", f"cp{cp}" * (cp > 1), f"ep{ep}",
             f"etp{etp}" * (etp > 1)]
    return "-".join([kind, *(p for p in parts if p)])


def layouts(kind: str, world_size: int, gpus_per_node: int, num_experts: int, num_layers: int) -> list[str]:
    """Layout names (vlmtrain.lab.kit.spec.layout_overrides) of one kind for this world and model."""
    if kind == "fsdp":
        return [_name("fsdp", ep=ep) for ep in _divisors(math.gcd(world_size, num_experts))]
    if kind == "dp":
        return [_name("3d")]
    out = []
    for tp in _divisors(gpus_per_node, min(MAX_TP, gpus_per_node)):
        for pp in _divisors(num_layers, MAX_PP):
            if world_size % (tp * pp):
                continue
            vpps = [None] + ([VPP] if pp > 1 and (num_layers // pp) % VPP == 0 else [])
            for vpp, etp in itertools.product(vpps, sorted({1, tp})):
                for ep in _divisors(math.gcd(world_size // (pp * etp), num_experts)):
                    out.append(_name("3d", tp, pp, vpp, ep=ep, etp=etp))
    return out


@dataclass(frozen=True)
class Around:
    """A stage's values relative to each parent's: its value plus each delta."""

    deltas: tuple[int, ...]

    def values(self, parent: Any) -> list[int]:
        if not isinstance(parent, int) or isinstance(parent, bool):
            return []
        return [parent + d for d in self.deltas]


@dataclass
class Candidate:
    """A stage's case (a packed one's GBS in rows once pruned), the knob values it was made from, and its pruning."""

    case: Case
    values: dict[str, Any]
    grid: int = 0
    """Which of the stage's grids it comes from (a ladder climbs per grid)."""
    findings: list[str] = field(default_factory=list)
    """Preflight's findings: errors (why it was pruned) first."""
    pruned: bool = False
    predicted: dict[str, Any] | None = None
    """check.speed's prediction of a candidate preflight passes (its step, useful tokens/s/GPU, MFU, terms)."""


def stage_values(stage: Stage, run: RunConfig, world_size: int, gpus_per_node: int) -> list[dict[str, Any]]:
    """Each grid's knobs and their values; `layout: fsdp|3d` expanded for this world and model, `{around: [...]}`
    an Around."""
    out: list[dict[str, Any]] = []
    for grid in stage.grids:
        varied: dict[str, Any] = {}
        for knob, values in grid.items():
            if isinstance(values, dict):
                varied[knob] = Around(tuple(int(d) for d in values["around"]))
                continue
            values = list(values) if isinstance(values, list) else [values]
            if knob == "layout":
                values = [n for v in values for n in (layouts(v, world_size, gpus_per_node, run.model.num_experts,
                                                               run.model.num_layers) if v in LAYOUT_KINDS else [v])]
            varied[knob] = values
        out.append(varied)
    return out


def candidates(spec: Spec, parents: list[dict[str, Any]], grids: list[dict[str, Any]]) -> list[Candidate]:
    """Every parent (a survivor of the last stage) with every combination of each grid's values, once each."""
    seen: dict[str, Candidate] = {}
    for parent in parents:
        for i, grid in enumerate(grids):
            varied = {k: v.values(parent.get(k)) if isinstance(v, Around) else v for k, v in grid.items()}
            for combo in itertools.product(*varied.values()):
                values = spec.values({**parent, **dict(zip(varied, combo, strict=True))})
                seen.setdefault(spec.name_of(values), Candidate(spec.case(values), values, i))
    return list(seen.values())


def placed(overrides: list[str], node_gpus: int) -> RunConfig:
    """The run as train.py composes it, on the world it will run on."""
    return placed_resolved(overrides, node_gpus)[0]


def packed_rows(spec: Spec, overrides: list[str], node_gpus: int) -> list[str]:
    """`train.global_batch_size=<rows>` for a packed candidate, where the spec has `packed_rows: {tokens_per_sample:
    N}`: about the base's samples per step as rows of the capacity (GBS x N / capacity, to the nearest multiple of
    DP, at least DP), since with a capacity GBS counts rows (preflight's packing_is_one_bin); [] otherwise."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    per_sample = (spec.get("packed_rows") or {}).get("tokens_per_sample")
    if not per_sample:
        return []
    try:
        run, res = placed_resolved(overrides, node_gpus)
    except (HydraException, OmegaConfBaseException, ValueError):
        return []  # check() reports it
    cap = res.packing_capacity
    if cap is None:
        return []
    dp = res.layout.dp
    rows = max(1, math.floor(run.train.global_batch_size * per_sample / cap / dp + 0.5)) * dp
    return [f"train.global_batch_size={rows}"]


def check(overrides: list[str], node_gpus: int) -> tuple[list[str], dict[str, Any] | None]:
    """Preflight findings of one composed candidate on the world it will run on (errors first), as the -m sweeper
    checks its jobs, and check.speed's prediction where it passes; a schema or compose error is one finding."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from vlmtrain.check import preflight, speed

    try:
        run, res = placed_resolved(overrides, node_gpus)
        findings = preflight.check(run, res)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        return [f"[error] compose: {' '.join(f'{type(e).__name__}: {e}'.split())}"], None
    if run.dispatcher.backend in FLEX and importlib.util.find_spec("deep_ep") is None:
        findings.append(preflight.Finding("dispatcher_installed", preflight.Severity.error,
                                          f"dispatcher={run.dispatcher.backend} needs DeepEP's deep_ep package, "
                                          "which this machine lacks"))
    errors = preflight.errors(findings)
    predicted = None if errors else speed.predicted(run, res).to_dict()
    return [str(f) for f in errors] + [str(f) for f in findings if f not in errors], predicted


def by_prediction(cands: list[Candidate]) -> list[Candidate]:
    """The candidates preflight passes, fastest predicted useful tokens/s/GPU first (check.speed)."""
    return sorted((c for c in cands if not c.pruned and c.predicted),
                  key=lambda c: -(c.predicted or {})["useful_tokens_per_s_per_gpu"])


def prune(spec: Spec, cands: list[Candidate], node_gpus: int) -> list[Candidate]:
    """Size packed candidates' GBS in rows, then mark the candidates preflight refuses (pruned, with the findings
    that say why) and predict the others' speed; returns all of them."""
    for c in cands:
        c.case = c.case.plus(*packed_rows(spec, c.case.overrides, node_gpus))
        c.findings, c.predicted = check(c.case.overrides, node_gpus)
        c.pruned = any(f.startswith("[error]") for f in c.findings)
    return cands


def problem(overrides: list[str], node_gpus: int) -> dict[str, Any]:
    """The PROBLEM a composed run poses: its group options, field values and world size."""
    from omegaconf import OmegaConf

    from vlmtrain.config.groups import CHOSEN

    run, res = placed_resolved(overrides, node_gpus)
    tree = OmegaConf.structured(run)
    out = {k: run.choices.get(k) if k in CHOSEN else OmegaConf.select(tree, k) for k in PROBLEM
           if k not in ("gpus_per_node", "nodes")}
    return {**out, "world_size": res.layout.world_size}


def layout_name(run: RunConfig, res: Resolved) -> str:
    """The layout a composed run trains with, named as `layouts` names them (`fsdp-ep8`, `3d-tp2-ep4`)."""
    lay = res.layout
    return _name(run.parallelism.kind, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp)


def fill_defaults(spec: Spec, node_gpus: int = 0) -> None:
    """A knob's null default becomes what the base overrides compose to on the world they run on (the group's
    option, the field's value, the layout's name), so a stage's candidate that keeps it is the same trial as its
    parent; a knob of named options stays off."""
    from omegaconf import OmegaConf

    from vlmtrain.config.groups import CHOSEN

    run, res = placed_resolved(spec.base, node_gpus)
    tree = OmegaConf.structured(run)
    for key, value in spec.defaults.items():
        if value is not None or spec.knobs[key].options is not None:
            continue
        if key.startswith("kernels.") and run.choices.get("kernels") == "auto":
            continue  # kernels=auto settles these per candidate: pinned here, kernels=fast could never turn them off
        if key == "layout":
            spec.defaults[key] = layout_name(run, res)
        elif key == "recompute" and run.choices.get(key) == "auto" and "moe" not in run.recompute.modules:
            spec.defaults[key] = str(run.recompute.granularity)  # recompute=auto as it settled: one of its options
        else:
            spec.defaults[key] = run.choices.get(key) if key in CHOSEN else OmegaConf.select(tree, key)
