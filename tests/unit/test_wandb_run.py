"""vlmtrain.observe.wandb_run on CPU, read back from its offline `.wandb` file: identity, redacted config, metric rows.

The run is built from the real composed config and Bridge's real ConfigContainer for the GPU case whose metrics
are in tests/fixtures; its metric rows go through the functions metrics_callback uses (megatron_numbers, log_row),
and Bridge's own metrics through Bridge's own GlobalState.wandb_logger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.config import redact
from vlmtrain.config.compose import compose, load_run
from vlmtrain.config.resolve import resolve
from vlmtrain.config.schema import RunConfig
from vlmtrain.launch import local
from vlmtrain.observe import wandb_run
from vlmtrain.report.wandb_runs import read_wandb_file

CASE = Path(__file__).parents[1] / "fixtures/gpu_cases/30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu"
# vlmtrain.lab.cases's SHAPE_30B case on 2 GPUs
OVERRIDES = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "train.iterations=10",
             "train.global_batch_size=8", "gpus_per_node=2"]
ENV_SECRET = "hf_planted0123456789abcdef"
LITERAL_SECRET = "comet-literal-planted-9876543210"
SECRET_ENV = "VLMTRAIN_TEST_HF_TOKEN"
SWEEP_DIR = "multirun/2026-11-29/22-26-58"


def read_offline_run(wandb_file: Path) -> dict[str, Any]:
    """The report's reader of offline record logs, shaped as {run: identity, config, history, summary}."""
    out = read_wandb_file(wandb_file)
    run = {k: out[k] for k in ("project", "group", "job_type", "tags", "name")}
    return {"run": run, "config": out["config"], "history": out["history"], "summary": out["summary"]}


def offline_files(output_dir: Path) -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(str(output_dir / "wandb" / "offline-run-*" / "run-*.wandb")))]


# --- fixtures ---

@pytest.fixture(scope="module")
def env() -> Any:
    mp = pytest.MonkeyPatch()
    mp.setenv(SECRET_ENV, ENV_SECRET)
    mp.setenv("WANDB_MODE", "offline")
    mp.delenv("WANDB_BASE_URL", raising=False)
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def run(env: Any, tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    out = tmp_path_factory.mktemp("run")
    run = compose([*OVERRIDES, f"+bridge.logger.comet_api_key={LITERAL_SECRET}",
                   f"+bridge.logger.comet_experiment_name=exp-${{oc.env:{SECRET_ENV}}}"], output_dir=str(out))
    run.wandb.group = wandb_run.sweep_group(SWEEP_DIR)  # what flow.py sets in a -m sweep
    return run


@pytest.fixture(scope="module")
def bridge_cfg(run: RunConfig) -> Any:
    from vlmtrain.build import container

    return container.build(run, resolve(run))


EVALUATED, VAL_LOSS = 3, 3.5
"""The row an evaluation follows in the logged run, and its loss (the test's value: the GPU case did not evaluate)."""


def fixture_rows(bridge_cfg: Any) -> list[dict[str, Any]]:
    """The GPU case's metrics.jsonl rows plus Bridge's numbers for them, as metrics_callback computes them: the
    FLOPs stats Bridge accumulates for samples padded to seq_length (EP=2 pads) and the step's ViT patches."""
    from vlmtrain.observe.metrics_callback import megatron_numbers

    seq = bridge_cfg.dataset.seq_length
    rows = [json.loads(line) for line in (CASE / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        stats = (row["padded_tokens"], row["samples"] * seq**2, row["vit_patches"], None, None)
        row.update(megatron_numbers(bridge_cfg, row["samples"], stats, row["step_s"], world_size=2))
    return rows


@pytest.fixture(scope="module")
def logged(run: RunConfig, bridge_cfg: Any) -> tuple[list[dict[str, Any]], Path]:
    """Init through wandb_log, log every row as on_train_step_end does and then Bridge's own loss through Bridge's
    GlobalState at the same iteration (training_log's call), close out as on_train_end + Bridge's finish do."""
    from megatron.bridge.training.state import GlobalState

    state = GlobalState()
    state._cfg = bridge_cfg  # the cfg setter would also install Bridge's signal handler in the test process
    wb = wandb_run.init(run, bridge_cfg, resolve(run))
    wandb_run.hand_to_bridge(state, wb)
    rows = fixture_rows(bridge_cfg)
    rows[EVALUATED]["val_lm_loss"] = VAL_LOSS
    for row in rows:
        if "val_lm_loss" not in row:
            wandb_run.log_row(wb, row)
        state.wandb_logger.log({"lm loss": row["lm_loss"]}, row["step"] + 1)
        if "val_lm_loss" in row:  # held until on_eval_end, which comes before evaluate_and_print_results logs
            wandb_run.log_row(wb, row)
            state.wandb_logger.log({"lm loss validation": row["val_lm_loss"]}, row["step"] + 1)
    wandb_run.summarize(wb, json.loads((CASE / "checks.json").read_text()), rows)
    state.wandb_logger.finish()
    return rows, Path(run.output_dir)


@pytest.fixture(scope="module")
def read_back(logged: tuple[list[dict[str, Any]], Path]) -> dict[str, Any]:
    files = offline_files(logged[1])
    assert len(files) == 1, files  # exactly one W&B run per training run
    # W&B's service process writes the record log asynchronously: read it once its exit record has landed
    # (a loaded CI machine once read it mid-write and saw only the first step).
    deadline = time.monotonic() + 60
    while read_wandb_file(files[0])["exit_code"] is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return read_offline_run(files[0])


# --- identity, config, metrics ---

def test_run_identity(run: RunConfig, read_back: dict[str, Any]) -> None:
    r = read_back["run"]
    assert r["project"] == "vlmtrain"
    assert r["group"] == "2026-11-29_22-26-58"
    assert r["job_type"] == "train"
    assert r["name"] == f"vlmtrain-{Path(run.output_dir).name}"


def test_tags_name_every_choice_data_kind_and_versions(run: RunConfig, read_back: dict[str, Any]) -> None:
    tags = set(read_back["run"]["tags"])
    assert {f"{g}:{c}" for g, c in run.choices.items()} <= tags
    assert {"parallelism:auto", "hardware:h200", "model:qwen3_vl_30b_a3b", "data:realistic", "data_kind:real",
            "vision:trainable", "recompute:auto", "cuda_graph:none", "dispatcher:auto"} <= tags
    assert {"megatron-bridge:0.6.2", "megatron-core:0.19.2", "transformer-engine:2.20.2", "torch:2.11.0"} <= tags


def test_mock_data_is_tagged_mock(env: Any) -> None:
    tags = wandb_run.tags(compose(["data=mock"]))
    assert "data:mock" in tags and "data_kind:mock" in tags


def test_config_holds_vlmtrain_and_bridge_fields(read_back: dict[str, Any]) -> None:
    cfg = read_back["config"]
    assert cfg["bridge"]["model"]["num_moe_experts"] == 128
    assert cfg["bridge"]["model"]["moe_token_dispatcher_type"] == "alltoall"  # "token" in a name is no secret
    assert cfg["bridge"]["train"]["global_batch_size"] == 8
    assert cfg["vlmtrain"]["model"]["name"] == "qwen3_vl_30b_a3b"
    assert cfg["vlmtrain"]["data"]["kind"] == "realistic"


def test_secrets_are_redacted_everywhere(logged: tuple[list[dict[str, Any]], Path], read_back: dict[str, Any]) -> None:
    cfg = read_back["config"]
    assert cfg["bridge"]["logger"]["comet_api_key"] == redact.REDACTED
    assert cfg["vlmtrain"]["bridge"]["logger"]["comet_api_key"] == redact.REDACTED
    assert cfg["bridge"]["logger"]["comet_experiment_name"] == f"exp-{redact.REDACTED}"
    for path in (logged[1] / "wandb").rglob("*"):  # the run file, debug logs, metadata
        if path.is_file():
            data = path.read_bytes()
            assert ENV_SECRET.encode() not in data and LITERAL_SECRET.encode() not in data, path


def series(history: list[dict[str, Any]], key: str) -> dict[int, float]:
    return {h["_step"]: h[key] for h in history if key in h}


@pytest.mark.parametrize("key", ["useful_tokens_per_s_per_gpu", "mfu", "step_s", "megatron_tokens_per_s",
                                 "megatron_tflops_per_s_per_gpu", "megatron_flops"])
def test_metric_series_round_trip(key: str, logged: tuple[list[dict[str, Any]], Path],
                                  read_back: dict[str, Any]) -> None:
    expected = {row["step"] + 1: row[key] for row in logged[0]}
    assert series(read_back["history"], key) == pytest.approx(expected)


def test_bridge_metrics_share_the_history_row_of_their_step(logged: tuple[list[dict[str, Any]], Path],
                                                             read_back: dict[str, Any]) -> None:
    rows = {h["_step"]: h for h in read_back["history"]}
    assert sorted(rows) == [row["step"] + 1 for row in logged[0]]
    for row in logged[0]:
        assert rows[row["step"] + 1]["lm loss"] == pytest.approx(row["lm_loss"])
        assert rows[row["step"] + 1]["step"] == row["step"]
    assert read_back["summary"]["checks"]["frozen_unchanged"] is True


def test_validation_loss_shares_the_history_row_of_its_step(logged: tuple[list[dict[str, Any]], Path],
                                                            read_back: dict[str, Any]) -> None:
    """val_lm_loss (metrics_callback's, on the evaluated step's row) and Bridge's own `lm loss validation` land at
    Bridge's iteration number of that step."""
    step = logged[0][EVALUATED]["step"] + 1
    assert series(read_back["history"], "val_lm_loss") == {step: VAL_LOSS}
    assert series(read_back["history"], "lm loss validation") == {step: VAL_LOSS}


def test_summary_holds_the_reports_figures_and_the_memory_estimate(run: RunConfig,
                                                                    logged: tuple[list[dict[str, Any]], Path],
                                                                    read_back: dict[str, Any]) -> None:
    """The figures `vlmtrain report` ranks by, under report/<key> (the plain keys end as the last step's: wandb
    commits that row only at finish), and the memory estimate from the start of the run."""
    from vlmtrain.check import memory
    from vlmtrain.observe import keys, run_summary

    summary, rows = read_back["summary"], logged[0]
    figures = run_summary.summarize_rows(rows, keys=run_summary.SUMMARY_KEYS)
    assert {keys.USEFUL_TOKENS_PER_S_PER_GPU, keys.MFU, keys.STEP_S} <= set(figures)
    assert {k: summary[keys.report_key(k)] for k in figures} == pytest.approx(figures)
    assert summary[keys.USEFUL_TOKENS_PER_S_PER_GPU] == pytest.approx(rows[-1][keys.USEFUL_TOKENS_PER_S_PER_GPU])
    assert summary[keys.MEMORY_ESTIMATE_GIB] == pytest.approx(memory.estimate(run, resolve(run)).allocated)


def test_megatron_numbers_reproduce_bridges_printed_tflops(logged: tuple[list[dict[str, Any]], Path]) -> None:
    """Bridge's FLOPs for a step over Bridge's own interval time give the TFLOP/s/GPU its log printed."""
    printed = re.findall(r"iteration\s+(\d+)/.*?elapsed time per iteration \(ms\): ([\d.]+) \| "
                         r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)", (CASE / "train.log").read_text())
    assert len(printed) == len(logged[0])
    for (iteration, ms, tflops), row in zip(printed, logged[0], strict=True):
        assert int(iteration) == row["step"] + 1
        assert row["megatron_flops"] / (float(ms) / 1e3) / 2 / 1e12 == pytest.approx(float(tflops), abs=0.051)
    assert all(r["megatron_tokens_per_s"] == pytest.approx(8 * 4096 / r["step_s"]) for r in logged[0])


# --- modes ---

@pytest.fixture
def silent_server() -> Any:
    """A loopback TCP server that accepts connections and never answers."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at teardown
            while True:
                held.append(srv.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    srv.close()
    for conn in held:
        conn.close()


@pytest.mark.parametrize("host", ["closed port", "silent host"])
def test_online_without_network_goes_offline_before_wandb_starts(host: str, run: RunConfig,
                                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 request: pytest.FixtureRequest) -> None:
    url = "http://127.0.0.1:9" if host == "closed port" else request.getfixturevalue("silent_server")  # loopback
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    online = dataclasses.replace(run, output_dir=str(tmp_path), wandb=dataclasses.replace(run.wandb, mode="online"))
    wb = wandb_run.init(online, None)
    try:
        assert wb.offline and os.environ["WANDB_MODE"] == "offline"  # wandb itself never waited on the network
        out = capsys.readouterr().out
        assert "not reachable" in out and f"wandb sync {wb.settings.sync_dir}" in out
    finally:
        wandb_run.finish(wb)
    assert len(offline_files(tmp_path)) == 1


def test_probe_says_no_to_a_closed_port_and_a_silent_host(silent_server: str) -> None:
    """The silent host's answer is never awaited past the probe's timeout (its thread is joined with it)."""
    assert not wandb_run.reachable("http://127.0.0.1:9")
    assert not wandb_run.reachable(silent_server, timeout=1.0)


def test_disabled_makes_no_run(run: RunConfig, tmp_path: Path) -> None:
    off = dataclasses.replace(run, output_dir=str(tmp_path), wandb=dataclasses.replace(run.wandb, enabled=False))
    assert wandb_run.init(off, None) is None
    assert not (tmp_path / "wandb").exists()


def test_wandb_mode_env_wins_over_config(run: RunConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_run.requested_mode(run) == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_run.requested_mode(run) == run.wandb.mode == "offline"


def test_group_is_the_sweep_else_the_run_name(run: RunConfig) -> None:
    assert wandb_run.sweep_group("multirun/2026-11-29/22-26-58") == "2026-11-29_22-26-58"
    assert wandb_run.sweep_group("multirun/fsdp_vs_3d") == "fsdp_vs_3d"
    assert wandb_run.group(dataclasses.replace(run, wandb=dataclasses.replace(run.wandb, group=None))) == run.name


def test_bridge_wandb_project_is_refused(env: Any) -> None:
    from vlmtrain.train.after_build import SettingNotApplied

    with pytest.raises(SettingNotApplied, match="use wandb.project"):
        wandb_run.check_bridge_logger(compose(["+bridge.logger.wandb_project=p"]))


# --- redaction ---

def test_redact_masks_secret_keys_and_secret_env_values() -> None:
    environ = {"HF_TOKEN": "hf_abcdefghijkl", "WANDB_API_KEY": "k" * 40, "SOME_KEY": "1", "PATH": "/usr/bin",
               "MY_TOKEN_FOR_CI": "ci-0123456789"}
    kept = {"tokenizer_type": "NullTokenizer", "moe_token_dispatcher_type": "alltoall", "key_head_dim": 128,
            "moe_token_drop_policy": "probs", "image_token_id": 151655, "password": None, "memory_keys": {"a": "b"}}
    tree = {**kept, "hf_token": "anything", "comet_api_key": "x", "url": "https://u:hf_abcdefghijkl@host/x",
            "nested": [{"clientSecret": "s3"}, "plain", "/usr/bin"], "save": "/ckpt/ci-0123456789"}
    assert redact.redact(tree, environ) == {
        **kept, "hf_token": redact.REDACTED, "comet_api_key": redact.REDACTED, "url": f"https://u:{redact.REDACTED}@host/x",
        "nested": [{"clientSecret": redact.REDACTED}, "plain", "/usr/bin"], "save": f"/ckpt/{redact.REDACTED}"}
    assert redact.secret_env(environ) == {"WANDB_API_KEY": "k" * 40, "HF_TOKEN": "hf_abcdefghijkl",
                                          "MY_TOKEN_FOR_CI": "ci-0123456789"}


def test_run_config_file_keeps_no_secret_but_the_ranks_get_it(run: RunConfig) -> None:
    """local.save_run_config writes references; load_run (as vlmtrain.worker loads it) restores the values."""
    stash = "VLMTRAIN_SECRET_BRIDGE_LOGGER_COMET_API_KEY"
    try:
        path = local.save_run_config(run, resolve(run))
        text = path.read_text()
        assert ENV_SECRET not in text and LITERAL_SECRET not in text
        assert redact.env_reference(SECRET_ENV) in text and redact.env_reference(stash) in text

        expected = {"comet_api_key": LITERAL_SECRET, "comet_experiment_name": f"exp-{ENV_SECRET}"}
        assert load_run(path).bridge["logger"] == expected
        with pytest.MonkeyPatch.context() as mp:  # a later reader without the secrets in its environment
            mp.delenv(SECRET_ENV)
            mp.delenv(stash)
            expected = {"comet_api_key": redact.REDACTED, "comet_experiment_name": f"exp-{redact.REDACTED}"}
            assert load_run(path).bridge["logger"] == expected
    finally:
        os.environ.pop(stash, None)


def test_bridge_config_yaml_keeps_no_secret(bridge_cfg: Any, tmp_path: Path) -> None:
    redact.write_bridge_yaml(bridge_cfg, tmp_path / "bridge_config.yaml")
    text = (tmp_path / "bridge_config.yaml").read_text()
    assert ENV_SECRET not in text and LITERAL_SECRET not in text
    assert "num_moe_experts: 128" in text and f"comet_api_key: {redact.REDACTED}" in text


def test_plan_shows_bridge_passthrough_without_secrets(run: RunConfig, bridge_cfg: Any) -> None:
    from vlmtrain.build import plan

    text = plan.render(run, resolve(run), bridge_cfg, [], "OK")
    [line] = [ln for ln in text.splitlines() if ln.lstrip().startswith("+bridge")]
    assert f'logger.comet_api_key="{redact.REDACTED}"' in line and "logger.comet_experiment_name=" in line
    assert ENV_SECRET not in text and LITERAL_SECRET not in text
