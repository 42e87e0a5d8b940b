"""The per-step figures a user reads: Bridge's ungated MODEL_TFLOP/s print dropped from its installed training_log
(bridge_patches.step_time), and vlmtrain's own line (observe.step_line) carrying the metrics row's figures."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from vlmtrain.build import container
from vlmtrain.observe.step_line import padding_share, step_line
from vlmtrain.train import bridge_patches
from vlmtrain.train.bridge_patches.step_time import STEP_TIME_PREFIX

# recorded by tests/fixtures/README.md's precision_h200 run (1 x H200, data=realistic, BF16)
METRICS = Path(__file__).parents[1] / "fixtures" / "precision_h200" / "bf16-0" / "metrics.jsonl"


@pytest.fixture
def quiet() -> Iterator[None]:
    bridge_patches.install_always()
    yield
    bridge_patches.uninstall()


def test_bridge_s_training_log_prints_step_time_through_the_patched_name() -> None:
    """Fails when Bridge's source changes: training_log must still print the message through train_utils'
    module-level print_rank_0, starting with the prefix the patch drops."""
    from megatron.bridge.training.utils import train_utils

    source = inspect.getsource(train_utils.training_log)
    assert re.search(r'print_rank_0\(\s*f"' + re.escape(STEP_TIME_PREFIX) + r'\{elapsed_time_per_iteration', source)
    assert source.count(STEP_TIME_PREFIX) == 1
    assert "logger_config.log_throughput:" in source  # the TFLOP/s field of its iteration line, off in the container


def test_quiet_step_time_drops_only_bridge_s_tflops_message(quiet: None, capsys: pytest.CaptureFixture) -> None:
    from megatron.bridge.training.utils import train_utils

    assert "quiet_step_time" in bridge_patches.installed()
    train_utils.print_rank_0("Step Time : 1.23s GPU utilization: 1034.6MODEL_TFLOP/s/GPU")
    train_utils.print_rank_0("setting number of micro-batches")
    assert capsys.readouterr().out == "setting number of micro-batches\n"


def test_bridge_s_throughput_field_is_off_and_nothing_else_reads_it() -> None:
    """log_throughput only gates the TFLOP/s field of training_log's line (Bridge's package); vlmtrain sets it off."""
    from megatron.bridge import training

    root = Path(training.__file__).parents[1]
    readers = [p for p in root.rglob("*.py") if "recipes" not in p.parts
               and re.search(r"\.log_throughput\b(?!_)", p.read_text())]
    assert [p.name for p in readers] == ["train_utils.py"]
    assert "log_throughput=False" in inspect.getsource(container)


@pytest.mark.parametrize("row", [json.loads(line) for line in METRICS.read_text().splitlines()][:4])
def test_the_step_line_carries_the_metrics_row_s_figures(row: dict) -> None:
    line = step_line(row)
    fields = dict(part.split(" ", 1) for part in line.removeprefix("[vlmtrain] ").split(" | "))
    assert int(fields["step"]) == row["step"]
    assert float(fields["lm_loss"]) == pytest.approx(row["lm_loss"], abs=5e-5)
    assert float(fields["step_s"]) == pytest.approx(row["step_s"], abs=5e-4)
    assert float(fields["useful_tokens_per_s_per_gpu"]) == pytest.approx(row["useful_tokens_per_s_per_gpu"], abs=0.5)
    assert float(fields["mfu"].rstrip("%")) == pytest.approx(100 * row["mfu"], abs=5e-3)
    share = 1 - row["nonpad_tokens"] / row["padded_tokens"]
    assert float(fields["padding"].rstrip("%")) == pytest.approx(100 * share, abs=0.05)
    assert padding_share(row) == pytest.approx(share)
