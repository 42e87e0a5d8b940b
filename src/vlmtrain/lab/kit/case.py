"""The lab's one definition of a named run, `Case`: every `python train.py` run an experiment makes is one, and the
runner takes nothing else. Its command line is written here and nowhere else (`Case.command_line`); what an
experiment needs beside a run (an expected outcome, a signal, a search's knob values) it keeps in its own class,
which holds a Case.

`placed_resolved`: a composed run placed, settled and resolved as train.py does it, the one `Resolved` every lab
path that builds, estimates or launches a run in process hands down.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@dataclass
class Case:
    """A named run: `python train.py [-m] <command_line()>` on `gpus` GPUs, or, with `module`, that module in each
    of the run's ranks."""

    name: str
    gpus: int | None = 1
    """The GPUs it holds, written as gpus_per_node; None: the run's world is its own (its overrides declare it, a
    sweep's preflight counts the node's GPUs, a dry run takes its hardware's)."""
    overrides: list[str] = field(default_factory=list)
    """Its train.py overrides, whole (a spec's base included)."""
    module: str | None = None
    """What each torchrun rank runs on the case's saved run config instead of training (runner.start_ranks: a
    check's own rank); None: `python train.py`."""
    multirun: bool = False
    """`python train.py -m`: its overrides are a sweep, run in a sweep dir of its own."""
    dry_run: bool | None = None
    """`dry_run=<it>` on the command line; None: train.py's own choice (train on a GPU node, else the plan)."""

    def command_line(self) -> list[str]:
        """Everything after `python train.py [-m]` but the run directory: the overrides, then the world, dry_run and,
        unless the overrides configure W&B themselves, no W&B run (a results row is the lab's record)."""
        world = [] if self.gpus is None else [f"gpus_per_node={self.gpus}"]
        dry = [] if self.dry_run is None else [f"dry_run={str(self.dry_run).lower()}"]
        wandb = [] if any(o.lstrip("+").startswith("wandb.") for o in self.overrides) else ["wandb.enabled=false"]
        return [*self.overrides, *world, *dry, *wandb]

    def setting(self, key: str) -> str | None:
        """The value the overrides give `key` (the last one, as Hydra takes it); None where they give none."""
        return next((o.split("=", 1)[1] for o in reversed(self.overrides) if o.split("=", 1)[0] == key), None)

    def plus(self, *overrides: str, **changes: object) -> Case:
        """A copy with more overrides after its own (a later one wins) and any other field changed."""
        return dataclasses.replace(self, overrides=[*self.overrides, *overrides], **changes)


@functools.lru_cache(maxsize=1024)
def _composed(overrides: tuple[str, ...], compose_kw: tuple[tuple[str, str], ...] = ()) -> RunConfig:
    """Each run composed once per process (Hydra's composition is most of a check): a tune search checks the same
    runs again in later stages, on resume and for its finalists."""
    from vlmtrain.config.compose import compose

    return compose(list(overrides), **dict(compose_kw))


def placed_resolved(overrides: list[str] | Case, node_gpus: int = 0, **compose_kw: str) -> tuple[RunConfig, Resolved]:
    """The run `python train.py <overrides>` (a Case: its command line) trains, composed in this process, placed on
    its world with its `auto` options settled there, and resolved (check.defaults.placed): the one Resolved every lab
    path that builds, estimates or launches a run in process hands down. `node_gpus`: this node's GPUs (0: the world
    the run declares in `gpus_per_node`)."""
    from vlmtrain.check import defaults

    if isinstance(overrides, Case):
        overrides = overrides.command_line()
    # placing settles a run in place: each caller gets its own copy, the cached one stays as composed
    run = copy.deepcopy(_composed(tuple(overrides), tuple(sorted(compose_kw.items()))))
    return run, defaults.placed(run, node_gpus)[1]
