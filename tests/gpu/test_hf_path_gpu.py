"""model.hf_path on GPUs: a tiny checkpoint of each family (lab.checks.tiny_hf) trains 2 steps on FSDP and on 3D
(and with EP 2 / TP 2 where 2 GPUs exist); checks.json's hf_embedding_max_diff, read when the model is built (after
Bridge's load, before step 1), must be 0: the built word embedding is the checkpoint's. Run with `pytest -m gpu`."""

from __future__ import annotations

import json

import pytest

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.checks import tiny_hf
from vlmtrain.lab.kit import runner
from vlmtrain.lab.kit.baselines import steps
from vlmtrain.lab.kit.case import Case

pytestmark = pytest.mark.gpu

OPTION = {"qwen3_vl": "tiny", "qwen35_vl": "tiny_qwen35"}
LAYOUTS = {
    "fsdp": (1, ["parallelism=fsdp"]),
    "3d": (1, ["parallelism=3d"]),
    "fsdp_ep2": (2, ["parallelism=fsdp", "parallelism.ep=2", "gpus_per_node=2"]),
    "3d_tp2_ep2": (2, ["parallelism=3d", "parallelism.tp=2", "parallelism.ep=2", "gpus_per_node=2"]),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", OPTION)
def test_hf_weights_load_before_step_1(family, layout, tmp_path):
    gpus, overrides = LAYOUTS[layout]
    if local_gpus() < gpus:
        pytest.skip(f"needs {gpus} GPU(s)")
    ckpt = tiny_hf.build(family, tmp_path / "ckpt")
    run_dir = tmp_path / "run"
    case = Case(f"hf_{family}_{layout}", None, [f"model={OPTION[family]}", f"model.hf_path={ckpt}", *steps(2),
                                                 *overrides])
    run = runner.start(case, run_dir, gpus=list(range(gpus)), fresh=True)
    assert run.wait() == 0, run.log.read_text()[-6000:]
    checks = json.loads((run_dir / "checks.json").read_text())
    assert checks["hf_embedding_max_diff"] == 0.0


@pytest.mark.parametrize("family", OPTION)
def test_an_fp32_checkpoint_trains_in_bf16(family, tmp_path):
    """A float32 checkpoint loads into the BF16 model rounded: the step-0 check compares at the model's dtype."""
    ckpt = tiny_hf.build(family, tmp_path / "ckpt", dtype="float32")
    run_dir = tmp_path / "run"
    case = Case(f"hf_{family}_fp32", None, [f"model={OPTION[family]}", f"model.hf_path={ckpt}", *steps(2),
                                             "parallelism=3d"])
    run = runner.start(case, run_dir, gpus=[0], fresh=True)
    assert run.wait() == 0, run.log.read_text()[-6000:]
    assert json.loads((run_dir / "checks.json").read_text())["hf_embedding_max_diff"] == 0.0
