"""The staged search of `vlmtrain tune`: each stage varies its knobs on the survivors of the last one, pruned by
preflight first; trials run through vlmtrain.lab.tune.trials, losers stop early, a ladder knob stops climbing at the
first value that is slower or fails; then the finalists run again (repeats) and rank by their median useful
tokens/s/GPU, and the winner meets a hand-found configuration in A/B pairs. Every finished trial is kept in
`<tune dir>/state.json`, so a re-run with the same command resumes without running them again. The GPU-minute
budget counts the trials of every invocation: the stages end where the next trial would leave too little for the
finalists' repeats, so a budget always ends with a repeated winner (the comparison is outside it).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmtrain.lab.spec import Spec, Stage
from vlmtrain.lab.tune import space, trials

STATE = "state.json"


class OutOfTime(Exception):
    """The budget (final: the search goes on to what comes after the budget) or this invocation's wall-clock limit
    (resume later) leaves no room for the next trial."""

    def __init__(self, why: str, final: bool):
        super().__init__(why)
        self.final = final


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
    state: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

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
        self.state.pop("stopped", None)

    @property
    def group(self) -> str:
        return f"tune-{self.name}"

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.dir / STATE)

    # --- trials --------------------------------------------------------------------------------------------

    def spent_gpu_s(self, compare: bool = True) -> float:
        """GPU-seconds of every trial so far (without the comparison against a hand-found configuration: not
        part of the search's budget)."""
        return sum(t["outcome"]["wall_s"] * t["outcome"]["gpus"] for t in self.state["trials"].values()
                   if compare or t["stage"] != "compare")

    def best(self) -> float | None:
        done = [t["outcome"]["metrics"].get("useful_tokens_per_s_per_gpu") for t in self.state["trials"].values()
                if t["outcome"]["status"] == "ok"]
        return max((u for u in done if u is not None), default=None)

    def _room(self, stage: str) -> None:
        """Raise OutOfTime when the next trial (as long as the longest so far) would not fit: in the budget, where a
        stage's trial also leaves room for every finalist repeat (each as long as the median trial; repeats already
        run count as spent, since a new stage trial can change the finalists: a resumed search whose finalists ran
        does not reopen the stages the budget ended), or in this invocation's wall time."""
        walls = [t["outcome"]["wall_s"] for t in self.state["trials"].values()]
        need, spent = max(walls, default=0.0), self.spent_gpu_s(compare=False)
        typical = statistics.median(walls) if walls else 0.0
        reserve = 0.0 if stage in ("finalists", "compare") else self._finalist_trials() * typical * self.gpus
        if stage != "compare" and self.budget_gpu_s is not None and spent + need * self.gpus + reserve > \
                self.budget_gpu_s:
            held = f" and ~{reserve / 60:.1f} held for the finalists" if reserve else ""
            raise OutOfTime(f"budget: {spent / 60:.1f} of {self.budget_gpu_s / 60:.1f} GPU-min spent, the next "
                            f"trial needs ~{need * self.gpus / 60:.1f}{held}", final=True)
        if self.max_wall_s is not None and time.monotonic() - self.started + need > self.max_wall_s:
            raise OutOfTime("this invocation's --max-wall-min is reached: run the same command again to resume",
                            final=False)

    def _finalist_trials(self) -> int:
        fin = self.spec.get("finalists") or {}
        return int(fin.get("count", 2)) * int(fin.get("repeats", 3))

    def trial(self, stage: str, name: str, overrides: list[str], iterations: int, repeat: int = 0,
              early: bool = True) -> trials.Outcome:
        """One trial's outcome: from the state when it finished in an earlier invocation, else run now."""
        tid = f"{name}-it{iterations}-r{repeat}"
        if tid in self.state["trials"]:
            return trials.Outcome(**self.state["trials"][tid]["outcome"])
        self._room(stage)
        rule = trials.EarlyStop(**(self.spec.get("early_stop") or {})) if early else None
        every = [*self.spec.base, *overrides, f"train.iterations={iterations}", f"wandb.group={self.group}",
                 *self.extra]
        print(f"[tune] {stage}: {name} ({iterations} iterations, repeat {repeat})", flush=True)
        out = trials.run(self.launch, self.dir / "trials" / tid, every, self.gpus, self.best(), rule, self.poll_s)
        print(f"[tune]   {out.status}: {out.useful or 0:.0f} useful tokens/s/GPU {out.reason}", flush=True)
        self.state["trials"][tid] = {"stage": stage, "name": name, "overrides": overrides, "iterations": iterations,
                                     "repeat": repeat, "outcome": out.to_json()}
        self.save()
        return out

    # --- stages --------------------------------------------------------------------------------------------

    def run_stage(self, stage: Stage, parents: list[dict[str, Any]], incumbent: dict[str, Any] | None
                  ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Run one stage; (its survivors' knob values, the new incumbent: {name, values, useful, mfu})."""
        record: dict[str, Any] = {"name": stage.name, "vary": stage.knobs, "ran": [], "pruned": []}
        self.state["stages"].append(record)
        mfu_below = stage.gate.get("mfu_below")
        if mfu_below is not None and incumbent is not None and (incumbent.get("mfu") or 0) >= mfu_below:
            record["skipped"] = f"the incumbent's MFU {incumbent['mfu']:.1%} is not below {mfu_below:.0%}"
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
        done = self._ladder(stage, live) if stage.ladder else [(c, self.trial(stage.name, c.name, c.overrides,
                                                                               stage.iterations)) for c in live]
        record["ran"] = [c.name for c, _ in done]
        ok = sorted(((c, o) for c, o in done if o.status == "ok"), key=lambda co: -(co[1].useful or 0))
        if not ok:
            record["skipped"] = "no trial of this stage finished"
            return parents, incumbent
        best_c, best_o = ok[0]
        record["best"], record["best_useful"] = best_c.name, best_o.useful
        record["before_useful"] = incumbent["useful"] if incumbent else None
        new = {"name": best_c.name, "values": best_c.values, "useful": best_o.useful,
               "mfu": best_o.metrics.get("mfu")}
        survivors = [c.values for c, _ in ok[: stage.keep]]
        if incumbent is not None and incumbent["useful"] >= (best_o.useful or 0):
            # the stage found nothing faster: what the earlier stages found goes on, first
            new, survivors = incumbent, [incumbent["values"], *survivors[: stage.keep - 1]]
        record["survivors"] = [self.spec.case(v).name for v in survivors]
        return survivors, new

    def _ladder(self, stage: Stage, live: list[space.Candidate]) -> list[tuple[space.Candidate, trials.Outcome]]:
        """Per grid and combination of the other knobs, the ladder knobs' values in order until one is slower or
        fails (packed: the capacities; unpacked: MBS)."""
        groups: dict[str, list[space.Candidate]] = {}
        for c in live:
            others = {k: v for k, v in c.values.items() if k not in stage.ladder}
            groups.setdefault(json.dumps([c.grid, others], default=str), []).append(c)
        done = []
        for members in groups.values():
            top = None
            for c in members:
                out = self.trial(stage.name, c.name, c.overrides, stage.iterations)
                done.append((c, out))
                if out.status != "ok" or (top is not None and (out.useful or 0) < top):
                    break
                top = out.useful
        return done

    # --- finalists and the result ------------------------------------------------------------------------

    def finalists(self) -> list[dict[str, Any]]:
        """The best `count` configurations of the stages, each run `repeats` times; ranked by their median."""
        fin = self.spec.get("finalists") or {}
        by_name: dict[str, dict[str, Any]] = {}
        for t in self.state["trials"].values():
            u = t["outcome"]["metrics"].get("useful_tokens_per_s_per_gpu")
            if (t["stage"] not in ("finalists", "compare") and t["outcome"]["status"] == "ok" and u is not None
                    and u > by_name.get(t["name"], {}).get("screen", 0)):
                by_name[t["name"]] = {"name": t["name"], "overrides": t["overrides"], "screen": u}
        top = sorted(by_name.values(), key=lambda f: -f["screen"])[: int(fin.get("count", 2))]
        self.state["finalists"] = top
        for f in top:
            f.update(repeats=[], median=None)
        its = int(fin.get("iterations", 10))
        for r in range(int(fin.get("repeats", 3))):
            for f in top:
                out = self.trial("finalists", f"final_{f['name']}", f["overrides"], its, r, False)
                if out.status == "ok" and out.useful is not None:
                    f["repeats"].append(out.useful)
                    f["median"] = statistics.median(f["repeats"])
        return self.ranked()

    def ranked(self) -> list[dict[str, Any]]:
        """The finalists by median over their repeats; none repeated (the budget ended first): the best screening
        trial alone."""
        ranked = sorted((f for f in self.state.get("finalists") or [] if f.get("median") is not None),
                        key=lambda f: -f["median"])
        if ranked:
            return ranked
        ok = [t for t in self.state["trials"].values() if t["outcome"]["status"] == "ok"
              and t["stage"] not in ("finalists", "compare")]
        ok.sort(key=lambda t: -t["outcome"]["metrics"].get("useful_tokens_per_s_per_gpu", 0))
        return [{"name": t["name"], "overrides": t["overrides"], "median": None,
                 "screen": t["outcome"]["metrics"].get("useful_tokens_per_s_per_gpu")} for t in ok[:1]]

    def compare(self, winner: dict[str, Any]) -> dict[str, Any] | None:
        """Winner vs the hand-found configuration in A/B pairs on this machine, the order alternating per pair."""
        if self.versus is None:
            return None
        cmp = self.spec.get("compare") or {}
        its, sides = int(cmp.get("iterations", 10)), {"tune": [], "hand": []}
        for r in range(int(cmp.get("repeats", 3))):
            order = [("tune", winner["name"], winner["overrides"]), ("hand", "hand", self.versus)]
            for side, name, overrides in order[:: -1 if r % 2 else 1]:
                out = self.trial("compare", f"{side}_{name}", overrides, its, r, False)
                if out.status == "ok" and out.useful is not None:
                    sides[side].append(out.useful)
        if not (sides["tune"] and sides["hand"]):
            return None
        tune, hand = statistics.median(sides["tune"]), statistics.median(sides["hand"])
        return {"tune_useful_tokens_per_s_per_gpu": tune, "hand_useful_tokens_per_s_per_gpu": hand,
                "tune_vs_hand": tune / hand, "tune_repeats": sides["tune"], "hand_repeats": sides["hand"]}

    def run(self) -> dict[str, Any]:
        """The whole search; the state it leaves (`budget` says where the GPU-minute budget ended the stages or the
        finalists, `stopped` why this invocation ended before the comparison: run it again to resume)."""
        parents, incumbent = [self.spec.defaults], None
        self.state.pop("budget", None)
        try:
            try:
                for stage in self.spec.stages:
                    parents, incumbent = self.run_stage(stage, parents, incumbent)
                    self.save()
            except OutOfTime as e:
                if not e.final:
                    raise
                self.state["budget"] = {"stage": self.state["stages"][-1]["name"], "why": str(e)}
            try:
                ranked = self.finalists()
            except OutOfTime as e:
                if not e.final:
                    raise
                self.state["budget"] = {"stage": "finalists", "why": str(e)}
                ranked = self.ranked()
            self.state["winner"] = ranked[0] if ranked else None
            self.state["search_gpu_min"] = self.spent_gpu_s(compare=False) / 60
            if ranked:
                self.state["versus"] = self.compare(ranked[0])
        except OutOfTime as e:  # the wall-clock limit: resume later
            self.state["stopped"] = {"why": str(e)}
        self.state["gpu_min"] = self.spent_gpu_s() / 60
        self.save()
        return self.state
