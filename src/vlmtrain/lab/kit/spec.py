"""Specs (conf/tune/<name>.yaml): the knobs of an experiment and how each value becomes `python train.py` overrides
and a part of the case name, then either named sweeps of cases (`vlmtrain sweep`) or search stages (`vlmtrain tune`).

A case is a mapping knob -> value over the spec's `defaults`. A knob is an override key (`train.micro_batch_size`,
`recompute`, ...), `layout` (a layout name: `fsdp-ep2`, `3d-tp2-pp2-vpp2-ep2-etp2`: the parallelism group and its
degrees), or a knob with `options` (named override bundles; `cutlass+fused` takes two). A null value sets nothing.
Sweep entries may hold `grid: {knob: [values]}`: one case per combination, in order, the other keys fixed.
A packing knob with `mbs_as_capacity` keeps cases named by their samples per micro-batch (`mbs8_packed`) while they
run as packing by token budget (`mbs_as_capacity()`).
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vlmtrain.config.compose import CONF_DIR
from vlmtrain.lab.kit.case import Case

SPEC_DIR = CONF_DIR / "tune"
LAYOUT = re.compile(r"^(fsdp|3d)((?:-(?:tp|pp|vpp|cp|ep|etp)\d+)*)$")
TOP_KEYS = frozenset({"base", "knobs", "defaults", "prefix", "sweeps", "stages", "finalists", "early_stop",
                      "claims", "best", "tie", "mock_pair", "gpus", "iterations", "repeats", "case_s", "results",
                      "packed", "kernels_best", "packed_rows", "compare"})
MBS, GBS = "train.micro_batch_size", "train.global_batch_size"


class SpecError(ValueError):
    """A spec that cannot mean anything: the message names the key and what it may be."""


def text(value: Any) -> str:
    """A knob value as Hydra's override grammar writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(text(v) for v in value) + "]"
    return str(value)


def mbs_as_capacity(overrides: list[str], key: str, tokens_per_sample: int, at_least: int) -> list[str]:
    """`<key>=true` at MBS m and GBS g (m samples packed per micro-batch, the form before packing by token
    budget) as that packing: one row of max(m x tokens_per_sample, at_least) tokens per micro-batch (`<key>=<that>`),
    MBS 1 and g / m rows per step, so a row holds about the m samples the old micro-batch held."""
    values = dict(o.split("=", 1) for o in overrides if o.startswith((f"{MBS}=", f"{GBS}=", f"{key}=")))
    if values.get(key) != "true" or MBS not in values or GBS not in values:
        raise SpecError(f"mbs_as_capacity: needs {key}=true, {MBS} and {GBS} among {' '.join(overrides)}")
    m, g = int(values[MBS]), int(values[GBS])
    new = {MBS: "1", GBS: str(g // m), key: str(max(m * tokens_per_sample, at_least))}
    return [f"{k}={new[k]}" if (k := o.split("=", 1)[0]) in new else o for o in overrides]


def layout_overrides(name: str) -> list[str]:
    """`3d-tp2-ep2` -> parallelism=3d parallelism.tp=2 parallelism.ep=2."""
    m = LAYOUT.match(name)
    if not m:
        raise SpecError(f"layout {name!r}: write <fsdp|3d>[-tp<N>][-pp<N>][-vpp<N>][-cp<N>][-ep<N>][-etp<N>]")
    degrees = re.findall(r"-([a-z]+)(\d+)", m.group(2))
    return [f"parallelism={m.group(1)}", *(f"parallelism.{k}={n}" for k, n in degrees)]


@dataclass(frozen=True)
class Knob:
    key: str
    label: str | None = None
    """The case-name part, `{}` for the value; None: the knob is not part of names."""
    labels: dict[str, str | None] = field(default_factory=dict)
    """Per value (as `text` writes it): its name part instead of `label` (null: none)."""
    options: dict[str, list[str]] | None = None
    """Named override bundles; a value `a+b` takes a's and b's."""
    mbs_as_capacity: dict[str, int] | None = None
    """`{tokens_per_sample: N, at_least: M}`: the value true runs the case's MBS as a capacity (mbs_as_capacity())."""

    def overrides(self, value: Any) -> list[str]:
        if value is None:
            return []
        if self.key == "layout":
            return layout_overrides(str(value))
        if self.options is None:
            return [f"{self.key}={text(value)}"]
        return [o for part in self.parts(value) for o in self.options[part]]

    def parts(self, value: Any) -> list[str]:
        assert self.options is not None
        names = text(value).split("+")
        unknown = [n for n in names if n not in self.options]
        if unknown:
            raise SpecError(f"knob {self.key}: no option {unknown[0]!r} (options: {', '.join(self.options)})")
        return names

    def name_parts(self, value: Any) -> list[str]:
        if value is None:
            return []
        if text(value) in self.labels:
            part = self.labels[text(value)]
            return [part] if part else []
        if self.options is not None and self.label is None:
            return self.parts(value)
        return [] if self.label is None else [self.label.format(text(value))]


@dataclass(frozen=True)
class Stage:
    name: str
    grids: list[dict[str, Any]]
    """knob -> values, one mapping per grid (`vary`: a mapping, or a list of them whose candidates come in order);
    for `layout` also `fsdp`, `dp` or `3d`: every such layout the world allows, and `{around: [d, ...]}`: the
    parent's value plus each d (vlmtrain.lab.tune.space)."""
    iterations: int
    keep: int = 1
    """Survivors: the next stage varies its knobs on each of them."""
    ladder: tuple[str, ...] = ()
    """Knobs whose values run in order, per grid and combination of the others, until one is slower or fails."""
    gate: dict[str, float] = field(default_factory=dict)
    """`mfu_below: X`: run only while the incumbent's MFU is below X (the 3D stage: headroom worth the work)."""

    @property
    def knobs(self) -> list[str]:
        """The knobs the stage varies, in order."""
        return list(dict.fromkeys(k for grid in self.grids for k in grid))


@dataclass
class Spec:
    name: str
    raw: dict[str, Any]
    knobs: dict[str, Knob]
    defaults: dict[str, Any]
    base: list[str]
    stages: list[Stage]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def values(self, entry: dict[str, Any]) -> dict[str, Any]:
        unknown = [k for k in entry if k not in self.knobs]
        if unknown:
            raise SpecError(f"{self.name}: unknown knob {unknown[0]!r} (knobs: {', '.join(self.knobs)})")
        return {**self.defaults, **entry}

    def case(self, entry: dict[str, Any], iterations: int | None = None) -> Case:
        """The case of `entry` (knob -> value, over the defaults): its name, every override of `python train.py`
        (the spec's `base`, the knobs' overrides, `train.iterations` where given) and the spec's GPUs."""
        return Case(self.name_of(entry), int(self.get("gpus", 1)), [*self.base, *self.knob_overrides(entry),
                    *([f"train.iterations={iterations}"] if iterations is not None else [])])

    def name_of(self, entry: dict[str, Any]) -> str:
        """The case name of `entry`: the prefix and each knob's name part."""
        values = self.values(entry)
        parts = [p for k, knob in self.knobs.items() for p in knob.name_parts(values.get(k))]
        return "_".join([self.get("prefix"), *parts] if self.get("prefix") else parts)

    def knob_overrides(self, entry: dict[str, Any]) -> list[str]:
        """The overrides the knobs of `entry` make."""
        values = self.values(entry)
        overrides = [o for k, knob in self.knobs.items() for o in knob.overrides(values.get(k))]
        for k, knob in self.knobs.items():
            if knob.mbs_as_capacity and values.get(k) is True:
                overrides = mbs_as_capacity(overrides, k, **knob.mbs_as_capacity)
        return overrides

    def entries(self, sweep: str) -> list[dict[str, Any]]:
        """A sweep's cases as knob -> value mappings (grids expanded in order)."""
        sweeps = self.get("sweeps") or {}
        if sweep not in sweeps:
            raise SpecError(f"{self.name}: no sweep {sweep!r} (sweeps: {', '.join(sweeps)})")
        out = []
        for entry in sweeps[sweep]:
            fixed = {k: v for k, v in entry.items() if k != "grid"}
            grid = entry.get("grid") or {}
            for combo in itertools.product(*grid.values()):
                out.append({**fixed, **dict(zip(grid, combo, strict=True))})
        return out

    def beyond_base(self, case: Case) -> list[str]:
        """A case's overrides after the spec's base (what tune's trials and preset record beside the base)."""
        assert case.overrides[: len(self.base)] == self.base, f"{case.name} is not a case of spec {self.name}"
        return case.overrides[len(self.base):]

    def expand(self, sweeps: list[str], only: list[str] | None = None, iterations: int | None = None) -> list[Case]:
        """The cases of the named sweeps ("all": every sweep), in order, each once (sweeps share cases)."""
        names = list(self.get("sweeps") or {}) if "all" in sweeps else sweeps
        seen: dict[str, Case] = {}
        for sweep in names:
            for entry in self.entries(sweep):
                name = self.name_of(entry)
                if name not in seen and (not only or any(s in name for s in only)):
                    seen[name] = self.case(entry, iterations)
        return list(seen.values())


def _knob(key: str, raw: Any) -> Knob:
    raw = raw or {}
    labels = {text(k): v for k, v in (raw.get("labels") or {}).items()}
    options = raw.get("options")
    return Knob(key, raw.get("label"), labels, {text(k): list(v) for k, v in options.items()} if options else None,
                raw.get("mbs_as_capacity"))


def _stage(raw: dict[str, Any]) -> Stage:
    try:
        vary, ladder = raw["vary"], raw.get("ladder") or ()
        for grid in vary if isinstance(vary, list) else [vary]:
            for knob, values in grid.items():
                if isinstance(values, dict) and (set(values) != {"around"} or not isinstance(values["around"], list)):
                    raise SpecError(f"stage {raw['name']}: {knob}: a mapping of values is {{around: [d, ...]}}")
        return Stage(name=raw["name"], grids=[dict(g) for g in (vary if isinstance(vary, list) else [vary])],
                     iterations=int(raw["iterations"]), keep=int(raw.get("keep", 1)),
                     ladder=(ladder,) if isinstance(ladder, str) else tuple(ladder), gate=dict(raw.get("gate") or {}))
    except KeyError as e:
        raise SpecError(f"stage {raw.get('name', '?')}: missing {e.args[0]!r} (name, vary, iterations)") from e


def path_of(name: str | Path) -> Path:
    path = Path(name)
    return path if path.suffix == ".yaml" else SPEC_DIR / f"{name}.yaml"


def for_command(args: argparse.Namespace, command: str) -> Spec | None:
    """The spec `args.spec` names, for `vlmtrain <command>`, which sets `args.entry` (`vlmtrain <command> <spec>`: the
    command its rows and report name); None, the reason on stderr, where there is no such spec."""
    try:
        spec = load(args.spec)
    except SpecError as e:
        print(f"vlmtrain {command}: {e}", file=sys.stderr)
        return None
    args.entry = f"vlmtrain {command} {args.spec}"
    return spec


def load(name: str | Path) -> Spec:
    """conf/tune/<name>.yaml, or a path to a spec."""
    path = path_of(name)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SPEC_DIR.glob("*.yaml")))
        raise SpecError(f"no spec {path} (specs in {SPEC_DIR}: {known})")
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise SpecError(f"{path}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(TOP_KEYS))})")
    knobs = {k: _knob(k, v) for k, v in (raw.get("knobs") or {}).items()}
    spec = Spec(path.stem, raw, knobs, {}, list(raw.get("base") or []), [_stage(s) for s in raw.get("stages") or []])
    spec.defaults = spec.values(raw.get("defaults") or {})
    for stage in spec.stages:
        for grid in stage.grids:
            spec.values(grid)  # every varied knob is declared
        if set(stage.ladder) - set(stage.knobs):
            raise SpecError(f"stage {stage.name}: ladder {', '.join(stage.ladder)} is not among its knobs "
                            f"({', '.join(stage.knobs)})")
    return spec
