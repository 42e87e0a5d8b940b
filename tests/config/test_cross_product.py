"""The whole cross product parallelism x hardware x dispatcher x recompute x cuda_graph x vision for the tiny
model: every combination is either accepted (preflight passes AND Bridge finalizes/validates it for the
declared hardware) or rejected with a message naming the groups involved — and the test says which."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator

import pytest
from hydra._internal.config_repository import ConfigRepository

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config.resolve import resolve

AXES = {
    "parallelism": ["fsdp", "3d"],
    "hardware": ["gb200", "b200", "h100", "h200"],
    "dispatcher": ["alltoall", "hybridep", "deepep"],
    "recompute": ["none", "selective", "full"],
    "cuda_graph": ["none", "moe_router_preprocess", "attn_moe_router_preprocess"],
    "vision": ["trainable", "frozen", "frozen_with_projector"],
}


def expected_rejections(c: dict[str, str]) -> dict[str, list[str]]:
    """Independent statement of which combinations must be refused, and the words the message must contain."""
    out = {}
    if c["dispatcher"] == "deepep" and c["hardware"] == "gb200":
        out["deepep_not_on_gb200"] = ["dispatcher=deepep", "hardware=gb200"]
    if c["cuda_graph"] != "none" and c["recompute"] == "full":
        out["graphs_with_full_recompute"] = ["cuda_graph", "recompute=full"]
    if c["recompute"] == "full" and c["vision"] != "frozen_with_projector":  # the tiny model has deepstack mergers
        out["deepstack_full_recompute"] = ["recompute=full", f"vision={c['vision']}"]
    if c["cuda_graph"] == "attn_moe_router_preprocess":
        out["qwen3_vl_no_attn_graph"] = ["attn", "model=tiny"]
    return out


@pytest.fixture
def configs_read_once(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hydra reads each YAML option (and the structured schema) once for the 648 composes, not once per compose:
    every compose still runs Hydra's own defaults tree, merges and overrides, on a copy of what it read."""
    read = ConfigRepository.load_config
    seen: dict[tuple, object] = {}

    def load_config(repo: ConfigRepository, config_path: str) -> object:
        key = (tuple((s.provider, s.path) for s in repo.sources), config_path)
        if key not in seen:
            seen[key] = read(repo, config_path)
        return copy.deepcopy(seen[key])

    monkeypatch.setattr(ConfigRepository, "load_config", load_config)
    yield


def test_cross_product(compose, bridge, configs_read_once):
    accepted = rejected = 0
    for values in itertools.product(*AXES.values()):
        combo = dict(zip(AXES, values, strict=True))
        run = compose(*(f"{k}={v}" for k, v in combo.items()))
        res = resolve(run)
        errors = {f.rule: f.message for f in preflight.errors(preflight.check(run, res))}
        expected = expected_rejections(combo)
        assert set(errors) == set(expected), f"{combo}: preflight {sorted(errors)} != expected {sorted(expected)}"
        for rule, words in expected.items():
            assert all(w in errors[rule] for w in words), f"{combo}: {errors[rule]!r} should name {words}"
        if expected:
            rejected += 1
            continue
        cfg = container.build(run, res)
        target.finalize(run, res, cfg)  # Bridge's own validation; raises if it refuses the combination
        accepted += 1
    assert (accepted, rejected) == (286, 362)  # 44 full-recompute jobs with trainable deepstack mergers refused
