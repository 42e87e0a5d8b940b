"""vlmtrain.report.wandb_views with the real wandb-workspaces library and no network, from a recorded sweep: the W&B
offline runs of the MBS sweep recorded on an H200 (tests/fixtures/wandb_sweep_mbs, tests/fixtures/README.md)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from report_jobs import CASES, CRASH, PNG_SIGNATURE, add_job, case_overrides

from vlmtrain import cli
from vlmtrain.config.compose import compose
from vlmtrain.observe import keys
from vlmtrain.report import ReportCallback, review, wandb_panels, wandb_preview, wandb_views
from vlmtrain.report.wandb_runs import wandb_run_config
from vlmtrain.report.wandb_sweep import config_key, flatten, read, varying_knobs

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "wandb_sweep_mbs"
RECORDED = ROOT / "tests" / "fixtures" / "gpu_acceptance" / "tiny_sweep_mbs"
GROUP = "acc_tiny_sweep_mbs"
MBS = "train.micro_batch_size"
SECTIONS = ["Ranking", "Towers", "Memory", "Training", "Failures"]
CRASH_LINE = ("vlmtrain.checks.SettingNotApplied: cuda_graph=moe_router_preprocess requested but no layer holds a "
              "captured CUDA graph.")
NOT_LOGGED_HERE = {keys.VAL_LM_LOSS}
"""Logged only by runs that evaluate (train.eval_interval): the recorded sweep did not; test_wandb_run checks that
val_lm_loss lands in the history of a run that does."""


@pytest.fixture(scope="module")
def sweep() -> Any:
    return read(FIXTURE)


@pytest.fixture(scope="module")
def spec(sweep: Any) -> dict[str, Any]:
    return wandb_views.spec(sweep, FIXTURE)


def workspace_sections(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]


def charts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for s in workspace_sections(spec) for p in s["panels"] if p["viewType"] != "Markdown Panel"]


def report_grids(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in spec["report"]["spec"]["blocks"] if b["type"] == "panel-grid"]


def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No W&B credentials and no server: a fresh machine without network."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # closed port on loopback


# --- the sweep the views are built from ---

def test_the_recorded_sweep_is_read_as_w_and_b_records_it(sweep: Any) -> None:
    assert (sweep.project, sweep.group, sweep.entity) == ("vlmtrain", GROUP, None)
    assert len(sweep.runs) == 2 and all(r["exit_code"] == 0 for r in sweep.runs)
    ranked = [(j.rank, j.mbs, j.status) for j in sweep.jobs]
    assert ranked == [(1, 2, "ok"), (2, 1, "ok")]  # as `vlmtrain report` ranked the recorded sweep
    csv = (RECORDED / "report.csv").read_text()
    assert all(f"{j.metrics[keys.USEFUL_TOKENS_PER_S_PER_GPU]}" in csv for j in sweep.jobs)


def test_the_knob_that_varies_is_the_grouping_key(sweep: Any) -> None:
    assert sweep.knobs == [MBS]  # not output_dir or the checkpoint dir under it, not W&B's identity
    values = {flatten(wandb_run_config(r["config"]))[MBS] for r in sweep.runs}
    assert values == {1, 2}


def as_logged(overrides: list[str], out: str) -> dict[str, Any]:
    """A composed run config as wandb_run.config logs it."""
    return OmegaConf.to_container(OmegaConf.structured(compose(overrides, output_dir=out)), enum_to_str=True)


def test_a_group_choice_stands_for_the_fields_it_sets() -> None:
    configs = [as_logged(["model=tiny", "train.micro_batch_size=1"], "/s/0"),
               as_logged(["model=tiny", "train.micro_batch_size=2"], "/s/1"),
               as_logged(["model=tiny_qwen35", "train.micro_batch_size=1", "model.num_layers=2"], "/s/2")]
    assert varying_knobs(configs) == ["choices.model", MBS]
    # a field of that group that varies under one choice is a knob of its own
    configs.append(as_logged(["model=tiny", "train.micro_batch_size=1", "model.num_layers=2"], "/s/3"))
    assert varying_knobs(configs) == ["choices.model", "model.num_layers", MBS]


# --- the workspace ---

def test_sections_in_reading_order_each_opened_by_its_check(spec: dict[str, Any]) -> None:
    sections = workspace_sections(spec)
    assert [s["name"] for s in sections] == SECTIONS
    assert all(s["isOpen"] and s["panels"][0]["viewType"] == "Markdown Panel" for s in sections)
    assert [len(s["panels"]) - 1 for s in sections] == [len(s.panels()) for s in wandb_panels.SECTIONS]
    assert spec["workspace"]["displayName"] == f"vlmtrain sweep {GROUP}"


def test_every_charted_metric_is_in_the_recorded_runs(sweep: Any, spec: dict[str, Any]) -> None:
    """Bar charts read each run's summary, line charts its history: a metric vlmtrain renames (observe.keys) is no
    longer in these recorded runs and fails here."""
    history, missing = {k for r in sweep.runs for row in r["history"] for k in row}, set()
    for panel in charts(spec):
        for metric in panel["config"]["metrics"]:
            if panel["viewType"] == "Bar Chart":
                missing |= {metric for r in sweep.runs if metric not in r["summary"]}
            else:
                missing |= {metric} - history
    assert missing == NOT_LOGGED_HERE


def test_charts_name_their_units_and_the_line_charts_step(spec: dict[str, Any]) -> None:
    for panel in charts(spec):
        config = panel["config"]
        assert config["chartTitle"] and config["yAxisTitle"] and config["xAxisTitle"]
        if panel["viewType"] == "Run History Line Plot":
            assert config["xAxis"] == "_step" and "step + 1" in config["xAxisTitle"]
    titles = " ".join(p["config"]["chartTitle"] for p in charts(spec))
    assert all(unit in titles for unit in ("tokens/s/GPU", "(s", "GiB", "MFU"))


def test_ranking_charts_the_figures_the_report_ranks_by(sweep: Any, spec: dict[str, Any]) -> None:
    ranking = workspace_sections(spec)[0]["panels"][1]
    [metric] = ranking["config"]["metrics"]
    assert metric == keys.report_key(keys.USEFUL_TOKENS_PER_S_PER_GPU)
    by_name = {r["name"]: r["summary"][metric] for r in sweep.runs}
    assert sorted(by_name.values()) == sorted(j.metrics[keys.USEFUL_TOKENS_PER_S_PER_GPU] for j in sweep.jobs)


def test_runs_are_the_group_grouped_by_the_knob(spec: dict[str, Any]) -> None:
    [runset] = spec["workspace"]["spec"]["section"]["runSets"]
    [rule] = runset["filters"]["filters"]
    assert (rule["key"], rule["op"], rule["value"]) == ({"section": "run", "name": "group"}, "=", GROUP)
    grouping = [{"section": "config", "name": "vlmtrain.value.train.micro_batch_size"}]
    assert runset["grouping"] == grouping
    assert runset["sort"]["keys"][0]["key"]["name"] == keys.report_key(keys.USEFUL_TOKENS_PER_S_PER_GPU)
    for grid in report_grids(spec):
        [rs] = grid["metadata"]["runSets"]
        assert rs["filters"]["filters"] == runset["filters"]["filters"] and rs["grouping"] == grouping


# --- the report ---

def test_report_puts_each_sections_check_next_to_its_panels(sweep: Any, spec: dict[str, Any]) -> None:
    blocks = spec["report"]["spec"]["blocks"]
    headings = [b["children"][0]["text"] for b in blocks if b["type"] == "heading"]
    assert headings == SECTIONS
    assert len(report_grids(spec)) == 4  # Failures is text only
    text = json.dumps(blocks)
    assert "| rank | job | config |" in text  # the report's ranked table
    assert "Best: **MBS 2** at" in review.ranking(sweep)
    assert spec["report"]["displayName"] == f"vlmtrain sweep {GROUP}"


def test_failures_section_lists_a_crash_with_its_reason(tmp_path: Path) -> None:
    sweep_dir = shutil.copytree(FIXTURE, tmp_path / "sweep")
    add_job(sweep_dir, 2, case_overrides()[CRASH], CASES / CRASH)  # a real crashed run, no W&B run
    sweep = read(sweep_dir)
    text = review.failures(sweep)
    assert "1 crash" in text and CRASH_LINE in text
    failures = workspace_sections(wandb_views.spec(sweep, sweep_dir))[-1]["panels"][0]["config"]["value"]
    assert failures == text


# --- writing, publishing, the sweep's end ---

def test_views_offline_write_the_spec_and_print_the_publish_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    offline(monkeypatch, tmp_path)
    assert cli.main(["wandb", "views", str(FIXTURE), "--out", str(tmp_path / "out"), "--entity", "team"]) == 0
    path = tmp_path / "out" / wandb_views.SPEC_FILE
    assert f"not published (no W&B API key (run `wandb login` or set WANDB_API_KEY)); publish them later with:\n" \
           f"  vlmtrain wandb publish {path}\n" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert (data["entity"], data["project"], data["group"], data["knobs"]) == ("team", "vlmtrain", GROUP, [MBS])
    assert data["workspace"]["entity"] == data["report"]["project"]["entityName"] == "team"
    recorded = sorted(p.parent for p in FIXTURE.glob("*/wandb/*/*.wandb"))
    assert [(path.parent / p).resolve() for p in data["offline_runs"]] == recorded  # found from the spec's folder
    assert (tmp_path / "out" / wandb_views.PREVIEW_FILE).read_bytes().startswith(PNG_SIGNATURE)


def test_publish_refuses_without_a_key_or_a_server_and_keeps_the_spec(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path, spec: dict[str, Any],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    offline(monkeypatch, tmp_path)
    path = tmp_path / wandb_views.SPEC_FILE
    path.write_text(json.dumps(spec))
    assert cli.main(["wandb", "publish", str(path)]) == 2
    assert "no W&B API key (run `wandb login` or set WANDB_API_KEY)" in capsys.readouterr().err
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    assert cli.main(["wandb", "publish", str(path)]) == 2
    assert "http://127.0.0.1:9 is not reachable" in capsys.readouterr().err
    assert json.loads(path.read_text()) == spec
    assert cli.main(["wandb", "publish", str(tmp_path / "none.json")]) == 2


def test_the_spec_loads_back_into_the_views_publish_saves(spec: dict[str, Any]) -> None:
    """publish() saves what load() rebuilds: the same workspace, for the entity it publishes to, and the report with
    its run sets pointed at the sweep's project."""
    workspace, report = wandb_views.load(json.loads(json.dumps(spec)), "team")
    again = wandb_views._dump(workspace._to_model())
    assert again == {**spec["workspace"], "entity": "team"}
    grids = [b for b in report.blocks if hasattr(b, "runsets")]
    assert len(grids) == 4 and all((rs.entity, rs.project) == ("team", "vlmtrain") for g in grids for rs in g.runsets)
    assert [p.title for p in grids[0].panels] == [p["config"]["chartTitle"] for p in charts(spec)[:3]]


def test_bad_sources_exit_2_and_say_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["wandb", "views", str(RECORDED), "--offline", "--out", str(tmp_path)]) == 2
    assert "no W&B runs there" in capsys.readouterr().err  # the recorded sweep ran with wandb.enabled=false
    assert cli.main(["wandb", "views", str(tmp_path / "missing"), "--offline"]) == 2
    assert cli.main(["wandb", "views", "wandb:group-without-entity", "--offline"]) == 2
    assert not (tmp_path / wandb_views.SPEC_FILE).exists()


def test_a_w_and_b_group_without_a_key_exits_2_before_any_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    offline(monkeypatch, tmp_path)
    assert cli.main(["wandb", "views", "wandb:team/vlmtrain/sweep", "--out", str(tmp_path / "out")]) == 2
    assert "cannot read the group from W&B now: no W&B API key" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_sweep_with_wandb_views_builds_them_when_it_ends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Next to the report; published only when the sweep logged online (offline here: the command is printed)."""
    offline(monkeypatch, tmp_path)
    for views in (False, True):
        sweep_dir = shutil.copytree(FIXTURE, tmp_path / f"sweep-{views}")
        config = {"hydra": {"sweep": {"dir": str(sweep_dir)}}, "wandb": {"views": views, "mode": "offline"}}
        ReportCallback().on_multirun_end(OmegaConf.create(config))
        assert (sweep_dir / "report.md").exists()
        assert (sweep_dir / wandb_views.SPEC_FILE).exists() == views
    out = capsys.readouterr().out
    assert f"not published (wandb.mode=offline); publish them later with:\n  vlmtrain wandb publish {sweep_dir}" in out


def test_wandb_views_true_reaches_the_sweeps_end_through_hydra(tmp_path: Path) -> None:
    """A real `python train.py -m` (preflight only, on CPU) into a sweep dir holding the recorded runs: Hydra hands
    wandb.views=true to the sweep's end, which writes the views next to the report."""
    sweep_dir = shutil.copytree(FIXTURE, tmp_path / "sweep")
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "train.micro_batch_size=1,2",
                           "hydra.sweeper.preflight_only=true", "wandb.views=true", "dry_run=true",
                           f"hydra.sweep.dir={sweep_dir}"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "WANDB_MODE": "offline"}, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (sweep_dir / "report.md").exists() and (sweep_dir / wandb_views.SPEC_FILE).exists()
    assert "not published (wandb.mode=offline)" in done.stdout


def test_the_picture_draws_every_panel_of_the_spec(sweep: Any, spec: dict[str, Any], tmp_path: Path) -> None:
    fig = wandb_preview.render(sweep, spec, tmp_path / "views.png")
    drawn = [ax.get_title() or ax.get_title(loc="left") for ax in fig.axes]
    assert len(drawn) == sum(len(s["panels"]) for s in workspace_sections(spec))
    assert [t for t in drawn if t in SECTIONS] == SECTIONS
    titles = [p["config"]["chartTitle"] for p in charts(spec)]
    assert [t.replace("\n", " ") for t in drawn if t not in SECTIONS] == titles
    bars = fig.axes[1]
    assert [t.get_text() for t in bars.get_xticklabels()] == ["micro_batch_size=1", "micro_batch_size=2"]


# --- the keys Bridge logs into the same run ---

def test_bridge_logs_the_losses_under_the_keys_the_views_chart() -> None:
    import torch
    from megatron.bridge.training import losses
    from megatron.bridge.training.utils import train_utils

    _, _, reported = losses.masked_next_token_loss(torch.ones(4), torch.rand(4), check_for_nan_in_loss=False,
                                                   check_for_spiky_loss=False)
    assert list(reported) == [keys.BRIDGE_LM_LOSS] and keys.row_key(keys.BRIDGE_LM_LOSS) == keys.LM_LOSS
    assert f'track_names.append("{keys.BRIDGE_LOAD_BALANCING_LOSS}")' in inspect.getsource(train_utils.training_log)
    assert config_key(MBS) == "vlmtrain.train.micro_batch_size"
