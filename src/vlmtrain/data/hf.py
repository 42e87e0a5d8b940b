"""`data=parquet` and `data=hf`: what Bridge's HF source loads, scanned row by row without decoding it twice.

`source()` turns data.path into Bridge's `HFDatasetSourceConfig` fields: a parquet file or folder of parquet files
(schema adapter from data.schema_adapter, `rdr` by default: `image` + `text` columns); a folder written by
`datasets.save_to_disk` (Bridge's `load_dataset` refuses those, so its Arrow files go through the `arrow` builder,
which keeps the features, Image columns included); a folder of data files; a Bridge preset or a hub name.

The scan reads the rows as Arrow (images stay undecoded bytes) and finds every image through the dataset's
features: `Image` features anywhere (top-level columns, lists, conversation structs) and string image paths in
native `conversation` rows. With data.skip_bad_images=true Bridge is pointed at a parquet copy in the data cache
without the bad rows (`Dataset.select(...).to_parquet`, keyed by the scan), written once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vlmtrain.data.scan import Report, cached, identity_key

#: Rows per Arrow batch while scanning.
BATCH = 256


def source(kind: str, path: str, split: str, schema_adapter: str | None, prompt: str) -> dict[str, Any]:
    """`HFDatasetSourceConfig` fields for data.path (plain data: it is also the scan cache's identity)."""
    local = Path(path).expanduser()
    adapter = {"schema_adapter": schema_adapter,
               "adapter_kwargs": {"prompt": prompt} if schema_adapter else None}
    if kind == "parquet":
        files = sorted(local.glob("*.parquet")) if local.is_dir() else [local]
        return {"path_or_dataset": "parquet", "split": "train",
                "load_kwargs": {"data_files": {"train": [str(f.resolve()) for f in files]}}, **adapter}
    if (local / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk: one folder per split
        local = local / split
    if (local / "state.json").is_file():
        import json

        arrow = [str((local / f["filename"]).resolve()) for f in json.loads((local / "state.json").read_text())
                 ["_data_files"]]
        return {"path_or_dataset": "arrow", "split": "train", "load_kwargs": {"data_files": {"train": arrow}},
                **adapter}
    if local.exists():
        return {"path_or_dataset": str(local.resolve()), "split": split, **adapter}
    from megatron.bridge.data.sources.hf import _HF_DATASET_PRESETS

    if path in _HF_DATASET_PRESETS:  # a preset owns its adapter
        return {"dataset_name": path, "split": split}
    return {"path_or_dataset": path, "split": split, **adapter}


def resolved(src: dict[str, Any]) -> dict[str, Any]:
    """A preset's physical source through Bridge's own resolver; other sources are already physical."""
    if "dataset_name" not in src:
        return src
    from dataclasses import asdict

    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig, resolve_hf_dataset_source

    return asdict(resolve_hf_dataset_source(HFDatasetSourceConfig(**src)))


def load(src: dict[str, Any]) -> Any:
    """The split Bridge's `load_hf_dataset_source` loads: the same `datasets.load_dataset` call."""
    from datasets import load_dataset

    r = resolved(src)
    return load_dataset(r["path_or_dataset"], r.get("subset"), split=r["split"], **(r.get("load_kwargs") or {}))


def _data_files(src: dict[str, Any]) -> list[Path]:
    """Local files the source reads (the scan is stale once one changes); none for hub datasets."""
    files = (src.get("load_kwargs") or {}).get("data_files", {}).get("train")
    if files:
        return [Path(f) for f in files]
    local = Path(src.get("path_or_dataset") or "")
    return sorted(p for p in local.rglob("*") if p.is_file()) if "path_or_dataset" in src and local.is_dir() else []


def local(src: dict[str, Any]) -> bool:
    """The source reads files on this machine (else a hub dataset)."""
    return bool(_data_files(src)) or ("path_or_dataset" in src and Path(src["path_or_dataset"]).exists())


def _local(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


def images(feature: Any, value: Any) -> Iterator[tuple[Path | bytes, str | None]]:
    """Every image in an undecoded row value, guided by its feature: (bytes or path, file name if known)."""
    from datasets import Image

    if value is None:
        return
    if isinstance(feature, Image):
        if value.get("bytes") is not None:
            yield value["bytes"], value.get("path")
        elif value.get("path"):
            yield _local(value["path"]), value["path"]
        return
    if isinstance(feature, dict):  # Features, struct columns, conversation turns and parts
        if value.get("type") == "image" and isinstance(value.get("image"), str):
            yield _local(value["image"]), value["image"]
        for key, sub in feature.items():
            yield from images(sub, value.get(key))
        return
    inner = feature[0] if isinstance(feature, list) else getattr(feature, "feature", None)
    if inner is not None and isinstance(value, list):
        for item in value:
            yield from images(inner, item)


def scan(kind: str, dataset: str, src: dict[str, Any], cache: Path, seq_length: int) -> Report:
    """The (cached) scan of every row of the source's split; `dataset` (data.path) names it in the report."""
    files = _data_files(src)

    def run() -> Report:
        ds = load(src)
        report = Report(kind, dataset)
        for f in files:
            report.track(f)
        rows = ds.with_format("arrow")
        for start in range(0, len(ds), BATCH):
            for index, row in enumerate(rows[start : start + BATCH].to_pylist(), start):
                name = row.get("id")
                sample = f"row {index}" + (f" (id {name})" if isinstance(name, str | int) else "")
                report.add(index, sample, images(ds.features, row), seq_length)
        return report

    return cached(cache, {"kind": kind, "dataset": dataset, "source": src, "seq_length": seq_length}, run)


def without_bad(kind: str, src: dict[str, Any], report: Report, cache: Path) -> dict[str, Any]:
    """The source of a parquet copy of the split without the report's bad rows (written once per scan)."""
    r = resolved(src)
    bad = report.bad_refs
    out = cache / kind / f"filtered-{identity_key({'source': src, 'bad': sorted(bad), 'files': report.files})}.parquet"
    if not out.is_file():
        ds = load(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        ds.select([i for i in range(len(ds)) if i not in bad]).to_parquet(str(tmp))
        tmp.replace(out)
    return {"path_or_dataset": "parquet", "split": "train", "load_kwargs": {"data_files": {"train": [str(out)]}},
            "schema_adapter": r.get("schema_adapter"), "adapter_kwargs": r.get("adapter_kwargs")}
