"""A sweep spec's report from its results file alone (`vlmtrain sweep <spec> --report`): every measured case, then
each of the spec's claims as a ratio of two measured rows (rows that are missing or failed are named, not guessed),
then the overhead and machine-run-spread rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlmtrain.lab import vs_bridge
from vlmtrain.lab.kit import schedule as reps
from vlmtrain.lab.kit import store
from vlmtrain.lab.kit.spec import Spec
from vlmtrain.lab.micro import ceiling

REPEATED_NOTE = "the latest of repeated runs: their median is below"


def latest_rows(results_path: Path) -> dict[str, dict[str, Any]]:
    """The results file's rows by case name (vlmtrain.lab.kit.store.latest)."""
    return {r["name"]: r for r in store.latest(store.read(results_path))}


def claims(spec: Spec) -> list[tuple[str, str, str]]:
    """(what, case A's name, case B's name) of every claim in the spec."""
    return [(what, spec.name_of(a), spec.name_of(b)) for what, a, b in spec.get("claims") or []]


def repeats(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The finished runs of `name` from the same sweep invocation and day as its latest row (a sweep run twice in
    one machine run), in order; re-summaries and superseded rows are not runs."""
    mine = [r for r in rows if r["name"] == name and "useful_tokens_per_s_per_gpu" in r["metrics"]
            and not {"resummarized", "superseded"} & r.keys()]
    if not mine:
        return []
    last = mine[-1]
    return [r for r in mine if (r["date"], r.get("runner")) == (last["date"], last.get("runner"))]


def _cases(latest: dict[str, dict[str, Any]], ok: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for title, frozen in (("Full training (vision trainable)", False),
                          ("Frozen vision (benchmark-only: compare with frozen rows only)", True)):
        lines += ["", f"## {title}", "",
                  "| case | step_s | useful tok/s/GPU | MFU | peak GiB | useful fraction | ViT / decoder s | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, m in sorted(ok.items(), key=lambda kv: -kv[1]["useful_tokens_per_s_per_gpu"]):
            if vs_bridge.trains_every_tower(latest[n]) == frozen:
                continue
            note = ("exit 1 after training (see row)" if latest[n].get("rc") else
                    "rates are medians of per-step rates (run files lost)" if "rates" in latest[n] else
                    REPEATED_NOTE if "run" in latest[n] else "")
            split = f"{m['time_vision_s']:.2f} / {m['time_decoder_s']:.2f}" if "time_vision_s" in m else "-"
            lines.append(f"| {n} | {m['step_s']:.2f} | {m['useful_tokens_per_s_per_gpu']:.0f} | {m['mfu']:.1%} | "
                         f"{m['peak_mem_gib']:.0f} | {m['nonpad_fraction']:.1%} | {split} | {note} |")
    return lines


def _sides(rows: list[dict[str, Any]], latest: dict[str, dict[str, Any]], ok: dict[str, dict[str, Any]], a: str,
           b: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]] | None:
    """A claim's two sides from one machine run: the medians of the latest machine run where both have runs
    (repeated cases), else the latest rows when neither names a machine run (one sweep's rows); None when they ran
    on different machine runs only (a ratio across machine runs carries the machine run's own spread)."""
    machine_runs = [r["machine_run"] for r in rows if r["name"] == a and "machine_run" in r]
    for machine_run in reversed(dict.fromkeys(machine_runs)):
        ra, rb = reps.runs(rows, a, machine_run), reps.runs(rows, b, machine_run)
        if ra and rb:
            a_m, b_m = (reps.summary_metrics(x) | {"first_loss": x[-1]["metrics"].get("first_loss")} for x in (ra, rb))
            return a_m, b_m, ra, rb
    if "machine_run" in latest[a] or "machine_run" in latest[b]:
        return None
    return ok[a], ok[b], repeats(rows, a), repeats(rows, b)


def _claims(spec: Spec, rows: list[dict[str, Any]], latest: dict[str, dict[str, Any]],
            ok: dict[str, dict[str, Any]]) -> list[str]:
    # first_loss: step 1 sees the same samples from the same initialization in every case of one vision/data
    # setting, so A and B agreeing says both trained the same model on the same tokens
    lines = ["", "## The spec's claims at this scale", "",
             "| claim | useful tok/s/GPU A/B | step_s A/B | first_loss A, B | A/B per repeat |",
             "|---|---|---|---|---|"]
    for what, a, b in claims(spec):
        if any("rates" in latest.get(n, {}) for n in (a, b)):
            what += " (one side's rates are medians of per-step rates)"
        sides = _sides(rows, latest, ok, a, b) if a in ok and b in ok else None
        if sides is not None:
            ma, mb, ra, rb = sides
            useful = ma["useful_tokens_per_s_per_gpu"] / mb["useful_tokens_per_s_per_gpu"]
            per = [x["metrics"]["useful_tokens_per_s_per_gpu"] / y["metrics"]["useful_tokens_per_s_per_gpu"]
                   for x, y in zip(ra, rb, strict=False)] if len(ra) == len(rb) > 1 else []
            lines.append(f"| {what} | {useful:.2f} | {ma['step_s'] / mb['step_s']:.2f} | "
                         f"{ma['first_loss']:.4f}, {mb['first_loss']:.4f} | "
                         f"{', '.join(f'{x:.2f}' for x in per)} |")
        elif a in ok and b in ok:
            lines.append(f"| {what} | not measured on one machine run: {a} on {latest[a].get('machine_run')}, {b} "
                         f"on {latest[b].get('machine_run')} | | | |")
        else:
            lines.append(f"| {what} | not measured: {', '.join(n for n in (a, b) if n not in ok)} | | | |")
    return lines


def _repeated(rows: list[dict[str, Any]]) -> list[str]:
    """The summary rows (median and min-max over one machine run's runs), the peer ratio and the ceiling, per
    machine run."""
    latest = {(r["case"], r["machine_run"]): r for r in rows
              if r["name"].endswith(reps.SUMMARY_SUFFIX) and "runs" in r["metrics"]}
    summaries = list(latest.values())  # a later summary of a case and machine run (more runs) replaces the earlier one
    if not summaries:
        return []

    def cell(m: dict[str, Any], key: str, fmt: str) -> str:
        return f"{m[key]:{fmt}} ({m[key + '_min']:{fmt}}-{m[key + '_max']:{fmt}})" if key in m else "-"

    lines: list[str] = []
    header = ("| case | machine run | runs | useful tok/s/GPU | MFU | step_s | peak GiB | MFU ViT / projector / "
              "decoder |")
    for title, frozen in (("full training", False), ("frozen vision (compare with frozen rows only)", True)):
        lines += ["", f"## Repeated cases, {title}: median (min-max) over the runs of one machine run", "", header,
                  "|---|---|---|---|---|---|---|---|"]
        for r in sorted(summaries, key=lambda r: (r["machine_run"], -r["metrics"][reps.USEFUL])):
            if vs_bridge.trains_every_tower(r) == frozen:
                continue
            m = r["metrics"]
            towers = " / ".join(f"{m[k]:.1%}" if k in m else "-" for k in ("mfu_vit", "mfu_projector", "mfu_decoder"))
            lines.append(f"| {r['case']} | {r['machine_run']} | {m['runs']} | {cell(m, reps.USEFUL, '.0f')} | "
                         f"{cell(m, 'mfu', '.1%')} | {cell(m, 'step_s', '.2f')} | {cell(m, 'peak_mem_gib', '.0f')} | "
                         f"{towers} |")
    lines.append("")
    # the latest row of each name: a later H1 summary on a machine run writes its peer ratio and towers row again
    for r in store.latest(rows):
        m = r["metrics"]
        if r["name"].startswith("vs-bridge-recipe"):
            peer = vs_bridge.bridge_case(m["vlmtrain_case"].split("_", 1)[0] + "_")
            lines.append(f"- vs_bridge_recipe ({r['machine_run']}): {m['vs_bridge_recipe']:.2f} = "
                         f"{m['vlmtrain_case']} / {peer}, median useful tokens/s/GPU "
                         f"{m['vlmtrain_' + reps.USEFUL]:.0f} / {m['bridge_recipe_' + reps.USEFUL]:.0f}")
        elif r["name"].startswith(ceiling.PREFIX):
            lines.append(f"- bf16 matmul {r['name'].removeprefix(ceiling.PREFIX)}: {cell(m, 'tflops_per_s', '.0f')} "
                         f"TFLOP/s, {m['fraction_of_peak']:.1%} of peak")
        elif r["name"].startswith("towers-vs-ceiling_"):
            lines.append(f"- towers vs their GEMMs' measured rate ({r['machine_run']}, {m['case']}): " + ", ".join(
                f"{t} {m[f'{t}_tflops_per_s']:.0f} / {m[f'{t}_gemm_ceiling_tflops_per_s']:.0f} TFLOP/s"
                for t in ("vit", "projector", "decoder") if f"{t}_tflops_per_s" in m))
    return lines


def _overhead_line(n: str, r: dict[str, Any]) -> str:
    over = r["metrics"]
    line = (f"- overhead_ratio (vlmtrain / Bridge pretrain() alone) of {n.removeprefix('overhead_')}: "
            f"{over['overhead_ratio']:.3f} over {over['pairs']} pair(s) of {over['steady_steps_per_run']}+ "
            f"steady steps (per pair: {', '.join(f'{x:.3f}' for x in over['pair_ratios'])})")
    if over.get("overhead_ratio_pairs_ci95"):
        lo, hi = over["overhead_ratio_pairs_ci95"]
        line += (f"; total steady step time per pair {', '.join(f'{x:.3f}' for x in over['pair_total_ratios'])}"
                 f", geometric mean {over['overhead_ratio_pairs']:.3f}, 95 % interval over pairs {lo:.3f}-{hi:.3f}")
    elif over.get("overhead_ratio_total") is not None:
        lo, hi = over["overhead_ratio_total_ci95"]
        line += (f"; total steady step time {over['overhead_ratio_total']:.3f} (bootstrap 95 % interval "
                 f"over steps {lo:.3f}-{hi:.3f})")
    if over.get("vlmtrain_host_ms") is not None:
        line += (f"; median of per-step ratios {over['overhead_ratio_paired']:.3f}; vlmtrain's own host code "
                 f"{over['vlmtrain_host_ms']:.1f} ms per step = {over['vlmtrain_host_fraction']:.2%} of it")
    for p in r.get("pairs_detail", []):
        if {"vlmtrain", "direct"} <= p.get("profile", {}).keys():
            a, b = p["profile"]["vlmtrain"], p["profile"]["direct"]
            line += (f"; traced step, vlmtrain / direct: window {a['window_ms']:.0f} / {b['window_ms']:.0f} "
                     f"ms, GPU busy {a['gpu_busy_ms']:.0f} / {b['gpu_busy_ms']:.0f} ms, of it NCCL "
                     f"{a['kernel_ms_by_family'].get('nccl', 0):.0f} / "
                     f"{b['kernel_ms_by_family'].get('nccl', 0):.0f} ms")
    return line + (f" ({r['note']})" if r.get("note") else "")


def report(spec: Spec, results_path: Path, entry: str) -> str:
    """Markdown from the results file alone; `entry`: the command that writes it (the title line)."""
    rows = store.read(results_path)
    latest = latest_rows(results_path)
    ok = {n: r["metrics"] for n, r in latest.items() if "useful_tokens_per_s_per_gpu" in r["metrics"]
          and not n.endswith(reps.SUMMARY_SUFFIX)}
    lines = [f"# {results_path.name}: generated by `{entry}`", *_cases(latest, ok), *_repeated(rows),
             *_claims(spec, rows, latest, ok)]
    failed = [n for n, r in latest.items() if n not in ok and r.get("rc")]
    lines += ["", *(f"- failed: {n}: {latest[n].get('error', '')}" for n in failed)]
    for n, r in latest.items():
        if n.startswith("overhead_"):
            lines.append(_overhead_line(n, r))
        if n.startswith("machine-run-spread_"):
            m = r["metrics"]
            lines.append(f"- the same case on two machine runs, {n.removeprefix('machine-run-spread_')}: "
                         f"{m['useful_tokens_per_s_per_gpu_first_machine_run']:.0f} and "
                         f"{m['useful_tokens_per_s_per_gpu_second_machine_run']:.0f} useful tokens/s/GPU "
                         f"({m['second_over_first_useful_tokens_per_s_per_gpu']:.2f}x): ratios across machine runs "
                         "carry it")
    return "\n".join(lines) + "\n"
