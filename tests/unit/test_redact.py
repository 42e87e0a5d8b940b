"""No secret lands in what a run writes: distinct secrets are planted in the environment (WANDB_API_KEY, HF_TOKEN,
HUGGING_FACE_HUB_TOKEN) and in `+bridge.logger.*` overrides, the real CPU paths run, and every file they write
(and what they print) is searched for each secret.

- `python train.py` as a subprocess: a dry run (plan, .hydra/, bridge_config.yaml, run.json, the checkpoint dir
  it names) and a two-job `-m` sweep (multirun.yaml, preflight.json, the jobs' dir names and files, the report);
- the launcher's run_config.yaml and run.json (vlmtrain.launch.local, what the ranks load);
- Bridge's own checkpoint-config serialization (`cfg.to_yaml` into `<iter dir>/run_config.yaml`, as
  checkpointing.save_checkpoint does) and its setup log (`log_non_default_values`) on the real ConfigContainer,
  with and without vlmtrain's redaction installed;
- the W&B offline run files (the real wandb library).

Named for vlmtrain.config.redact, the redaction all of these rely on (its override_dirname and redact_overrides
are also tested directly); the writers it runs are train.py, vlmtrain.launch.local, Bridge and observe.wandb_run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.config import redact
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve

ROOT = Path(__file__).resolve().parents[2]
ENV_SECRETS = {"WANDB_API_KEY": "wandb-planted-key-0a1b2c3d4e5f", "HF_TOKEN": "hf_plantedToken9z8y7x6w5v",
               "HUGGING_FACE_HUB_TOKEN": "hfhub-planted-4q3r2s1t0u"}
COMET_KEY = "comet-planted-literal-5e6f7a8b9c"
SECRETS = [*ENV_SECRETS.values(), COMET_KEY]
ENV_REF = "+bridge.logger.wandb_exp_name=exp-${oc.env:HF_TOKEN}"
"""A non-secret field that holds a secret env value once resolved: masked by value."""
COMET = f"+bridge.logger.comet_api_key={COMET_KEY}"
"""The credential Bridge's logger takes (Bridge refuses it at validation while comet_ml is not installed)."""
PASTED = "+bridge.logger.wandb_entity=" + ENV_SECRETS["HUGGING_FACE_HUB_TOKEN"]
"""A secret env value pasted literally into an override: masked by value, and Bridge validates it."""


def leaks(root: Path, texts: dict[str, str] | None = None) -> dict[str, list[str]]:
    """{secret: [files or outputs holding it]} over every file under root (and the given captured outputs)."""
    found: dict[str, list[str]] = {}
    files = [p for p in root.rglob("*") if p.is_file()]
    for secret in SECRETS:
        hits = [str(p.relative_to(root)) for p in files if secret.encode() in p.read_bytes()]
        hits += [name for name, text in (texts or {}).items() if secret in text]
        if secret in "".join(str(p) for p in root.rglob("*")):
            hits.append("a path name")
        if hits:
            found[secret] = hits
    return found


@pytest.fixture(scope="module")
def planted() -> Any:
    mp = pytest.MonkeyPatch()
    for k, v in ENV_SECRETS.items():
        mp.setenv(k, v)
    mp.setenv("WANDB_MODE", "offline")
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def train_py(planted: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A dry run and a two-job -m sweep through the real train.py, side by side, in a scratch working dir."""
    cwd = tmp_path_factory.mktemp("cwd")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    base = [sys.executable, str(ROOT / "train.py")]
    cmds = {"single": [*base, "train.save_interval=5", ENV_REF, PASTED, f"hydra.run.dir={cwd}/single"],
            "sweep": [*base, "-m", "dry_run=true", "train.save_interval=5", "train.global_batch_size=16",
                      "train.micro_batch_size=1,2", COMET,
                      f"hydra.sweep.dir={cwd}/sweep"]}
    procs = {k: subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k, c in cmds.items()}
    out = {}
    for k, p in procs.items():
        stdout, stderr = p.communicate(timeout=900)
        out[k] = {"rc": p.returncode, "stdout": stdout, "stderr": stderr}
    return cwd, out


def test_dry_run_writes_no_secret(train_py: tuple[Path, dict[str, Any]]) -> None:
    cwd, out = train_py
    single = out["single"]
    assert single["rc"] == 0, single["stdout"][-3000:] + single["stderr"][-3000:]
    run_dir = cwd / "single"
    written = {p.name for p in run_dir.rglob("*") if p.is_file()}
    assert {"config.yaml", "hydra.yaml", "overrides.yaml", "bridge_config.yaml", "run.json", "data_scan.json"} \
        <= written
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "+bridge.logger.wandb_entity=<redacted>" in overrides and "${oc.env:HF_TOKEN}" in overrides
    assert "wandb_exp_name: exp-<redacted>" in (run_dir / "bridge_config.yaml").read_text()
    assert leaks(cwd, {"stdout": single["stdout"], "stderr": single["stderr"]}) == {}


def test_checkpoint_dir_name_leaves_secret_overrides_out(train_py: tuple[Path, dict[str, Any]]) -> None:
    plan = train_py[1]["single"]["stdout"]
    # the pasted secret and the override that resolves to HF_TOKEN's value are left out (Hydra's own name held both)
    assert re.search(r"checkpoint\.save=checkpoints/train\.save_interval=5(\s|$)", plan), plan


def test_sweep_writes_no_secret(train_py: tuple[Path, dict[str, Any]]) -> None:
    cwd, out = train_py
    sweep = out["sweep"]
    assert sweep["rc"] in (0, 1), sweep["stdout"][-3000:] + sweep["stderr"][-3000:]
    sweep_dir = cwd / "sweep"
    # the key left out of the job dirs' names
    jobs = [f"{n}_train.global_batch_size=16,train.micro_batch_size={n + 1},train.save_interval=5" for n in range(2)]
    assert {p.name for p in sweep_dir.iterdir()} >= {"multirun.yaml", "preflight.json", "report.md", *jobs}
    for job in jobs:  # two jobs: Hydra reconfigures logging around each, and logs each one's overrides
        assert "+bridge.logger.comet_api_key=<redacted>" in (sweep_dir / job / ".hydra" / "overrides.yaml").read_text()
        assert "comet_api_key: <redacted>" in (sweep_dir / job / ".hydra" / "config.yaml").read_text()
    assert "comet_api_key=<redacted>" in sweep["stdout"]  # the launcher's job lines, masked
    assert leaks(cwd, {"stdout": sweep["stdout"], "stderr": sweep["stderr"]}) == {}


# --- in process: the launcher's files, Bridge's checkpoint config and setup log, W&B ---


@pytest.fixture(scope="module")
def built(planted: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    from vlmtrain.build import container

    root = tmp_path_factory.mktemp("inproc")
    run = compose(["train.save_interval=5", COMET, ENV_REF], output_dir=str(root / "run"))
    return run, container.build(run, resolve(run)), root


def save_like_bridge(cfg: Any, save_dir: Path, iteration: int) -> Path:
    """What save_checkpoint's finalize step writes next to the weights: `cfg.to_yaml` into the iteration dir."""
    from megatron.bridge.training.utils.checkpoint_utils import (
        get_checkpoint_name,
        get_checkpoint_run_config_filename,
    )

    name = get_checkpoint_name(str(save_dir), iteration, release=False)
    Path(name).mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(get_checkpoint_run_config_filename(name))
    return Path(get_checkpoint_run_config_filename(name))


def test_bridge_checkpoint_config_and_setup_log(built: tuple[Any, Any, Path], capsys: Any) -> None:
    from vlmtrain.train import bridge_patches

    _, cfg, root = built
    plain = save_like_bridge(cfg, root / "bare", 5)  # Bridge alone: the literal key lands in the checkpoint
    assert COMET_KEY in plain.read_text()
    bridge_patches.install_redaction()
    try:
        saved = save_like_bridge(cfg, root / "ckpt", 5)
        cfg.log_non_default_values()
    finally:
        bridge_patches.uninstall()
    log = capsys.readouterr().out
    assert "comet_api_key: '<redacted>'" in log and "wandb_exp_name: 'exp-<redacted>'" in log
    text = saved.read_text()
    assert saved.parent.name == "iter_0000005" and "comet_api_key: <redacted>" in text
    assert cfg.logger.comet_api_key == COMET_KEY  # the container keeps the key: Comet's init reads it
    assert leaks(root / "ckpt", {"log": log}) == {}


def test_launcher_run_config_holds_references_only(built: tuple[Any, Any, Path]) -> None:
    from vlmtrain.config.compose import load_run
    from vlmtrain.launch import local

    run, _, root = built
    path = local.save_run_config(run, resolve(run))
    assert "${oc.env:VLMTRAIN_SECRET_BRIDGE_LOGGER_COMET_API_KEY" in path.read_text()
    assert load_run(path).bridge["logger"]["comet_api_key"] == COMET_KEY  # a rank gets it from the environment
    assert leaks(root / "run") == {}


def test_wandb_offline_files(built: tuple[Any, Any, Path]) -> None:
    from vlmtrain.observe import wandb_run

    run, cfg, root = built
    wb = wandb_run.init(run, cfg)
    assert wb is not None and wb.offline
    wb.log({"lm_loss": 1.0}, step=1)
    wb.finish()
    files = list((root / "run" / "wandb").rglob("*.wandb"))
    assert files, "no offline run file"
    assert leaks(root / "run") == {}


def test_override_dirname_drops_secret_overrides(planted: Any) -> None:
    lines = ["b=2", COMET, "+bridge.logger.wandb_entity=" + ENV_SECRETS["HF_TOKEN"], "a=1"]
    assert redact.override_dirname(lines, [], ",", "=") == "a=1,b=2"
    # a path value stays one directory level (the Slurm check's sweep with train.checkpoint_dir=/tmp/... nested its
    # job's run dir four levels deep, where nothing looked for rank0.json or metrics.jsonl)
    assert redact.override_dirname(["train.checkpoint_dir=/tmp/ck/30b", "a=1"], [], ",", "=") == (
        "a=1,train.checkpoint_dir=_tmp_ck_30b")
    # ... and under the filesystem's 255: the Slurm check's 11 overrides made a 262-character name (ENAMETOOLONG)
    many = [f"train.option_{i}=/tmp/vlmtrain_slurm_ckpt/30b" for i in range(11)]
    name = redact.override_dirname(many, [], ",", "=")
    assert len(name) == redact.MAX_DIRNAME and name.startswith("train.option_0=_tmp_vlmtrain_slurm_ckpt_30b,")
    assert name == redact.override_dirname(list(reversed(many)), [], ",", "=")  # a resumed job finds its dir
    assert name != redact.override_dirname([*many[:-1], "train.option_10=/tmp/other"], [], ",", "=")
    assert redact.redact_overrides(lines)[1:3] == ["+bridge.logger.comet_api_key=<redacted>",
                                                   "+bridge.logger.wandb_entity=<redacted>"]
