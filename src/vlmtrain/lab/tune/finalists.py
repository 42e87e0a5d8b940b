"""After a search's stages (vlmtrain.lab.tune.search): its best configurations run again and rank by their medians
(the finalists), and the winner meets a hand-found configuration in A/B pairs on the same machine (`--versus`)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from vlmtrain.lab.tune import ledger
from vlmtrain.lab.tune.ledger import COMPARE, FINAL

if TYPE_CHECKING:
    from vlmtrain.lab.tune.search import Search


def run(s: Search) -> list[dict[str, Any]]:
    """The best `count` configurations of the stages by their figure (the median where a close call repeated them),
    each run `repeats` times; ranked by their median."""
    by_name: dict[str, dict[str, Any]] = {}
    for t in s.trials.values():
        if t["stage"] not in (FINAL, COMPARE) and ledger.useful(t) is not None:
            by_name.setdefault(t["name"], {"name": t["name"], "overrides": t["overrides"],
                                           "screen": s.figure(t["name"])})
    top = sorted(by_name.values(), key=lambda f: -f["screen"])[: int(s.finalist_spec().get("count", 2))]
    s.state["finalists"] = top
    for f in top:
        f.update(repeats=[], median=None)
    its = int(s.finalist_spec().get("iterations", 10))
    every = [(r, f) for r in range(s.repeats()) for f in top]
    # the repeats an earlier invocation ran count first, so a budget that ends the rest leaves them counted
    done = [(r, f) for r, f in every if ledger.trial_id(f"final_{f['name']}", its, r) in s.trials]
    for r, f in done + [rf for rf in every if rf not in done]:
        out = s.trial(FINAL, f"final_{f['name']}", f["overrides"], its, r, False)
        if out.status == "ok" and out.useful is not None:
            f["repeats"].append(out.useful)
            f["median"] = statistics.median(f["repeats"])
    return ranked(s)


def ranked(s: Search) -> list[dict[str, Any]]:
    """The finalists by the median of their repeats, one the budget left none by its stage figure; where the two
    best both have repeats and their medians are within the spread, a close call."""
    out = sorted(s.state.get("finalists") or [],
                 key=lambda f: -(f["median"] if f.get("median") is not None else f["screen"]))
    if len(out) > 1 and None not in (out[0]["median"], out[1]["median"]):
        spread, measured = ledger.spread(s.trials)
        if out[1]["median"] >= out[0]["median"] * (1 - spread):
            names = [f"final_{f['name']}" for f in out if f["median"] is not None]
            ledger.judge(s.trials, ledger.close_call(s.state, FINAL, names, spread, measured), names)
    return out


def compare(s: Search, winner: dict[str, Any]) -> dict[str, Any] | None:
    """Winner vs the hand-found configuration in A/B pairs on this machine, the order alternating per pair."""
    if s.versus is None:
        return None
    cmp = s.spec.get("compare") or {}
    its, sides = int(cmp.get("iterations", 10)), {"tune": [], "hand": []}
    for r in range(int(cmp.get("repeats", 3))):
        order = [("tune", winner["name"], winner["overrides"]), ("hand", "hand", s.versus)]
        for side, name, overrides in order[:: -1 if r % 2 else 1]:
            out = s.trial(COMPARE, f"{side}_{name}", overrides, its, r, False)
            if out.status == "ok" and out.useful is not None:
                sides[side].append(out.useful)
    if not (sides["tune"] and sides["hand"]):
        return None
    tune, hand = statistics.median(sides["tune"]), statistics.median(sides["hand"])
    return {"tune_useful_tokens_per_s_per_gpu": tune, "hand_useful_tokens_per_s_per_gpu": hand,
            "tune_vs_hand": tune / hand, "tune_repeats": sides["tune"], "hand_repeats": sides["hand"]}
