"""Every data kind, from real files on disk through Bridge's own dataset builder and Qwen-VL collate (CPU only).

The files are the shipped photos written by `vlmtrain data export` (datasets' to_parquet / save_to_disk, Energon's
prepare); each run is composed as train.py composes it and built into the real ConfigContainer; one batch goes
through Bridge's provider and collate with the offline Qwen3-VL processor and must carry real image tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.config.resolve import resolve
from vlmtrain.data import PHOTOS
from vlmtrain.data.export import export


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> dict[str, dict[str, Any]]:
    """Each format with one corrupt image (the last photo), written once for the module."""
    root = tmp_path_factory.mktemp("exports")
    return {fmt: export(fmt, root / fmt, corrupt=1, cache=cache) for fmt in ("jsonl", "parquet", "hf", "energon")}


def _build(compose, cache: Path, tmp_path: Path, *overrides: str) -> Any:
    """The run's ConfigContainer dataset as training builds it (finalized), and the run."""
    from vlmtrain.build import container

    run = compose(*overrides, f"data.cache_dir={cache}", "data.num_workers=0", "train.micro_batch_size=2",
                  output_dir=str(tmp_path / "run"))
    cfg = container.build(run, resolve(run))
    cfg.dataset.finalize()
    return run, cfg


def _batch(cfg: Any, samples: int = 4) -> dict[str, Any]:
    """One micro-batch the way Bridge's training gets it: the dataset provider, then its collate (Energon: its
    loader, which collates in its task encoder)."""
    from megatron.bridge.data.utils import get_dataset_provider

    train, _, _ = get_dataset_provider(cfg.dataset)([samples, 0, 0], cfg.dataset)
    if hasattr(train, "collate_fn"):
        return train.collate_fn([train[i] for i in range(2)])
    return next(train)


def _assert_real_images(batch: dict[str, Any], image_token_id: int) -> None:
    grid = batch["visual_inputs"].image_grid_thw
    image_tokens = int((batch["input_ids"] == image_token_id).sum())
    assert image_tokens > 0 and image_tokens == int(grid.prod(-1).sum()) // 4
    assert batch["visual_inputs"].pixel_values.shape == (int(grid.prod(-1).sum()), 3 * 2 * 16 * 16)
    assert (batch["loss_mask"].sum(-1) > 0).all()


@pytest.mark.parametrize("kind", ["sample", "realistic", "mock"])
def test_generated_kinds_train_on_bridge(bridge, compose, cache: Path, tmp_path: Path, kind: str) -> None:
    run, cfg = _build(compose, cache, tmp_path, f"data={kind}", "data.payload.num_samples=8")
    batch = _batch(cfg)
    _assert_real_images(batch, cfg.model.image_token_id)
    if kind == "sample":  # the first two photos: astronaut 512x512, coffee 400x600 (resized to 384x576), 16 px patches
        assert batch["visual_inputs"].image_grid_thw.tolist() == [[1, 32, 32], [1, 24, 36]]
    scan = json.loads((tmp_path / "run" / "data_scan.json").read_text())
    assert scan["skipped_samples"] == 0 and scan.get("samples", 0) == {"sample": 16, "realistic": 8, "mock": 0}[kind]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf", "energon"])
def test_exported_files_train_on_bridge_without_their_bad_sample(bridge, compose, cache: Path, tmp_path: Path,
                                                                 exported: dict, fmt: str) -> None:
    """data.skip_bad_images=true: Bridge reads the good samples only (a filtered copy, or Energon's split exclude)
    and the run directory counts the one dropped."""
    manifest = exported[fmt]
    run, cfg = _build(compose, cache, tmp_path, *manifest["overrides"], "data.skip_bad_images=true")
    (bad,) = manifest["corrupt"]
    if fmt == "energon":
        from megatron.bridge.data.utils import get_dataset_provider

        train, _, _ = get_dataset_provider(cfg.dataset)([16, 0, 0], cfg.dataset)
        batches = [next(train) for _ in range(6)]  # Energon shuffles: which samples come is its choice
        seen = {key for b in batches for key in b["__keys__"]}
        assert bad["id"] not in seen and len(seen) >= 6 and seen <= {p.name for p in PHOTOS}
        assert f"train-shard-000000.tar/{bad['id']}" in Path(cfg.dataset.dataset_kwargs["split_config"]).read_text()
        batch = batches[0]
    else:
        from vlmtrain.data import hf

        source = cfg.dataset.source
        read = hf.load({"path_or_dataset": source.path_or_dataset, "split": source.split,
                        "load_kwargs": source.load_kwargs})
        assert len(read) == len(PHOTOS) - 1
        assert bad["id"] not in read["id"]
        batch = _batch(cfg)
    _assert_real_images(batch, cfg.model.image_token_id)
    scan = json.loads((tmp_path / "run" / "data_scan.json").read_text())
    assert scan["skipped_samples"] == 1 and bad["id"] in scan["skipped"][0]
    from vlmtrain.data import prepare

    assert prepare.skipped_samples(run) == 1


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf", "energon"])
def test_exported_bad_image_fails_the_build_naming_it(bridge, compose, cache: Path, tmp_path: Path, exported: dict,
                                                      fmt: str) -> None:
    from vlmtrain.data.scan import BadSample

    manifest = exported[fmt]
    (bad,) = manifest["corrupt"]
    with pytest.raises(BadSample) as failed:
        _build(compose, cache, tmp_path, *manifest["overrides"])
    message = str(failed.value)
    assert f"{bad['sample']}" in message and bad["image"] in message and "image file is truncated" in message
    assert "data.skip_bad_images=true" in message


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_exported_files_pack(bridge, compose, cache: Path, tmp_path: Path, exported: dict, fmt: str) -> None:
    """data.packing on the user's own files: the bins are built before any GPU work from the copy Bridge reads
    (an hf dataset's data_files is a list of arrow files, which the bins cache key once took for one path)."""
    run, cfg = _build(compose, cache, tmp_path, *exported[fmt]["overrides"], "data.skip_bad_images=true",
                      "data.packing=2048")
    scan = json.loads((tmp_path / "run" / "data_scan.json").read_text())
    assert scan["packing"]["capacity"] == 2048 and scan["packing"]["bins"] >= 1
    assert scan["packing"]["bin_tokens_max"] <= 2048 and Path(cfg.dataset.bins_file).is_file()
