"""What a reviewer checks on a sweep, section by section of its W&B views: what to check, in one line, then
what this sweep's jobs and runs say (markdown), from the numbers `vlmtrain report` computes."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from vlmtrain.observe import keys
from vlmtrain.observe.timing import data_bound
from vlmtrain.report.job import STATUS, Job
from vlmtrain.report.labels import baseline, distinct_labels, split_kind
from vlmtrain.report.tables import failure_table, ranked_groups, ranked_table

if TYPE_CHECKING:
    from vlmtrain.report.wandb_sweep import Sweep


def _labels(jobs: list[Job]) -> dict[int, str]:
    """Each job's short label (what tells it apart from the sweep's other jobs), by id()."""
    return {id(j): label for j, label in zip(jobs, distinct_labels(jobs, baseline(jobs)), strict=True)}


def _ranked(sweep: Sweep) -> list[Job]:
    return [j for j in sweep.jobs if j.rank is not None]


def _span(values: list[float], fmt: str) -> str:
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low} to {high}"


def ranking(sweep: Sweep) -> str:
    """Rank by useful work, never by step time; mock and frozen runs apart."""
    lines = ["**Check:** rank by useful (non-padding) tokens/s/GPU after warm-up, not by step time: runs that pad "
             "or batch differently do different useful work. Mock-data and frozen-vision runs rank apart (mock "
             "images look about 2x faster)."]
    groups = ranked_groups(sweep.jobs)
    if not groups:
        return "\n\n".join([*lines, "No job finished, so nothing is ranked (see Failures)."])
    label, base, kind = _labels(sweep.jobs), baseline(sweep.jobs), split_kind(sweep.jobs)
    _, main = groups[0]
    best, worst = main[0], main[-1]
    rate = keys.USEFUL_TOKENS_PER_S_PER_GPU
    verdict = (f"Best: **{label[id(best)]}** at {best.metrics[rate]:,.0f} tokens/s/GPU "
               f"(MFU {best.metrics.get(keys.MFU, 0.0):.3%})")
    if worst is not best:
        verdict += (f"; slowest: {label[id(worst)]} at {worst.metrics[rate]:,.0f} "
                    f"({best.metrics[rate] / worst.metrics[rate]:.2f}x apart)")
    apart = Counter(j.section for j in _ranked(sweep) if j.section != "main")
    if apart:
        verdict += ". Ranked apart: " + ", ".join(f"{n} {s}" for s, n in apart.items())
    lines.append(verdict + ".")
    for title, members in groups:
        lines += [f"**{title}**", "\n".join(ranked_table(members, base, kind))]
    return "\n\n".join(lines)


def towers(sweep: Sweep) -> str:
    """The vision encoder's share of the step, and data-bound runs."""
    lines = ["**Check:** time the vision encoder, projector and decoder separately before blaming the dispatcher: "
             "the ViT can dominate unexpectedly; a step that waits on the data loader wants more data.num_workers."]
    label = _labels(sweep.jobs)
    timed = [j for j in _ranked(sweep) if all(k in j.metrics for k in (keys.time_key("vision"), keys.STEP_S))]
    if not timed:
        return "\n\n".join([*lines, "These runs logged no per-component times."])

    def share(job: Job, *components: str) -> float:
        return sum(job.metrics.get(keys.time_key(c), 0.0) for c in components) / job.metrics[keys.STEP_S]

    vision = [share(j, "vision", "projector") for j in timed]
    decoder = [share(j, "decoder") for j in timed]
    verdict = (f"ViT + projector take {_span(vision, '.0%')} of the step, the decoder {_span(decoder, '.0%')} "
               f"(medians after warm-up).")
    heavy = [label[id(j)] for j, v, d in zip(timed, vision, decoder, strict=True) if v > d]
    if heavy:
        verdict += " The vision encoder outweighs the decoder in: " + ", ".join(heavy) + "."
    waiting = [f"{label[id(j)]} ({data_bound(j.metrics.get(keys.time_key('data')), j.metrics[keys.STEP_S]):.0%})"
               for j in timed if data_bound(j.metrics.get(keys.time_key("data")), j.metrics[keys.STEP_S])]
    verdict += (" Data-bound: " + ", ".join(waiting) + "." if waiting else " No run waits on its data loader.")
    return "\n\n".join([*lines, verdict])


def _summary(run: dict[str, Any], key: str) -> float | None:
    value = run["summary"].get(key)
    return float(value) if isinstance(value, int | float) else None


def memory(sweep: Sweep) -> str:
    """Headroom below the GPU's memory, and the estimate against the measured peak."""
    lines = ["**Check:** the measured peak (max allocated over ranks) must leave headroom below the GPU's memory, "
             "and the memory estimate preflight judged the run by should sit at or above it (an estimate below "
             "the peak lets a config that runs out of memory through)."]
    label = _labels(sweep.jobs)
    measured = [j for j in _ranked(sweep) if keys.PEAK_MEM_GIB in j.metrics]
    if measured:
        room = min((j for j in measured if j.headroom_gib is not None), key=lambda j: j.headroom_gib or 0.0,
                   default=None)
        verdict = f"Peaks {_span([j.metrics[keys.PEAK_MEM_GIB] for j in measured], '.1f')} GiB per GPU"
        if room is not None:
            verdict += (f"; least headroom {room.headroom_gib:.1f} GiB of {room.memory_gib:.0f} GiB "
                        f"({label[id(room)]})")
        lines.append(verdict + ".")
    pairs = [(peak, est) for r in sweep.runs if (peak := _summary(r, keys.PEAK_MEM_GIB)) is not None
             and (est := _summary(r, keys.MEMORY_ESTIMATE_GIB)) is not None]
    if pairs:
        over = [est - peak for peak, est in pairs]
        under = sum(d < 0 for d in over)
        lines.append(f"Estimate minus peak: {_span(over, '+.1f')} GiB over {len(pairs)} runs"
                     + (f"; **{under} under-estimated**." if under else " (never below the peak)."))
    else:
        lines.append(f"These runs carry no `{keys.MEMORY_ESTIMATE_GIB}` in their W&B summary.")
    return "\n\n".join(lines)


def _last(run: dict[str, Any], key: str) -> float | None:
    values = [row[key] for row in run["history"] if isinstance(row.get(key), int | float)]
    return float(values[-1]) if values else None


def training(sweep: Sweep) -> str:
    """The loss falls and stays finite; no skipped steps; the MoE balance."""
    lines = ["**Check:** runs compared on speed must also train: the loss falls and stays finite, no update is "
             "skipped (train.on_nonfinite=skip counts them), the grad norm has no spikes and the MoE load-balancing "
             "loss stays near its floor; the held-out loss (train.eval_interval) follows the training loss."]
    losses = [(j.metrics["first_loss"], j.metrics["last_loss"]) for j in sweep.jobs
              if "first_loss" in j.metrics and "last_loss" in j.metrics]
    if losses:
        fell = sum(last < first for first, last in losses)
        lines.append(f"lm loss fell in {fell} of {len(losses)} runs (first {_span([f for f, _ in losses], '.3f')}, "
                     f"last {_span([la for _, la in losses], '.3f')}).")
    skipped = [v for r in sweep.runs if (v := _last(r, keys.SKIPPED_STEPS)) is not None]
    if skipped:
        lines.append(f"Skipped steps: {int(sum(skipped))} over {len(skipped)} runs.")
    balance = [v for r in sweep.runs if (v := _last(r, keys.BRIDGE_LOAD_BALANCING_LOSS)) is not None]
    if balance:
        lines.append(f"MoE load-balancing loss at the last step: {_span(balance, '.3f')}.")
    validated = [j for j in sweep.jobs if j.validation]
    last = [j.validation[-1][1] for j in validated]
    lines.append(f"Held-out loss: {len(validated)} runs evaluated (last {_span(last, '.3f')})." if validated
                 else "No run evaluated held-out samples (train.eval_interval).")
    return "\n\n".join(lines)


def failures(sweep: Sweep) -> str:
    """Every job that is not ranked, with the reason the report classifies."""
    others = [j for j in sweep.jobs if j.rank is None]
    counts = Counter(STATUS[j.status] for j in sweep.jobs)
    head = (f"{len(sweep.jobs)} jobs: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()) + ".")
    if not others:
        return f"{head} Every job finished and is ranked."
    return "\n\n".join([head, "\n".join(failure_table(others, baseline(sweep.jobs)))])
