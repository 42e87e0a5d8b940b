"""A BasicSweeper that runs vlmtrain's preflight on every job of a `-m` sweep before any job starts.

Why: a sweep's bad combinations (FSDP with PP, CUDA graphs with full recompute, a GBS that MBS x DP does not
divide, DeepEP on GB200...) would otherwise fail one by one on the cluster, after queueing. Here each job is
composed with Hydra's own config loader, converted to the typed RunConfig and checked; only valid jobs reach
the launcher (basic, submitit_local or submitit_slurm), invalid ones are listed in `<sweep dir>/preflight.json`
and in the printed table. Launched jobs are numbered 0..N-1 (`hydra.job.num`), in the order of
`preflight.json`'s "launched" list (under `hydra.sweeper.preflight_only=true`, empty: the jobs that passed are its
"passed" list).

Each job is checked against the world it will run on (vlmtrain.config.world.placement, the rule train.py applies): a
dry run against what it declares (`gpus_per_node`, else the hardware group's); a training job launched locally
(basic, submitit_local) against this node's GPUs, one sent to Slurm against the tasks per node its launcher
requests. The table names that world for every job.

Launcher parameters are resolved against each job's config, not only the sweep's: `hydra/launcher=slurm`
derives nodes and GPUs per node from `nodes`, `gpus_per_node` and the hardware group, so a sweep over
`hardware=gb200,h100` needs two resource shapes. Jobs are grouped by their resolved launcher parameters and
each group goes through its own launcher instance (one Slurm array per group, groups one after the other).

A job that fails while running does not stop the others; the sweep ends with status 1 and one message listing every
failed job and why (the message it was refused with, from its run dir, else its status), after running the
on_multirun_end callbacks (the sweep report covers it). When preflight leaves nothing to launch (every job invalid,
or preflight.fail_sweep=true and one is), the sweep ends with status 2 and one message, as train.py refuses a single
run, after those callbacks too. Neither ends in a traceback.
"""
# No `from __future__ import annotations`: Hydra's plugin scanner executes this module before it is in
# sys.modules, and dataclasses then cannot resolve string annotations.

import copy
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.config.world import Placement

PREFLIGHT_FILE = "preflight.json"


@dataclass
class VlmtrainSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.vlmtrain_sweeper.vlmtrain_sweeper.VlmtrainSweeper"
    preflight_only: bool = False
    """Expand and preflight the sweep, write preflight.json and the table, launch nothing."""


ConfigStore.instance().store(group="hydra/sweeper", name="vlmtrain", node=VlmtrainSweeperConf, provider="vlmtrain")


FAILED_STATUS = 1
"""A -m sweep's exit status when launched jobs failed (2: preflight launched nothing; 0: every job completed)."""


@dataclass
class SweepJob:
    """One job of the expanded sweep and what preflight said about it."""

    overrides: list[str]
    findings: list[str] = field(default_factory=list)
    valid: bool = True
    fail_sweep: bool = False
    launcher: dict[str, Any] = field(default_factory=dict)
    """The launcher parameters resolved against this job's config."""
    world: str = ""
    """The world preflight checked the job against, e.g. "1 node x 1 GPU (local)"."""
    num: int | None = None
    """hydra.job.num once launched (None when skipped)."""
    predicted: dict[str, Any] | None = None
    """check.speed's prediction for a valid job (step_s, useful_tokens_per_s_per_gpu, mfu, the terms)."""

    @property
    def shown(self) -> list[str]:
        """The overrides as the table and preflight.json show them: secrets masked (vlmtrain.config.redact)."""
        from vlmtrain.config import redact

        return redact.redact_overrides(self.overrides)

    @property
    def label(self) -> str:
        return " ".join(filter_overrides(self.shown)) or "(no overrides)"


class VlmtrainSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 preflight_only: bool = False) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.preflight_only = preflight_only
        self.task_function: TaskFunction | None = None
        self._default_launcher_params: dict[str, Any] = {}
        self._local_gpus = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        from vlmtrain.config.world import local_gpus

        self.task_function = task_function
        self._default_launcher_params = _resolved(config.hydra.launcher)
        self._local_gpus = local_gpus()

    # --- expansion and preflight ---------------------------------------------------------------------------

    def expand(self, arguments: Sequence[str]) -> list[list[str]]:
        """Every job's overrides: Hydra's own expansion (cartesian product, sweeper params first)."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        return [list(job) for batch in self.split_arguments(overrides, None) for job in batch]

    def check(self, overrides: list[str]) -> SweepJob:
        """Compose one job as its launcher will, convert it to the RunConfig, place it on the world it will run on,
        resolve it (config.resolve) and run preflight on it."""
        from vlmtrain.check import bridge_fields, preflight
        from vlmtrain.config import world
        from vlmtrain.config.compose import to_run

        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        job = SweepJob(overrides=list(overrides), launcher=_resolved(cfg.hydra.launcher),
                       fail_sweep=bool(OmegaConf.select(cfg, "preflight.fail_sweep", default=False)))
        try:
            run = to_run(cfg)
            place, res = self.placed(run, job.launcher)
            job.world = str(place)
            # the layout of the world it will run on; +bridge.* fields against Bridge's own classes
            findings = preflight.check(run, res) + bridge_fields.findings(run)
        except world.NoGpuError as e:
            job.world = "no GPU (local)"
            findings = [preflight.Finding("world", preflight.Severity.error, str(e))]
        except (OmegaConfBaseException, ValueError) as e:  # schema: a missing value, a wrong type
            message = " ".join(f"{type(e).__name__}: {e}".split())
            findings = [preflight.Finding("schema", preflight.Severity.error, message)]
        errors = preflight.errors(findings)
        job.valid = not errors
        job.findings = [str(f) for f in errors] + [str(f) for f in findings if f not in errors]
        if job.valid:
            from vlmtrain.check import speed

            job.predicted = speed.predicted(run, res).to_dict()
        return job

    def placed(self, run: "RunConfig", launcher: dict[str, Any]) -> tuple["Placement", "Resolved"]:
        """check.defaults.placed for this job's launcher: the GPUs and tasks per node Slurm will allocate
        (hydra/launcher=slurm), else this node's GPUs (the basic and submitit_local launchers run jobs here)."""
        from vlmtrain.check.defaults import placed

        if str(launcher.get("_target_", "")).endswith(".SlurmLauncher"):
            return placed(run, int(launcher.get("gpus_per_node") or 0),
                          slurm_tasks_per_node=int(launcher["tasks_per_node"]))
        return placed(run, self._local_gpus)

    # --- the sweep ---------------------------------------------------------------------------------------

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.save_multirun_yaml(sweep_dir)

        jobs = [self.check(o) for o in self.expand(arguments)]
        from vlmtrain.config import redact

        # the launcher logs every job's overrides, through its module's logger
        redact.mask_logs([o for j in jobs for o in j.overrides], [type(self.launcher).__module__])
        invalid = [j for j in jobs if not j.valid]
        abort = bool(invalid) and any(j.fail_sweep for j in invalid)
        groups = [] if abort else number_jobs(jobs)
        write_preflight(sweep_dir / PREFLIGHT_FILE, jobs, launched=not abort, preflight_only=self.preflight_only)
        print(summary_table(jobs, sweep_dir / PREFLIGHT_FILE), flush=True)
        if abort:
            self.end_with(2, f"preflight.fail_sweep=true and {len(invalid)} job(s) failed preflight; nothing was "
                          "launched:\n" + "\n".join(f"  {j.label}: {'; '.join(j.findings[:1])}" for j in invalid))
        if not any(j.valid for j in jobs):
            self.end_with(2, f"preflight rejected all {len(jobs)} job(s); nothing was launched (see "
                          f"{sweep_dir / PREFLIGHT_FILE}).")
        if self.preflight_only:
            return []
        if len(groups) > 1:
            print(f"[vlmtrain] the launched jobs need {len(groups)} different launcher settings (e.g. GPUs per "
                  "node of different hardware): one launch per setting, one after the other.", flush=True)

        returns: list[Sequence[JobReturn]] = []
        for params, group in groups:
            launcher, start = self.launcher_for(params), group[0].num or 0
            for chunk in self.split_overrides_to_chunks([j.overrides for j in group], self.max_batch_size):
                returns.append(launcher.launch(chunk, initial_job_idx=start))
                start += len(chunk)
        failed = failures(returns)
        if failed:
            self.end_with(FAILED_STATUS, f"{len(failed)} of {sum(map(len, returns))} launched job(s) failed "
                          "(the sweep report lists them too):\n" + "\n".join(failed))
        return returns

    def save_multirun_yaml(self, sweep_dir: Path) -> None:
        """BasicSweeper's multirun.yaml, secrets masked like each job's .hydra/ files."""
        from vlmtrain.config import redact

        files = redact.hydra_files(self.config)
        OmegaConf.save(OmegaConf.create({**files["config.yaml"], **files["hydra.yaml"]}), sweep_dir / "multirun.yaml")

    def end_with(self, status: int, message: str) -> NoReturn:
        """The sweep report first (Hydra runs on_multirun_end only when the sweeper returns), then one message and
        `status`: 2 where preflight launched nothing, as train.py refuses one run; FAILED_STATUS where launched jobs
        failed (a raised error would reach the user as Hydra's traceback, status 1, without the reasons)."""
        self.multirun_end()
        print(f"[vlmtrain] {message}", file=sys.stderr, flush=True)
        sys.exit(status)

    def multirun_end(self) -> None:
        assert self.hydra_context is not None and self.config is not None
        self.hydra_context.callbacks.on_multirun_end(config=self.config,
                                                     config_name=self.config.hydra.job.config_name)

    def launcher_for(self, params: dict[str, Any]) -> Launcher:
        """The configured launcher, or a new instance with another job's resolved parameters."""
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        assert self.launcher is not None
        if params == self._default_launcher_params:
            return self.launcher
        cfg = copy.deepcopy(self.config)
        OmegaConf.copy_cache(from_config=self.config, to_config=cfg)  # same ${now:} -> same sweep dir
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.launcher = params
        return Plugins.instance().instantiate_launcher(hydra_context=self.hydra_context,
                                                       task_function=self.task_function, config=cfg)


def _resolved(node: Any) -> dict[str, Any]:
    out = OmegaConf.to_container(node, resolve=True)
    assert isinstance(out, dict)
    return out


def _num(ret: JobReturn) -> int:
    return int(OmegaConf.select(ret.hydra_cfg, "hydra.job.num", default=-1)) if ret.hydra_cfg is not None else -1


def number_jobs(jobs: list[SweepJob]) -> list[tuple[dict[str, Any], list[SweepJob]]]:
    """Group the valid jobs by launcher parameters (first appearance first) and number them 0..N-1."""
    groups: dict[str, tuple[dict[str, Any], list[SweepJob]]] = {}
    for j in jobs:
        if j.valid:
            groups.setdefault(json.dumps(j.launcher, sort_keys=True, default=str), (j.launcher, []))[1].append(j)
    n = 0
    for _, members in groups.values():
        for j in members:
            j.num, n = n, n + 1
    return list(groups.values())


def write_preflight(path: Path, jobs: list[SweepJob], launched: bool, preflight_only: bool = False) -> None:
    """preflight.json: the skipped jobs with their findings, the launched jobs' overrides by job number (under
    preflight_only nothing is launched, and the jobs that passed are listed as "passed"), and each valid job's
    predicted step (check.speed), fastest first."""
    valid_jobs = [j for j in jobs if j.valid]
    valid = [j.shown for j in sorted(valid_jobs, key=lambda j: j.num or 0)]
    out: dict[str, Any] = {
        "skipped": [{"job": j.label, "overrides": j.shown, "findings": j.findings} for j in jobs if not j.valid],
        "launched": valid if launched and not preflight_only else [],
        "predicted": [{"job": j.label, "overrides": j.shown, **(j.predicted or {})} for j in ranked(valid_jobs)],
    }
    if preflight_only:
        out.update(preflight_only=True, passed=valid)
    path.write_text(json.dumps(out, indent=2) + "\n")


PREDICTED_HEAD = "predicted: # s/step tok/s/GPU MFU"
"""The table's column of check.speed's prediction (rank by useful tokens/s/GPU)."""


def ranked(jobs: list[SweepJob]) -> list[SweepJob]:
    """Valid jobs by predicted useful tokens/s/GPU, fastest first (check.speed)."""
    return sorted(jobs, key=lambda j: -(j.predicted or {}).get("useful_tokens_per_s_per_gpu", 0.0))


def predicted_cell(j: SweepJob, rank: dict[int, int]) -> str:
    """`#rank s/step tok/s/GPU MFU` of a valid job's prediction; blanks for a skipped one."""
    p = j.predicted
    if not p:
        return f"{'':>3} {'':>7} {'':>7} {'':>5}"
    return (f"{'#' + str(rank[id(j)]):>3} {p['step_s']:>6.2f}s {p['useful_tokens_per_s_per_gpu']:>7.0f} "
            f"{100 * p['mfu']:>4.1f}%")


def summary_table(jobs: list[SweepJob], path: Path) -> str:
    """One line per job in sweep order: job number (or SKIP), overrides, the world it was checked against, its rank
    by predicted useful tokens/s/GPU with the predicted step and MFU (check.speed), errors or the warning and info
    rule names; then the fastest predicted job."""
    n_ok = sum(j.valid for j in jobs)
    width = min(max((len(j.label) for j in jobs), default=9), 80)
    ww = max((len(j.world) for j in jobs), default=5)
    order = ranked([j for j in jobs if j.valid])
    rank = {id(j): i + 1 for i, j in enumerate(order)}
    lines = [f"[vlmtrain] sweep preflight: {len(jobs)} job(s), {n_ok} to launch, {len(jobs) - n_ok} skipped "
             f"-> {path}", f"  {'job':>4}  {'overrides':<{width}}  {'world':<{ww}}  {PREDICTED_HEAD:<28}  findings"]
    for j in jobs:
        head = (f"  {'SKIP' if not j.valid else '-' if j.num is None else j.num:>4}  {j.label:<{width}}  "
                f"{j.world:<{ww}}  {predicted_cell(j, rank):<28}")
        if j.valid:
            said = {label: [f.split(":", 1)[0].removeprefix(f"[{sev}] ") for f in j.findings
                            if f.startswith(f"[{sev}]")] for sev, label in (("warning", "warnings"), ("info", "info"))}
            cells = [f"{label}: " + ", ".join(rules) for label, rules in said.items() if rules]
            lines.append(f"{head}  {'; '.join(cells) or '-'}")
        else:
            lines.append(f"{head}  {j.findings[0]}")
            lines += [f"  {'':>4}  {'':<{width}}  {'':<{ww}}  {'':<28}  {f}" for f in j.findings[1:]
                      if f.startswith("[error]")]
    if order and order[0].predicted:
        best, p = order[0], order[0].predicted
        where = f"job {best.num}" if best.num is not None else "the first job"
        lines.append(f"[vlmtrain] fastest predicted: {where}, {p['step_s']:.2f} s/step, "
                     f"{p['useful_tokens_per_s_per_gpu']:.0f} useful tokens/s/GPU, MFU {100 * p['mfu']:.1f} % "
                     "(check.speed; preflight.json lists every job's)")
    return "\n".join(lines)


def failures(returns: Sequence[Sequence[JobReturn]]) -> list[str]:
    """After every job ended: print the outcome; one line per failed job (its number, overrides and why: the
    message it was refused with, from its run dir, else its exit status), none when every job completed."""
    from vlmtrain.check import refusal
    from vlmtrain.config import redact

    results = [r for batch in returns for r in batch]
    failed = [r for r in results if r.status != JobStatus.COMPLETED]
    print(f"[vlmtrain] sweep done: {len(results) - len(failed)} of {len(results)} launched job(s) completed"
          + (f", {len(failed)} failed" if failed else ""), flush=True)
    lines = []
    for r in failed:
        run_dir = OmegaConf.select(r.hydra_cfg, "hydra.runtime.output_dir") if r.hydra_cfg is not None else None
        record = refusal.refusal(run_dir) if run_dir else None
        why = (f"refused (status {record['status']}): {record['error']}" if record else
               f"{type(r._return_value).__name__}: {r._return_value}")
        lines.append(f"  #{_num(r)} {' '.join(filter_overrides(redact.redact_overrides(r.overrides or [])))}: {why}"
                     + (f" (run dir {run_dir})" if run_dir else ""))
    return lines
