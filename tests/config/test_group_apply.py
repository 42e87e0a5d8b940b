"""What each group's apply() may write and what they build together: OWNS sets are disjoint, a swap of one group's
option changes only fields it OWNS (SWAPS, each with its real resolved values), every group and option is listed
(FROZEN_OPTIONS), a typo'd `+bridge.*` override is refused, the built container round-trips through YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain.build import container, target
from vlmtrain.config import groups
from vlmtrain.config.resolve import resolve


def covers(owned: str, path: str) -> bool:
    """Whether owning the Bridge field path `owned` means owning `path`: the same path, or a dotted prefix of it
    (`model` covers `model.num_layers`; `model.x` does not cover `model.xy`)."""
    return path == owned or path.startswith(owned + ".")


def overlaps(owns: dict[str, frozenset[str]]) -> list[str]:
    """Every pair of groups (by name) whose OWNS meet: one group's path equals or is a dotted prefix of another's."""
    names = sorted(owns)
    return [f"{a}:{p} / {b}:{q}" for i, a in enumerate(names) for b in names[i + 1:]
            for p in sorted(owns[a]) for q in sorted(owns[b]) if covers(p, q) or covers(q, p)]


def test_owns_sets_are_disjoint():
    assert overlaps({groups.group_name(g): g.OWNS for g in groups.GROUPS}) == []


def test_a_planted_prefix_overlap_is_caught():
    planted = {"a": frozenset({"model"}), "b": frozenset({"model.num_layers"})}
    assert overlaps(planted) == ["a:model / b:model.num_layers"]
    assert overlaps({"a": frozenset({"env_vars.X"}), "b": frozenset({"env_vars"}), "c": frozenset({"rng.seed"})}) \
        == ["a:env_vars.X / b:env_vars"]
    assert overlaps({"a": frozenset({"mixed_precision"}), "b": frozenset({"mixed_precision"})}) != []
    assert overlaps({"a": frozenset({"model.x"}), "b": frozenset({"model.xy", "modelx"})}) == []  # no dotted prefix


# Every group and each group's options (conf/<group>/*.yaml), frozen: a new group or option fails here until it is
# added to this literal, and with it to TABLE and SWAPS (docs/architecture.md, "Adding a config group").
FROZEN_OPTIONS: dict[str, tuple[str, ...]] = {
    "model": ("qwen35_vl_35b_a3b", "qwen3_vl_235b_a22b", "qwen3_vl_30b_a3b", "tiny", "tiny_qwen35"),
    "data": ("energon", "hf", "jsonl", "mock", "parquet", "realistic", "sample"),
    "parallelism": ("3d", "auto", "fsdp"),
    "hardware": ("b200", "gb200", "h100", "h200"),
    "dispatcher": ("alltoall", "auto", "deepep", "hybridep"),
    "recompute": ("auto", "full", "none", "selective"),
    "cuda_graph": ("attn_moe_router_preprocess", "moe_router_preprocess", "none"),
    "kernels": ("auto", "default", "fast"),
    "vision": ("frozen", "frozen_with_projector", "trainable"),
    "precision": ("bf16", "fp8", "mxfp8", "nvfp4"),
    "train": (),  # set field by field in conf/train.yaml, no options
}
NOT_GROUPS = ("experiment", "hydra", "tune")
"""conf/ folders that are no config group: presets over several groups, Hydra's own settings, sweep and tune specs."""


def test_no_new_groups_or_options():
    conf = Path(container.__file__).resolve().parents[3] / "conf"
    found = {groups.group_name(g): tuple(sorted(p.stem for p in (conf / groups.group_name(g)).glob("*.yaml")))
             for g in groups.GROUPS}
    assert found == FROZEN_OPTIONS, "a group or option was added or removed: update FROZEN_OPTIONS, TABLE and SWAPS"
    folders = {p.name for p in conf.iterdir() if p.is_dir()}
    assert folders == {g for g, options in FROZEN_OPTIONS.items() if options} | set(NOT_GROUPS), folders


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        return {k: v for key, val in d.items() for k, v in _flat(val, f"{prefix}.{key}" if prefix else key).items()}
    return {prefix: json.dumps(d, default=str, sort_keys=True)}


# Pairs of runs that differ in one group only: applying the second option onto the first run's container may
# change only fields that group OWNS.
SWAPS = [
    ("parallelism", ["parallelism=fsdp"], ["parallelism=3d", "parallelism.tp=2", "parallelism.ep=2"]),
    ("dispatcher", ["dispatcher=alltoall"], ["dispatcher=hybridep"]),
    ("recompute", ["recompute=none"], ["recompute=full"]),
    ("cuda_graph", ["cuda_graph=none"], ["cuda_graph=moe_router_preprocess"]),
    ("kernels", ["kernels=default"], ["kernels=fast"]),
    ("vision", ["vision=trainable"], ["vision=frozen_with_projector"]),
    ("precision", ["precision=bf16"], ["precision=fp8", "precision.scaling=blockwise", "precision.router_dtype=fp64",
                                                 "precision.precision_aware_optimizer=true"]),
    ("train", [], ["train.micro_batch_size=2", "train.iterations=7", "train.save_interval=5", "train.profile_step=3",
                   "train.on_nonfinite=skip", "train.eval_interval=5", "train.eval_iters=2"]),
    ("model", ["model=tiny"], ["model=qwen3_vl_30b_a3b", "model.num_layers=4"]),
    ("data", ["data=mock"], ["data=sample"]),
    ("hardware", ["hardware=h200"], ["hardware=b200"]),
]


def test_every_group_has_a_swap():
    assert sorted(g for g, _, _ in SWAPS) == sorted(groups.group_name(g) for g in groups.GROUPS)


def apply_group(module: object, run: object, cfg: object) -> None:
    """The group's part of container.build: the model group also builds the provider, the data group's apply takes
    what the data stage prepared."""
    from vlmtrain.data import prepare

    res = resolve(run)
    if module is groups.model:
        cfg.model = groups.model.build_provider(run, container._token_ids(str(prepare.processor_dir(run))))
        groups.model.apply(run, res, cfg)
    elif module is groups.data:
        prepared = prepare.prepare(run, res)
        groups.data.apply(run, res, cfg, str(prepare.processor_dir(run)), prepared.hf_source,
                          prepared.energon_kwargs)
    else:
        module.apply(run, res, cfg)


@pytest.mark.parametrize(("group", "before", "after"), SWAPS, ids=[s[0] for s in SWAPS])
def test_apply_writes_only_owned_fields(compose, bridge, group, before, after):
    module = getattr(groups, group)
    first = compose(*before)
    cfg = container.build(first, resolve(first))
    snapshot = _flat(cfg.to_dict())
    apply_group(module, compose(*after), cfg)
    changed = {k for k, v in _flat(cfg.to_dict()).items() if snapshot.get(k) != v}
    assert changed, f"{group}: switching options changed nothing"
    owned = module.OWNS | getattr(module, "BUILDS", frozenset())  # model: the provider it constructs
    stray = {k for k in changed if not any(covers(o, k) for o in owned)}
    assert not stray, f"{group} wrote fields it does not own: {sorted(stray)}"


def test_unknown_bridge_override_is_rejected(compose, bridge):
    from megatron.bridge.training.utils.omegaconf_utils import OverridesError

    run = compose("+bridge.model.moe_aux_loss_coef=0.0")
    with pytest.raises(OverridesError, match="moe_aux_loss_coef"):
        container.build(run, resolve(run))


@pytest.mark.parametrize(("override", "said"), [
    ("+bridge.model.moe_aux_loss_coef=0.0", "+bridge.model (Bridge's Qwen3VLMoEModelProvider) has no field "
     "'moe_aux_loss_coef'. Did you mean +bridge.model.moe_aux_loss_coeff?"),
    ("+bridge.optimizer.lrr=1e-4", "+bridge.optimizer (Bridge's OptimizerConfig) has no field 'lrr'. Did you mean "
     "+bridge.optimizer.lr?"),
    ("+bridge.trian.train_iters=3", "Bridge's ConfigContainer has no section 'trian'. Did you mean +bridge.train?"),
])
def test_a_bridge_field_typo_is_refused_before_the_build_naming_the_closest(dry_run, tmp_path, override, said):
    """Bridge's own classes say what exists: the dry run refuses with one preflight error and status 2 (where
    Bridge's parser raised three chained tracebacks with Hydra's hint for its own command line)."""
    status, printed = dry_run(override, run_dir=tmp_path)
    assert status == 2 and f"[error] bridge_field_exists: {override.split('=')[0]}: {said}" in printed
    assert "Bridge validation: not attempted (preflight errors)" in printed


def test_real_bridge_fields_pass(compose, bridge):
    from vlmtrain.check import bridge_fields

    run = compose("+bridge.model.moe_router_force_load_balancing=true", "+bridge.ddp.bucket_size=1000",
                  "+bridge.validation.eval_global_batch_size=8", "model=qwen35_vl_35b_a3b")
    assert bridge_fields.findings(run) == []


def test_resolved_configs_round_trip_to_yaml(compose, bridge, tmp_path):
    from omegaconf import OmegaConf

    from vlmtrain.config.compose import load_run

    run = compose("experiment=3d_gb200")
    OmegaConf.save(OmegaConf.structured(run), tmp_path / "run.yaml")
    assert load_run(tmp_path / "run.yaml") == run

    res = resolve(run)
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    cfg.to_yaml(str(tmp_path / "bridge.yaml"))
    loaded = bridge.ConfigContainer.from_yaml(str(tmp_path / "bridge.yaml"))
    target.finalize(run, res, loaded)  # derived scheduler steps are recomputed, not serialized
    assert _flat(loaded.to_dict()) == _flat(cfg.to_dict())


def test_qwen35_build_refuses_hopper_without_tilelang(monkeypatch):
    """FLA's own condition (Hopper, Triton 3.4-3.7.0, no usable TileLang) fails the model build, not step 1."""
    import fla.utils
    import torch
    from fla.backends import TileLangBackend

    from vlmtrain.config.groups import model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fla.utils, "IS_NVIDIA_HOPPER", True)
    monkeypatch.setattr(fla.utils, "TRITON_ABOVE_3_4_0", True)
    monkeypatch.setattr(fla.utils, "TRITON_ABOVE_3_7_1", False)
    monkeypatch.setattr(TileLangBackend, "can_use", classmethod(lambda cls: False))
    with pytest.raises(RuntimeError, match="tilelang"):
        model.require_gdn_backward()
    monkeypatch.setattr(TileLangBackend, "can_use", classmethod(lambda cls: True))
    model.require_gdn_backward()
