"""`vlmtrain data export`: the shipped real photos in every data kind's on-disk format, offline, in seconds.

The samples are the very rows `data=sample` (or `data=realistic`) trains on, read from their generated JSONL in the
data cache, so an exported folder feeds the same conversations and JPEG bytes through another loader:

| format  | written with                                   | train with                                        |
|---------|------------------------------------------------|---------------------------------------------------|
| jsonl   | `data.jsonl` + `images/` (relative paths)      | `data=jsonl data.path=<out>/data.jsonl`           |
| parquet | `datasets` `to_parquet`, an `Image` column     | `data=parquet data.path=<out>/data.parquet`       |
| hf      | `datasets` `save_to_disk`, an `Image` column   | `data=hf data.path=<out>`                         |
| energon | WebDataset shards + Energon's prepare          | `data=energon data.path=<out>`                    |

Parquet and hf use the layout of Bridge's `rdr` adapter (`image`, `text`) when every sample has one image (the
sample set), else its `raven` adapter's (`images`, `texts`), trained with `data.schema_adapter=raven`. `corrupt=N`
truncates the first image of the last N samples that have images to a third of its bytes (a real truncated
JPEG); `vlmtrain_export.json` in the folder names them (id, and the sample as the scan reports it).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmtrain.data.jsonl import image_parts

FORMATS = ("jsonl", "parquet", "hf", "energon")
DATASETS = ("sample", "realistic")
MANIFEST = "vlmtrain_export.json"


@dataclass
class Sample:
    id: str
    conversation: list[dict[str, Any]]
    images: list[tuple[str, bytes]]
    """(file name, encoded bytes) of each image part, in order."""


def samples(dataset: str, cache: Path, num_samples: int | None = None) -> list[Sample]:
    """The rows of `data=<dataset>` with their image bytes (sample: the first num_samples photos)."""
    from vlmtrain.config.groups.data import PayloadConfig

    if dataset == "sample":
        from vlmtrain.data.sample import write_sample_dataset

        source = write_sample_dataset(cache / "sample")
    elif dataset == "realistic":
        from vlmtrain.data.realistic import generate

        payload = PayloadConfig(**({"num_samples": num_samples} if num_samples else {}))
        source = generate(payload, payload.num_samples, cache / "realistic")
    else:
        raise ValueError(f"dataset={dataset!r}: choose one of {', '.join(DATASETS)}")
    out = []
    for line in source.read_text().splitlines()[: num_samples or None]:
        row = json.loads(line)
        paths = [Path(part["image"]) for part in image_parts(row["conversation"])]
        out.append(Sample(row["id"], row["conversation"], [(p.name, p.read_bytes()) for p in paths]))
    return out


def _text(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "text", "text": part["text"]}


def _single_image(items: list[Sample]) -> bool:
    """Every sample fits Bridge's rdr adapter: one image, one prompt, one answer."""
    return all(len(s.images) == 1 and len(s.conversation) == 2 for s in items)


def _dataset(items: list[Sample]) -> tuple[Any, str]:
    """A `datasets.Dataset` with the JPEG bytes in `Image` features, and the Bridge schema adapter that reads it.

    Layouts of Bridge's own adapters, because a native `conversation` column cannot carry inline images: Arrow
    gives every content part every struct field, and the Qwen collate takes a text part's `image: None` for an
    image. rdr (`image`, `text`; data.prompt is the prompt) when every sample has one image, else raven
    (`images`, `texts: [{user, assistant}]`)."""
    from datasets import Dataset, Features, Image, List, Value

    def answer(s: Sample) -> str:
        return s.conversation[-1]["content"][0]["text"]

    if _single_image(items):
        features = Features({"id": Value("string"), "image": Image(), "text": Value("string")})
        rows = [{"id": s.id, "image": {"path": s.images[0][0], "bytes": s.images[0][1]}, "text": answer(s)}
                for s in items]
        return Dataset.from_list(rows, features=features), "rdr"
    features = Features({"id": Value("string"), "images": List(Image()),
                         "texts": List({"user": Value("string"), "assistant": Value("string")})})
    rows = [{"id": s.id, "images": [{"path": name, "bytes": data} for name, data in s.images],
             "texts": [{"user": s.conversation[0]["content"][-1]["text"], "assistant": answer(s)}]} for s in items]
    return Dataset.from_list(rows, features=features), "raven"


def _jsonl(out: Path, items: list[Sample]) -> tuple[str, list[str]]:
    (out / "images").mkdir()
    rows = []
    for s in items:
        for (name, data), part in zip(s.images, image_parts(s.conversation), strict=True):
            (out / "images" / name).write_bytes(data)
            part["image"] = f"images/{name}"
        rows.append(json.dumps({"id": s.id, "conversation": s.conversation}) + "\n")
    (out / "data.jsonl").write_text("".join(rows))
    return "data.jsonl", ["data=jsonl"]


def _adapter(adapter: str) -> list[str]:
    return [] if adapter == "rdr" else [f"data.schema_adapter={adapter}"]  # rdr: the parquet and hf default


def _parquet(out: Path, items: list[Sample]) -> tuple[str, list[str]]:
    ds, adapter = _dataset(items)
    ds.to_parquet(str(out / "data.parquet"))
    return "data.parquet", ["data=parquet", *_adapter(adapter)]


def _hf(out: Path, items: list[Sample]) -> tuple[str, list[str]]:
    ds, adapter = _dataset(items)
    ds.save_to_disk(str(out))
    return "", ["data=hf", *_adapter(adapter)]


def _energon(out: Path, items: list[Sample]) -> tuple[str, list[str]]:
    from vlmtrain.data import energon

    placeholders = [[{"role": t["role"], "content": [{"type": "image"} if p["type"] == "image" else _text(p)
                                                     for p in t["content"]]} for t in s.conversation] for s in items]
    energon.write(out, ((s.id, conv, [data for _, data in s.images]) for s, conv in zip(items, placeholders,
                                                                                        strict=True)))
    return "", ["data=energon"]


WRITERS: dict[str, Callable[[Path, list[Sample]], tuple[str, list[str]]]] = {
    "jsonl": _jsonl, "parquet": _parquet, "hf": _hf, "energon": _energon}


def _reference(fmt: str, index: int, sample_id: str) -> dict[str, Any]:
    """How the scan refers to sample `index` of an exported set: JSONL line, row index or Energon `<shard>/<key>`
    (`ref`), and as it prints it (`sample`)."""
    from vlmtrain.data.energon import SAMPLES_PER_SHARD

    if fmt == "jsonl":
        return {"ref": index + 1, "sample": f"line {index + 1}"}
    if fmt == "energon":
        key = f"train-shard-{index // SAMPLES_PER_SHARD:06d}.tar/{sample_id}"
        return {"ref": key, "sample": f"sample {key}"}
    return {"ref": index, "sample": f"row {index}"}


def export(fmt: str, out: Path, dataset: str = "sample", corrupt: int = 0, cache: Path | None = None,
           num_samples: int | None = None) -> dict[str, Any]:
    """Write the set into `out` (replaced if it holds an earlier export, refused if it holds anything else) and
    return its manifest (also written as `out/vlmtrain_export.json`)."""
    if fmt not in WRITERS:
        raise ValueError(f"format={fmt!r}: choose one of {', '.join(FORMATS)}")
    out = Path(out).expanduser().absolute()
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise FileExistsError(f"{out} is not empty and holds no earlier export: pass a new folder.")
        shutil.rmtree(out)
    from vlmtrain.config.groups.data import DataConfig

    items = samples(dataset, Path(cache or DataConfig.cache_dir).expanduser(), num_samples)
    with_images = [i for i, s in enumerate(items) if s.images]
    if corrupt > len(with_images):
        raise ValueError(f"corrupt={corrupt}: the set has only {len(with_images)} samples with images")
    corrupted = with_images[len(with_images) - corrupt:] if corrupt else []
    for i in corrupted:
        name, data = items[i].images[0]
        items[i].images[0] = (name, data[: len(data) // 3])
    out.mkdir(parents=True, exist_ok=True)
    data_file, overrides = WRITERS[fmt](out, items)
    path = out / data_file if data_file else out
    manifest = {
        "format": fmt, "dataset": dataset, "path": str(path), "samples": len(items),
        "images": sum(len(s.images) for s in items), "overrides": [*overrides, f"data.path={path}"],
        "corrupt": [{"id": items[i].id, **_reference(fmt, i, items[i].id), "image": items[i].images[0][0]}
                    for i in corrupted],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
