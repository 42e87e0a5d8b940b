"""Dry-run plan: compose -> check -> build -> Bridge finalization on the declared target -> a readable plan.

Exit status is 0 only when preflight and Bridge's own validation both accept the run.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.check import bridge_fields, preflight, refusal
from vlmtrain.config import redact
from vlmtrain.config.groups import GROUPS, group_name, kernels, precision
from vlmtrain.config.groups.train import UNSET_WHY, global_batch_size
from vlmtrain.config.resolve import save as save_run_json

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.check.speed import StepTime
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


def field_value(cfg: Any, path: str) -> Any:
    obj = cfg
    for part in path.split("."):
        obj = getattr(obj, part, None)
    if path == "model":
        return type(obj).__name__
    if path == "dataset" and hasattr(obj, "bins_file"):  # vlmtrain.data.bins_dataset.PackedBinsDatasetConfig
        return f"{type(obj).__name__}(capacity={obj.seq_length}, static={obj.static}, pack_align={obj.pack_align})"
    if path == "dataset":
        return f"{type(obj).__name__}(pad_to_max_length={getattr(obj, 'pad_to_max_length', None)})"
    if path == "profiling" and obj is not None:
        return (f"{type(obj).__name__}(pytorch={obj.use_pytorch_profiler}, steps {obj.profile_step_start}-"
                f"{obj.profile_step_end}, ranks={obj.profile_ranks})")
    if isinstance(obj, list):
        return [getattr(x, "name", x) for x in obj]
    return obj


def validation_text(run: RunConfig) -> str:
    """The held-out source and the evaluation schedule, when the run validates."""
    d, t = run.data, run.train
    if d.validation is None and d.validation_fraction is None:
        return ""
    held = f"data.validation={d.validation}" if d.validation is not None else \
        f"data.validation_fraction={d.validation_fraction}"
    return f"  validation: {held}, every {t.eval_interval} steps x {t.eval_iters} batches"


def batch_text(run: RunConfig, res: Resolved) -> str:
    """The samples one step trains: train.global_batch_size of them unpacked; packed, its rows x the samples a row
    holds on average (the data stage's bins of this run's data), and what train.global_batch_size counted; where the
    defaults settled it, why."""
    from vlmtrain.data import prepare

    gbs, cap = global_batch_size(run), res.packing_capacity
    settled = next((a.why for a in res.auto if a.option == "train.global_batch_size"), None)
    if not cap:
        return f"{gbs} samples per step ({settled or 'train.global_batch_size: one sample per row'})"
    lengths = prepare.lengths(run)
    if lengths is None or lengths.longest > cap:
        return f"{gbs} packed rows per step (the samples they hold: the data stage's bins)"
    rows = lengths.rows(cap, res.pack_align)[0]
    per_row = len(lengths.train) / rows
    asked = "the defaults' samples per step (it was unset)" if settled and settled.startswith(UNSET_WHY) else \
        "the command's samples per step"
    counted = (f"train.global_batch_size settled from {asked} to rows (auto)" if settled else
               "train.global_batch_size counts rows (data.packing set)")
    return (f"~{gbs * per_row:.1f} samples per step: {gbs} packed row(s) x ~{per_row:.1f} samples ("
            f"{len(lengths.train)} samples in {rows} rows of <= {cap} tokens); {counted}")


def auto_lines(res: Resolved) -> list[str]:
    """What the auto defaults settled (check.defaults), then why, one line per reason; preflight says why "off"."""
    def wrapped(text: str, first: str, rest: int) -> list[str]:
        return textwrap.wrap(text, width=118, initial_indent=first, subsequent_indent=" " * rest,
                             break_long_words=False, break_on_hyphens=False)

    lines = wrapped("  ".join(f"{a.option}={a.value}" for a in res.auto), "auto:     ", 10)
    reasons: dict[str, list[str]] = {}
    for a in res.auto:
        if a.value != "off":
            reasons.setdefault(a.why, []).append(f"{a.option}={a.value}")
    for why, picks in reasons.items():
        lines += wrapped(f"{', '.join(picks)}: {why}", "  why:     ", 12)
    return lines


def layout_line(res: Resolved) -> str:
    lay = res.layout
    return (f"{lay.nodes} node(s) x {lay.gpus_per_node} GPUs = {lay.world_size} | TP {lay.tp}  PP {lay.pp}  "
            f"VPP {lay.vpp or '-'}  CP {lay.cp} | EP {lay.ep}  ETP {lay.etp} | DP {lay.dp}  expert-DP {lay.expert_dp}")


def memory_section(run: RunConfig, res: Resolved) -> list[str]:
    """Per-GPU peak memory estimate vs the hardware group's memory_gib (check.memory: arithmetic, no Bridge)."""
    from vlmtrain.check import memory

    return memory.render(run, res)


EXPLAINED = {
    "Transformer Engine cross entropy loss fusion has known stability issues":
        "kernels.cross_entropy=te: preflight's te_cross_entropy_fusion finding says what the warning is about and "
        "what was measured",
    "overlap_param_gather settings were not in sync":
        "the parallelism group sets ddp.overlap_param_gather=true; Bridge sets the optimizer's copy of the flag to "
        "match, as training does",
}
"""The start of a warning Megatron or Bridge raises while finalizing some configurations -> why the run goes ahead."""


def library_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """Each distinct warning raised while Bridge finalized the container (where Megatron and Bridge validate it),
    where it was raised and, for those vlmtrain knows, why the run goes ahead: the plan hides import-time noise,
    never these."""
    out: list[str] = []
    for w in caught:
        text = " ".join(str(w.message).split())
        why = next((v for k, v in EXPLAINED.items() if text.startswith(k)), None)
        line = f"  {w.filename.split('site-packages/')[-1]}:{w.lineno}: {text}" + (f" (vlmtrain: {why})" if why else "")
        if line not in out:
            out.append(line)
    return out


def render(run: RunConfig, res: Resolved, cfg: ConfigContainer | None, findings: list[preflight.Finding],
           validation: str, warned: Sequence[str] = (), predicted: StepTime | None = None) -> str:
    lay, t = res.layout, run.train
    lines = [
        f"vlmtrain plan: {run.name}   (declared target: hardware={run.hardware.name}, {lay.world_size} GPUs)",
        "groups:   " + "  ".join(f"{k}={v}" for k, v in run.choices.items()),
        f"world:    {layout_line(res)}",
        f"train:    MBS {t.micro_batch_size}  GBS {global_batch_size(run)}  seq {t.seq_length}  "
        f"grad-accum {res.grad_accum}  iters {t.iterations}  lr {t.lr}",
        f"batch:    {batch_text(run, res)}",
        f"data:     {run.data.kind}" + ("  (MOCK: not a performance run)" if run.data.kind == "mock" else "")
        + (f"  packed: 1 row of <= {res.packing_capacity} tokens per micro-batch"
           f"{' (static: padded to it)' if res.packing_static else ''}, GBS counts rows" if res.packing_capacity
           else "") + validation_text(run),
        "env:      " + " ".join(f"{k}={v}" for k, v in sorted(res.env_vars.items())),
    ]
    vit = run.precision.vision if precision.quantized(run) else "bf16"
    lines.append(f"precision: {precision.label(run)} (Bridge {precision.recipe_name(run)}; ViT {vit}, "
                 f"router {run.precision.router_dtype})")
    lines += auto_lines(res)
    if paths := kernels.replacements(run) + precision.replacements(run):
        lines.append("code:     Bridge code the training processes replace (vlmtrain.train.bridge_patches): "
                     + ", ".join(paths))
    if cfg is not None:
        lines.append("Bridge fields by group:")
        for g in GROUPS:
            vals = [f"{p}={field_value(cfg, p)}" for p in sorted(g.OWNS)]
            lines += textwrap.wrap("  ".join(vals), width=118, initial_indent=f"  {group_name(g):<12}",
                                   subsequent_indent=" " * 14, break_long_words=False, break_on_hyphens=False)
        if run.bridge:  # +bridge.* passthrough, after the groups (redacted: it may carry credentials)
            from vlmtrain.build import container

            vals = container.flatten_overrides(redact.redact(container.bridge_tree(run)))
            lines += textwrap.wrap("  ".join(vals), width=118, initial_indent=f"  {'+bridge':<12}",
                                   subsequent_indent=" " * 14, break_long_words=False, break_on_hyphens=False)
    lines += memory_section(run, res)
    if predicted is not None:
        from vlmtrain.check import speed

        lines += speed.render(predicted)
    lines.append("preflight:" + ("" if findings else " no findings"))
    lines += [f"  {f}" for f in findings]
    if warned:
        lines.append("library warnings while Bridge finalized the container:")
        lines += [textwrap.fill(w, width=118, subsequent_indent=" " * 4, break_long_words=False,
                                break_on_hyphens=False) for w in warned]
    lines.append(f"Bridge validation: {validation}")
    return "\n".join(lines)


def quiet_library_logs() -> None:
    """A plan is read by a person: keep Megatron/TE/transformers' INFO lines and import-time warnings out of it
    (only in the planning process; training ranks keep their logs). What Megatron and Bridge warn while finalizing
    the container is in the plan (`library_warnings`)."""
    for name in ("megatron", "transformer_engine", "TransformerEngine", "transformers", "datasets"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=SyntaxWarning)


def dry_run(run: RunConfig, res: Resolved) -> int:
    """Print the plan; write the resolved Bridge config, run.json and speed.json; return the exit status."""
    from vlmtrain.build import container, target
    from vlmtrain.check import speed

    quiet_library_logs()
    findings = preflight.check(run, res) + bridge_fields.findings(run)
    if errors := preflight.errors(findings):
        print(render(run, res, None, findings, "not attempted (preflight errors)"))
        return refusal.refuse(run.output_dir, "; ".join(map(str, errors)), printed=True)
    predicted = speed.predicted(run, res)  # once: printed and saved for the report
    from vlmtrain.data.scan import BadSample

    try:
        cfg = container.build(run, res)
    except BadSample as e:  # the data scan (vlmtrain.data.prepare) refused a sample
        print(render(run, res, None, findings, f"not attempted (bad data)\n{e}", predicted=predicted))
        return refusal.refuse(run.output_dir, str(e), printed=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # quiet_library_logs' filters are for import-time noise
        try:
            target.finalize(run, res, cfg)
        except Exception as e:  # Bridge raises ValueError/AssertionError/RuntimeError from many places
            groups_hint = " ".join(f"{k}={v}" for k, v in run.choices.items())
            said = f"FAILED for {groups_hint}: {type(e).__name__}: {e}"
            print(render(run, res, cfg, findings, said, library_warnings(caught), predicted))
            return refusal.refuse(run.output_dir, f"Bridge's validation {said}", printed=True, status=3)
    out = Path(run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    redact.write_bridge_yaml(cfg, out / "bridge_config.yaml")
    save_run_json(res, out)
    speed.save(predicted, out)
    print(render(run, res, cfg, findings, f"OK (runtime_config_update); resolved config: {out / 'bridge_config.yaml'}",
                 library_warnings(caught), predicted))
    print("To train: run the same command on a GPU node (or with dry_run=false); add hydra/launcher=slurm for Slurm.")
    sys.stdout.flush()
    return 0
