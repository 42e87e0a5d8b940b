"""The staged search of `vlmtrain tune`: each stage varies its knobs on the survivors of the last one, pruned by
preflight first; trials run through vlmtrain.lab.tune.trials, losers stop early, a ladder knob stops climbing at the
first value that is slower or fails; then the finalists run again and meet a hand-found configuration
(vlmtrain.lab.tune.finalists). Every finished trial is kept in `<tune dir>/state.json` (vlmtrain.lab.tune.ledger), so
a re-run with the same command resumes without running them again. The GPU-minute budget (vlmtrain.lab.tune.budget)
counts the trials of every invocation: the stages end where the next trial would leave too little for the
finalists' repeats, so a budget always ends with a repeated winner (the comparison is outside it); before anything
runs, a budget that cannot hold the first stage and the finalists ends the search with the least one that would.

Noise: a decision between configurations whose figures are closer than the run-to-run spread (`ledger.spread`) is a
close call, made on the median of `finalists.repeats` runs of each, not on one screening run. Every invocation ends
with `state["end"]`: why it stopped and what the same command does next.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit.case import Case, placed_resolved
from vlmtrain.lab.kit.spec import Spec, Stage
from vlmtrain.lab.tune import budget, finalists, ledger, space, trials
from vlmtrain.lab.tune.budget import OutOfTime
from vlmtrain.lab.tune.ledger import STATE

PREDICTED = ("step_s", "useful_tokens_per_s_per_gpu", "mfu")
"""What a stage records of each candidate's prediction (check.speed), fastest first."""


@dataclass
class Entry:
    """A configuration a decision weighs: its case (the trial's name and overrides), the knob values it was made from
    (the next stage varies them) and the iterations it runs."""

    case: Case
    values: dict[str, Any]
    iterations: int


@dataclass
class Search:
    spec: Spec
    dir: Path
    name: str
    launch: trials.Launch
    node_gpus: int
    gpus: int
    """GPUs each trial holds (the world), for the GPU-minute budget."""
    budget_gpu_s: float | None = None
    max_wall_s: float | None = None
    extra: list[str] = field(default_factory=list)
    """Overrides every trial gets that are not part of the configuration (the launcher's)."""
    versus: list[str] | None = None
    """A hand-found configuration's overrides, measured against the winner on the same machine (A/B pairs)."""
    poll_s: float = trials.POLL_S
    plan: bool = False
    """Prune the first stages' candidates and run nothing (--plan)."""
    state: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    ran_now: int = 0
    """Trials this invocation launched."""

    def __post_init__(self) -> None:
        path = self.dir / STATE
        self.state = json.loads(path.read_text()) if path.is_file() else {}
        if self.state and self.state.get("base") != self.spec.base:
            raise ValueError(f"{path} holds a search of other overrides ({' '.join(self.state['base'])}): "
                             "resume with the same command, or give another --dir")
        space.fill_defaults(self.spec, self.node_gpus)
        self.state.update(name=self.name, spec=self.spec.name, base=self.spec.base, gpus=self.gpus)
        self.state.setdefault("trials", {})
        self.state["stages"], self.state["finalists"] = [], []
        self.state.setdefault("close", [])  # an earlier invocation's close calls stay: their repeats are in trials
        for key in ("stopped", "end", "least_budget"):
            self.state.pop(key, None)

    @property
    def group(self) -> str:
        return f"tune-{self.name}"

    @property
    def trials(self) -> ledger.Trials:
        return self.state["trials"]

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state["spread"] = dict(zip(("value", "configs"), ledger.spread(self.trials), strict=True))
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.dir / STATE)

    def figure(self, name: str, key: str = ledger.USEFUL) -> float | None:
        return ledger.figure(self.trials, name, key)

    def ranked(self, entries: list[Entry]) -> list[Entry]:
        """Best figure first."""
        return sorted(entries, key=lambda e: -(self.figure(e.case.name) or 0))

    def finalist_spec(self) -> dict[str, Any]:
        """The spec's `finalists`: count, repeats, iterations."""
        return self.spec.get("finalists") or {}

    def repeats(self) -> int:
        """Runs of each finalist, and of each configuration in a close call."""
        return int(self.finalist_spec().get("repeats", 3))

    def finalist_trials(self) -> int:
        return int(self.finalist_spec().get("count", 2)) * self.repeats()

    def trial(self, stage: str, name: str, overrides: list[str], iterations: int, repeat: int = 0,
              early: bool = True) -> trials.Outcome:
        """One trial's outcome: from the state when it finished in an earlier invocation, else run now (OutOfTime
        where it would not fit: vlmtrain.lab.tune.budget.room)."""
        tid = ledger.trial_id(name, iterations, repeat)
        if tid in self.trials:
            return trials.Outcome(**self.trials[tid]["outcome"])
        budget.room(stage, name, self.trials, gpus=self.gpus, finalist_trials=self.finalist_trials(),
                    budget_gpu_s=self.budget_gpu_s, max_wall_s=self.max_wall_s, started=self.started, plan=self.plan)
        rule = trials.EarlyStop(**(self.spec.get("early_stop") or {})) if early else None
        case = Case(name, None, [*self.spec.base, *overrides, f"train.iterations={iterations}",
                                 f"wandb.group={self.group}", *self.extra], multirun=True)
        print(f"[tune] {stage}: {name} ({iterations} iterations, repeat {repeat})", flush=True)
        self.ran_now += 1
        out = trials.run(self.launch, self.dir / "trials" / tid, case, self.gpus, ledger.best(self.trials), rule,
                         self.poll_s)
        print(f"[tune]   {out.status}: {out.useful or 0:.0f} useful tokens/s/GPU {out.reason}", flush=True)
        self.trials[tid] = {"stage": stage, "name": name, "overrides": overrides, "iterations": iterations,
                            "repeat": repeat, "outcome": out.to_json()}
        self.save()
        return out

    def run_entry(self, stage: str, e: Entry, repeat: int = 0, early: bool = True) -> trials.Outcome:
        return self.trial(stage, e.case.name, self.spec.beyond_base(e.case), e.iterations, repeat, early)

    def settle(self, stage: str, entries: list[Entry]) -> list[Entry]:
        """`entries` (each with a finished run) by their figure, best first. Where others are within the run-to-run
        spread of the best, each of those close ones first runs up to `repeats` times, and they rank by their
        medians: a close call, kept in state["close"] (cut: the budget or wall ended its repeats; still_close:
        the medians too are within the spread)."""
        order = self.ranked(entries)
        if len(order) < 2:
            return order
        s, measured = ledger.spread(self.trials)
        lead = self.figure(order[0].case.name) or 0
        close = [e for e in order if (self.figure(e.case.name) or 0) >= lead * (1 - s)]
        if len(close) < 2:
            return order
        call = ledger.close_call(self.state, stage, [e.case.name for e in close], s, measured)
        try:
            for r in range(1, self.repeats()):
                for e in close:
                    self.run_entry(stage, e, r, early=False)
        except OutOfTime as stop:
            call["cut"] = str(stop)
            raise
        finally:
            order = self.ranked(order)
            ledger.judge(self.trials, call, [e.case.name for e in order if e.case.name in call["names"]])
        return order

    # --- stages --------------------------------------------------------------------------------------------

    def run_stage(self, stage: Stage, parents: list[dict[str, Any]], incumbent: Entry | None
                  ) -> tuple[list[dict[str, Any]], Entry | None]:
        """Run one stage; (its survivors' knob values, the new incumbent). A budget that ends it midway still
        leaves its record (what ran, the best so far) before OutOfTime goes up."""
        record: dict[str, Any] = {"name": stage.name, "vary": stage.knobs, "ran": [], "pruned": []}
        self.state["stages"].append(record)
        mfu_below = stage.gate.get("mfu_below")
        mfu = self.figure(incumbent.case.name, "mfu") if incumbent else None
        if mfu_below is not None and mfu is not None and mfu >= mfu_below:
            record["skipped"] = f"the incumbent's MFU {mfu:.1%} is not below {mfu_below:.0%}"
            return parents, incumbent
        run, res = placed_resolved(self.spec.base, self.node_gpus)
        lay = res.layout
        varied = space.stage_values(stage, run, lay.world_size, lay.gpus_per_node)
        cands = space.prune(self.spec, space.candidates(self.spec, parents, varied), self.node_gpus)
        record["pruned"] = [{"name": c.case.name, "findings": c.findings} for c in cands if c.pruned]
        record["predicted"] = [{"name": c.case.name, **{k: (c.predicted or {})[k] for k in PREDICTED}}
                               for c in space.by_prediction(cands)]
        live = [c for c in cands if not c.pruned]
        record["candidates"] = len(cands)
        if not live:  # none: an `around` stage on unpacked survivors
            record["skipped"] = "preflight pruned every candidate" if cands else "no candidate for these survivors"
            return parents, incumbent
        if len(live) == 1 and stage is not self.spec.stages[-1]:
            record["skipped"] = f"one candidate ({live[0].case.name}): passed on, measured by the next stage"
            return [live[0].values], incumbent
        if not self.trials:
            n = sum(min(2, len(g)) for g in self._ladder_groups(stage, live)) if stage.ladder else len(live)
            budget.first_stage(self.state, stage.name, n, len(live), self.finalist_trials(), self.gpus,
                               bool(stage.ladder), self.budget_gpu_s)
        done: list[tuple[Entry, trials.Outcome]] = []
        stop: OutOfTime | None = None
        order: list[Entry] = []
        try:
            if stage.ladder:
                self._ladder(stage, live, done)
            else:
                for c in live:
                    e = Entry(c.case, c.values, stage.iterations)
                    done.append((e, self.run_entry(stage.name, e)))
            order = self.settle(stage.name, self._contenders(done, incumbent))
        except OutOfTime as e:
            if not e.final:
                raise
            stop, order = e, self.ranked(self._contenders(done, incumbent))
        record["ran"] = [e.case.name for e, _ in done]
        if not {e.case.name for e, o in done if o.status == "ok"}:
            record["skipped"] = "no trial of this stage finished"
            if stop:
                raise stop
            return parents, incumbent
        stage_best = next(e for e in order if e.case.name in {d.case.name for d, _ in done})
        record["best"], record["best_useful"] = stage_best.case.name, self.figure(stage_best.case.name)
        record["before_useful"] = self.figure(incumbent.case.name) if incumbent else None
        if any(c["stage"] == stage.name for c in self.state["close"]):
            record["close"] = True
        survivors = [e.values for e in order[: stage.keep]]
        record["survivors"] = [self.spec.name_of(v) for v in survivors]
        if stop:
            raise stop
        return survivors, order[0]

    def _contenders(self, done: list[tuple[Entry, trials.Outcome]], incumbent: Entry | None) -> list[Entry]:
        """The stage's finished trials, once each, and the incumbent where the stage did not run it again: the
        stage found nothing faster where the incumbent stays first."""
        out = {e.case.name: e for e, o in done if o.status == "ok"}
        if incumbent is not None and out:
            out.setdefault(incumbent.case.name, incumbent)
        return list(out.values())

    def _ladder_groups(self, stage: Stage, live: list[space.Candidate]) -> list[list[space.Candidate]]:
        """The candidates per grid and combination of the knobs that do not climb, each group in ladder order."""
        groups: dict[str, list[space.Candidate]] = {}
        for c in live:
            others = {k: v for k, v in c.values.items() if k not in stage.ladder}
            groups.setdefault(json.dumps([c.grid, others], default=str), []).append(c)
        return list(groups.values())

    def _ladder(self, stage: Stage, live: list[space.Candidate], done: list[tuple[Entry, trials.Outcome]]) -> None:
        """Per ladder group, the values in order until one fails or is slower than the best rung so far (packed:
        the capacities; unpacked: MBS); a rung slower by less than the spread is a close call settled on repeats,
        and the ladder climbs on where its median wins."""
        for members in self._ladder_groups(stage, live):
            top: Entry | None = None
            for c in members:
                e = Entry(c.case, c.values, stage.iterations)
                out = self.run_entry(stage.name, e)
                done.append((e, out))
                if out.status != "ok":
                    break
                if top is not None and (self.figure(e.case.name) or 0) < (self.figure(top.case.name) or 0) \
                        and self.settle(stage.name, [top, e])[0] is top:
                    break
                top = e  # faster, or slower by less than the spread and faster on the medians

    def run(self) -> dict[str, Any]:
        """The whole search; the state it leaves (`budget` says where the GPU-minute budget ended the stages or the
        finalists; `end` why this invocation stopped and what the same command does next)."""
        parents, incumbent = [self.spec.defaults], None
        self.state["budget"] = []
        stop = None
        try:
            try:
                for stage in self.spec.stages:
                    parents, incumbent = self.run_stage(stage, parents, incumbent)
                    self.save()
            except OutOfTime as e:
                if not e.final:
                    raise
                self.state["budget"].append(budget.ended(e, self.state["stages"]))
            try:
                ranked = finalists.run(self)
            except OutOfTime as e:
                if not e.final:
                    raise
                self.state["budget"].append(budget.ended(e, self.state["stages"]))
                ranked = finalists.ranked(self)
            self.state["winner"] = ranked[0] if ranked else None
            self.state["search_gpu_min"] = ledger.spent_gpu_s(self.trials, compare=False) / 60
            if ranked:
                self.state["versus"] = finalists.compare(self, ranked[0])
        except OutOfTime as e:  # the wall-clock limit, --plan, or a budget too small to start: nothing more now
            stop = e
        for call in self.state["close"]:  # each with the runs it has now, an earlier invocation's too
            ledger.judge(self.trials, call, sorted(call["names"], key=lambda n: -(self.figure(n) or 0)))
        self.state["gpu_min"] = ledger.spent_gpu_s(self.trials) / 60
        self.state["end"] = budget.end(stop, self.state, self.ran_now)
        self.save()
        return self.state
