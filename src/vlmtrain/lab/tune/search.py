"""The staged search of `vlmtrain tune`: each stage varies its knobs on the survivors of the last one, pruned by
preflight first; trials run through vlmtrain.lab.tune.trials, losers stop early, a ladder knob stops climbing at the
first value that is slower or fails; then the finalists run again (repeats) and rank by their median useful
tokens/s/GPU, and the winner meets a hand-found configuration in A/B pairs. Every finished trial is kept in
`<tune dir>/state.json`, so a re-run with the same command resumes without running them again. The GPU-minute
budget counts the trials of every invocation: the stages end where the next trial would leave too little for the
finalists' repeats, so a budget always ends with a repeated winner (the comparison is outside it); before anything
runs, a budget that cannot hold the first stage and the finalists ends the search with the least one that would.

Noise: a decision between configurations whose figures are closer than the run-to-run spread (`spread`) is a close
call, made on the median of `finalists.repeats` runs of each, not on one screening run. Every invocation ends with
`state["end"]`: why it stopped and what the same command does next.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmtrain.lab.spec import Spec, Stage
from vlmtrain.lab.tune import space, trials

STATE = "state.json"
FINAL, COMPARE = "finalists", "compare"
"""The trials after the stages: the finalists' repeats, and the A/B pairs against a hand-found configuration."""
TRIAL_FLOOR_S = 60.0
"""A trial's wall seconds before any has run: the least start-up of the measured runs (60-90 s a case on H200
nodes, docs/benchmarks.md), the steps not counted, so a budget named from it is a floor."""
SPREAD_PRIOR = 0.04
"""The run-to-run spread before any configuration ran twice: whole runs of one case on one machine differ by a few
% (A/B pairs 0.957-1.040, docs/measurements.md)."""
WALL_MARGIN_S = 60.0
"""What a --max-wall-min named to fit the next trial adds to it: the invocation's own composing and pruning."""
USEFUL = "useful_tokens_per_s_per_gpu"


def useful(trial: dict[str, Any]) -> float | None:
    """A recorded trial's useful tokens/s/GPU where it finished, else None (failed, or stopped early)."""
    return trial["outcome"]["metrics"].get(USEFUL) if trial["outcome"]["status"] == "ok" else None


def runs_by_name(trial_map: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    """Every finished run's useful tokens/s/GPU per trial name: a configuration's screening run and its repeats, a
    finalist's repeats (`final_<name>`), a side of the comparison."""
    out: dict[str, list[float]] = {}
    for t in trial_map.values():
        if (u := useful(t)) is not None:
            out.setdefault(t["name"], []).append(u)
    return out


def spread(trial_map: dict[str, dict[str, Any]]) -> tuple[float, int]:
    """(the run-to-run spread, how many configurations measured it; 0: SPREAD_PRIOR): the median over every name
    run at least twice of (max - min) / median of its runs; the median, so that one configuration's outlier does
    not send every later decision to repeats."""
    each = [(max(v) - min(v)) / statistics.median(v) for v in runs_by_name(trial_map).values() if len(v) > 1]
    return (statistics.median(each), len(each)) if each else (SPREAD_PRIOR, 0)


def trial_id(name: str, iterations: int, repeat: int) -> str:
    """A trial's key in state.json and its dir under trials/."""
    return f"{name}-it{iterations}-r{repeat}"


def gpu_min(gpu_s: float) -> str:
    """GPU-seconds as the GPU-minutes a user would pass, rounded up to a tenth."""
    return f"{math.ceil(gpu_s / 6 - 1e-9) / 10:g}"


class OutOfTime(Exception):
    """No room for the next trial. `kind`: budget (final: the search goes on to what comes after the budget), wall
    (this invocation's --max-wall-min: resume later), wall_short (the next trial is longer than --max-wall-min
    itself), too_small (before anything ran: the budget cannot hold the first stage and the finalists), plan
    (--plan runs nothing). `least`: the budget's GPU-seconds or wall seconds that would have held it."""

    def __init__(self, kind: str, why: str, stage: str, trial: str = "", least: float | None = None):
        super().__init__(why)
        self.kind, self.stage, self.trial, self.least = kind, stage, trial, least

    @property
    def final(self) -> bool:
        return self.kind == "budget"


@dataclass
class Entry:
    """A configuration a decision weighs: its trial name, overrides, the iterations it runs, its knob values."""

    name: str
    overrides: list[str]
    iterations: int
    values: dict[str, Any]


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

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state["spread"] = dict(zip(("value", "configs"), spread(self.state["trials"]), strict=True))
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.dir / STATE)

    # --- trials --------------------------------------------------------------------------------------------

    def spent_gpu_s(self, compare: bool = True) -> float:
        """GPU-seconds of every trial so far (without the comparison against a hand-found configuration: not
        part of the search's budget)."""
        return sum(t["outcome"]["wall_s"] * t["outcome"]["gpus"] for t in self.state["trials"].values()
                   if compare or t["stage"] != COMPARE)

    def best(self) -> float | None:
        return max((u for t in self.state["trials"].values() if (u := useful(t)) is not None), default=None)

    def figure(self, name: str, key: str = USEFUL) -> float | None:
        """The median of `key` over the finished runs of trial `name` (one screening run, or it and its repeats)."""
        done = [t["outcome"]["metrics"].get(key) for t in self.state["trials"].values()
                if t["name"] == name and useful(t) is not None]
        done = [x for x in done if x is not None]
        return statistics.median(done) if done else None

    def estimate_s(self) -> tuple[float, float]:
        """(the next trial's wall seconds: the longest so far; a finalist repeat's: the median), both TRIAL_FLOOR_S
        before any trial has run."""
        walls = [t["outcome"]["wall_s"] for t in self.state["trials"].values()]
        return (max(walls), statistics.median(walls)) if walls else (TRIAL_FLOOR_S, TRIAL_FLOOR_S)

    def _room(self, stage: str, name: str) -> None:
        """Raise OutOfTime when the next trial would not fit: in the budget, where a stage's trial also leaves room
        for every finalist repeat (repeats already run count as spent, since a new stage trial can change the
        finalists: a resumed search whose finalists ran does not reopen the stages the budget ended), or in this
        invocation's wall time."""
        need, typical = self.estimate_s()
        if self.plan:
            raise OutOfTime("plan", "--plan: candidates pruned, nothing run", stage, name)
        spent = self.spent_gpu_s(compare=False)
        reserve = 0.0 if stage in (FINAL, COMPARE) else self._finalist_trials() * typical * self.gpus
        if stage != COMPARE and self.budget_gpu_s is not None and spent + need * self.gpus + reserve > \
                self.budget_gpu_s:
            held = f" and ~{reserve / 60:.1f} are held for the finalists' repeats" if reserve else ""
            raise OutOfTime("budget", f"{spent / 60:.1f} of {self.budget_gpu_s / 60:g} GPU-min spent, the next "
                            f"trial ({name}) needs ~{need * self.gpus / 60:.1f}{held}", stage, name,
                            spent + need * self.gpus + reserve)
        if self.max_wall_s is None:
            return
        if need > self.max_wall_s:
            raise OutOfTime("wall_short", f"the next trial ({name}) takes ~{need / 60:.1f} min (the longest so far), "
                            f"longer than --max-wall-min {self.max_wall_s / 60:g} itself", stage, name,
                            need + WALL_MARGIN_S)
        gone = time.monotonic() - self.started
        if gone + need > self.max_wall_s:
            raise OutOfTime("wall", f"{gone / 60:.1f} of --max-wall-min {self.max_wall_s / 60:g} gone, the next "
                            f"trial ({name}) takes ~{need / 60:.1f} min", stage, name, need)

    def _finalist_trials(self) -> int:
        return int(self._fin().get("count", 2)) * self._repeats()

    def _fin(self) -> dict[str, Any]:
        return self.spec.get("finalists") or {}

    def _repeats(self) -> int:
        """Runs of each finalist, and of each configuration in a close call."""
        return int(self._fin().get("repeats", 3))

    def trial(self, stage: str, name: str, overrides: list[str], iterations: int, repeat: int = 0,
              early: bool = True) -> trials.Outcome:
        """One trial's outcome: from the state when it finished in an earlier invocation, else run now."""
        tid = trial_id(name, iterations, repeat)
        if tid in self.state["trials"]:
            return trials.Outcome(**self.state["trials"][tid]["outcome"])
        self._room(stage, name)
        rule = trials.EarlyStop(**(self.spec.get("early_stop") or {})) if early else None
        every = [*self.spec.base, *overrides, f"train.iterations={iterations}", f"wandb.group={self.group}",
                 *self.extra]
        print(f"[tune] {stage}: {name} ({iterations} iterations, repeat {repeat})", flush=True)
        self.ran_now += 1
        out = trials.run(self.launch, self.dir / "trials" / tid, every, self.gpus, self.best(), rule, self.poll_s)
        print(f"[tune]   {out.status}: {out.useful or 0:.0f} useful tokens/s/GPU {out.reason}", flush=True)
        self.state["trials"][tid] = {"stage": stage, "name": name, "overrides": overrides, "iterations": iterations,
                                     "repeat": repeat, "outcome": out.to_json()}
        self.save()
        return out

    # --- close calls ---------------------------------------------------------------------------------------

    def settle(self, stage: str, entries: list[Entry]) -> list[Entry]:
        """`entries` (each with a finished run) by their figure, best first. Where others are within the run-to-run
        spread of the best, each of those close ones first runs up to `repeats` times, and they rank by their
        medians: a close call, kept in state["close"] (cut: the budget or wall ended its repeats; still_close:
        the medians too are within the spread)."""
        order = sorted(entries, key=lambda e: -(self.figure(e.name) or 0))
        if len(order) < 2:
            return order
        s, measured = spread(self.state["trials"])
        lead = self.figure(order[0].name) or 0
        close = [e for e in order if (self.figure(e.name) or 0) >= lead * (1 - s)]
        if len(close) < 2:
            return order
        call = self._call(stage, [e.name for e in close], s, measured)
        try:
            for r in range(1, self._repeats()):
                for e in close:
                    self.trial(stage, e.name, e.overrides, e.iterations, r, early=False)
        except OutOfTime as stop:
            call["cut"] = str(stop)
            raise
        finally:
            order.sort(key=lambda e: -(self.figure(e.name) or 0))
            self._judge(call, [e.name for e in order if e.name in call["names"]])
        return order

    def _call(self, stage: str, names: list[str], s: float, measured: int) -> dict[str, Any]:
        """The close call between `names` at `stage`: the one an earlier invocation made (its repeats resume, the
        spread it was called at kept), else a new one."""
        for call in self.state["close"]:
            if call["stage"] == stage and set(call["names"]) == set(names):
                call.pop("cut", None)
                return call
        call = {"stage": stage, "spread": s, "measured_from": measured, "names": names}
        self.state["close"].append(call)
        return call

    def _judge(self, call: dict[str, Any], names: list[str]) -> None:
        """The call's runs and medians, best first, and whether the two best medians are still within the spread
        as measured after its repeats."""
        runs = runs_by_name(self.state["trials"])
        call["names"], call["runs"] = names, [runs.get(n, []) for n in names]
        call["medians"] = [self.figure(n) for n in names]
        call["decided"], call["spread_after"] = names[0], spread(self.state["trials"])[0]
        call["still_close"] = (call["medians"][1] or 0) >= (call["medians"][0] or 0) * (1 - call["spread_after"])

    # --- stages --------------------------------------------------------------------------------------------

    def run_stage(self, stage: Stage, parents: list[dict[str, Any]], incumbent: Entry | None
                  ) -> tuple[list[dict[str, Any]], Entry | None]:
        """Run one stage; (its survivors' knob values, the new incumbent). A budget that ends it midway still
        leaves its record (what ran, the best so far) before OutOfTime goes up."""
        record: dict[str, Any] = {"name": stage.name, "vary": stage.knobs, "ran": [], "pruned": []}
        self.state["stages"].append(record)
        mfu_below = stage.gate.get("mfu_below")
        mfu = self.figure(incumbent.name, "mfu") if incumbent else None
        if mfu_below is not None and mfu is not None and mfu >= mfu_below:
            record["skipped"] = f"the incumbent's MFU {mfu:.1%} is not below {mfu_below:.0%}"
            return parents, incumbent
        run, res = space.placed_resolved(self.spec.base, self.node_gpus)
        lay = res.layout
        varied = space.stage_values(stage, run, lay.world_size, lay.gpus_per_node)
        cands = space.prune(self.spec, space.candidates(self.spec, parents, varied), self.node_gpus)
        record["pruned"] = [{"name": c.name, "findings": c.findings} for c in cands if c.pruned]
        live = [c for c in cands if not c.pruned]
        record["candidates"] = len(cands)
        if not live:  # none: an `around` stage on unpacked survivors
            record["skipped"] = "preflight pruned every candidate" if cands else "no candidate for these survivors"
            return parents, incumbent
        if len(live) == 1 and stage is not self.spec.stages[-1]:
            record["skipped"] = f"one candidate ({live[0].name}): passed on, measured by the next stage"
            return [live[0].values], incumbent
        if not self.state["trials"]:
            self._first_stage(stage, live)
        done: list[tuple[Entry, trials.Outcome]] = []
        stop: OutOfTime | None = None
        order: list[Entry] = []
        try:
            if stage.ladder:
                self._ladder(stage, live, done)
            else:
                for c in live:
                    done.append((self._entry(c, stage), self.trial(stage.name, c.name, c.overrides, stage.iterations)))
            order = self.settle(stage.name, self._contenders(done, incumbent))
        except OutOfTime as e:
            if not e.final:
                raise
            stop, order = e, sorted(self._contenders(done, incumbent), key=lambda x: -(self.figure(x.name) or 0))
        record["ran"] = [e.name for e, _ in done]
        if not {e.name for e, o in done if o.status == "ok"}:
            record["skipped"] = "no trial of this stage finished"
            if stop:
                raise stop
            return parents, incumbent
        best = order[0]
        stage_best = next(e for e in order if e.name in {d.name for d, _ in done})
        record["best"], record["best_useful"] = stage_best.name, self.figure(stage_best.name)
        record["before_useful"] = self.figure(incumbent.name) if incumbent else None
        if any(c["stage"] == stage.name for c in self.state["close"]):
            record["close"] = True
        survivors = [e.values for e in order[: stage.keep]]
        record["survivors"] = [self.spec.case(v).name for v in survivors]
        if stop:
            raise stop
        return survivors, best

    def _entry(self, c: space.Candidate, stage: Stage) -> Entry:
        return Entry(c.name, c.overrides, stage.iterations, c.values)

    def _contenders(self, done: list[tuple[Entry, trials.Outcome]], incumbent: Entry | None) -> list[Entry]:
        """The stage's finished trials, once each, and the incumbent where the stage did not run it again: the
        stage found nothing faster where the incumbent stays first."""
        out = {e.name: e for e, o in done if o.status == "ok"}
        if incumbent is not None and out:
            out.setdefault(incumbent.name, incumbent)
        return list(out.values())

    def _first_stage(self, stage: Stage, live: list[space.Candidate]) -> None:
        """Before anything ran: the least budget that holds this stage's trials (a ladder's first two rungs per
        ladder, every candidate otherwise) and the finalists' repeats, each trial at TRIAL_FLOOR_S x its GPUs; a
        smaller --budget-gpu-min ends the search here, nothing spent."""
        n = sum(min(2, len(g)) for g in self._ladder_groups(stage, live)) if stage.ladder else len(live)
        f, each = self._finalist_trials(), TRIAL_FLOOR_S * self.gpus
        least = (n + f) * each
        self.state["least_budget"] = {"stage": stage.name, "trials": n, "candidates": len(live),
                                      "finalist_trials": f, "trial_gpu_s": each, "gpu_s": least}
        if self.budget_gpu_s is not None and self.budget_gpu_s < least:
            raise OutOfTime("too_small", f"--budget-gpu-min {self.budget_gpu_s / 60:g} cannot hold the first stage "
                            f"and the finalists: the {stage.name} stage runs at least {n} of its {len(live)} "
                            f"candidates{' (each ladder its first two rungs)' * bool(stage.ladder)}, the finalists "
                            f"{f} repeats, and before any trial has run one is taken to cost "
                            f"~{each / 60:.1f} GPU-min ({TRIAL_FLOOR_S:.0f} s of start-up x {self.gpus} GPU(s), the "
                            "steps not counted)", stage.name, least=least)

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
                e = self._entry(c, stage)
                out = self.trial(stage.name, c.name, c.overrides, stage.iterations)
                done.append((e, out))
                if out.status != "ok":
                    break
                if top is not None and (self.figure(e.name) or 0) < (self.figure(top.name) or 0) \
                        and self.settle(stage.name, [top, e])[0] is top:
                    break
                top = e  # faster, or slower by less than the spread and faster on the medians

    # --- finalists and the result ------------------------------------------------------------------------

    def finalists(self) -> list[dict[str, Any]]:
        """The best `count` configurations of the stages by their figure (the median where a close call repeated
        them), each run `repeats` times; ranked by their median."""
        by_name: dict[str, dict[str, Any]] = {}
        for t in self.state["trials"].values():
            if t["stage"] not in (FINAL, COMPARE) and useful(t) is not None:
                by_name.setdefault(t["name"], {"name": t["name"], "overrides": t["overrides"],
                                               "screen": self.figure(t["name"])})
        top = sorted(by_name.values(), key=lambda f: -f["screen"])[: int(self._fin().get("count", 2))]
        self.state["finalists"] = top
        for f in top:
            f.update(repeats=[], median=None)
        its = int(self._fin().get("iterations", 10))
        every = [(r, f) for r in range(self._repeats()) for f in top]
        # the repeats an earlier invocation ran count first, so a budget that ends the rest leaves them counted
        done = [(r, f) for r, f in every if trial_id(f"final_{f['name']}", its, r) in self.state["trials"]]
        for r, f in done + [rf for rf in every if rf not in done]:
            out = self.trial(FINAL, f"final_{f['name']}", f["overrides"], its, r, False)
            if out.status == "ok" and out.useful is not None:
                f["repeats"].append(out.useful)
                f["median"] = statistics.median(f["repeats"])
        return self.ranked()

    def ranked(self) -> list[dict[str, Any]]:
        """The finalists by the median of their repeats, one the budget left none by its stage figure; where the
        two best both have repeats and their medians are within the spread, a close call."""
        ranked = sorted(self.state.get("finalists") or [],
                        key=lambda f: -(f["median"] if f.get("median") is not None else f["screen"]))
        if len(ranked) > 1 and None not in (ranked[0]["median"], ranked[1]["median"]):
            s, measured = spread(self.state["trials"])
            if ranked[1]["median"] >= ranked[0]["median"] * (1 - s):
                names = [f"final_{f['name']}" for f in ranked if f["median"] is not None]
                self._judge(self._call(FINAL, names, s, measured), names)
        return ranked

    def compare(self, winner: dict[str, Any]) -> dict[str, Any] | None:
        """Winner vs the hand-found configuration in A/B pairs on this machine, the order alternating per pair."""
        if self.versus is None:
            return None
        cmp = self.spec.get("compare") or {}
        its, sides = int(cmp.get("iterations", 10)), {"tune": [], "hand": []}
        for r in range(int(cmp.get("repeats", 3))):
            order = [("tune", winner["name"], winner["overrides"]), ("hand", "hand", self.versus)]
            for side, name, overrides in order[:: -1 if r % 2 else 1]:
                out = self.trial(COMPARE, f"{side}_{name}", overrides, its, r, False)
                if out.status == "ok" and out.useful is not None:
                    sides[side].append(out.useful)
        if not (sides["tune"] and sides["hand"]):
            return None
        tune, hand = statistics.median(sides["tune"]), statistics.median(sides["hand"])
        return {"tune_useful_tokens_per_s_per_gpu": tune, "hand_useful_tokens_per_s_per_gpu": hand,
                "tune_vs_hand": tune / hand, "tune_repeats": sides["tune"], "hand_repeats": sides["hand"]}

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
                self._budget(e)
            try:
                ranked = self.finalists()
            except OutOfTime as e:
                if not e.final:
                    raise
                self._budget(e)
                ranked = self.ranked()
            self.state["winner"] = ranked[0] if ranked else None
            self.state["search_gpu_min"] = self.spent_gpu_s(compare=False) / 60
            if ranked:
                self.state["versus"] = self.compare(ranked[0])
        except OutOfTime as e:  # the wall-clock limit, --plan, or a budget too small to start: nothing more now
            stop = e
        for call in self.state["close"]:  # each with the runs it has now, an earlier invocation's too
            self._judge(call, sorted(call["names"], key=lambda n: -(self.figure(n) or 0)))
        self.state["gpu_min"] = self.spent_gpu_s() / 60
        self.state["end"] = self.end(stop)
        self.save()
        return self.state

    def _budget(self, e: OutOfTime) -> None:
        """Where the budget ended the stages, then the finalists: state["budget"], in that order."""
        ran = {"ran": len(self.state["stages"][-1]["ran"])} if e.stage != FINAL and self.state["stages"] else {}
        self.state["budget"].append({"stage": e.stage, "why": f"budget: {e}", "least_gpu_s": e.least, **ran})

    @staticmethod
    def part(stage: str) -> str:
        """A stage, the finalists or the comparison, in words."""
        return {FINAL: "the finalists' repeats", COMPARE: "the comparison with --versus"}.get(stage,
                                                                                               f"the {stage} stage")

    def end(self, stop: OutOfTime | None) -> dict[str, Any]:
        """Why this invocation stopped (`reason`: done, wall, wall_short, too_small, plan) and what the same command
        does next, in words for the terminal and the report."""
        if stop is None:
            ended = self.state["budget"]
            why = "done: every stage ran, then the finalists' repeats" if self.state.get("winner") else \
                "done: no trial finished (the trials' reasons are in the report)"
            nxt = "nothing left to do: the same command runs no trial and exits 0"
            if ended:
                parts = [(self.part(b["stage"]), b) for b in ended]
                why = "done within the budget, which ended " + " and ".join(p for p, _ in parts)
                nxt += "; --budget-gpu-min " + ", ".join(f"{gpu_min(b['least_gpu_s'])} or more resumes {p}"
                                                         for p, b in reversed(parts))
            if not self.ran_now and self.state["trials"]:
                why = f"nothing left to do (no trial ran now): {why}"
            return {"reason": "done", "why": why, "next": nxt, "ran_now": self.ran_now}
        where = self.part(stop.stage)
        if stop.kind == "wall":
            why, nxt = f"paused: {stop}", f"the same command resumes at {where} ({stop.trial})"
        elif stop.kind == "wall_short":
            why = f"stopped: {stop}"
            nxt = (f"the same command would run nothing: give --max-wall-min {math.ceil(stop.least / 30) / 2:g} or "
                   f"more (or leave it out) to run {where}")
        elif stop.kind == "too_small":
            why = f"nothing ran: {stop}"
            nxt = f"the same command runs nothing again: give --budget-gpu-min {gpu_min(stop.least or 0)} or more"
        else:
            least = self.state.get("least_budget")
            why = "--plan: the first stages' candidates are pruned, nothing ran"
            nxt = f"without --plan the search starts at {where}" + (
                f"; the budget must hold at least ~{gpu_min(least['gpu_s'])} GPU-min for its first stage and the "
                "finalists" if least else "")
        return {"reason": stop.kind, "why": why, "next": nxt, "ran_now": self.ran_now}
