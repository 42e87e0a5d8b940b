"""`data=energon`: WebDataset shards prepared for Energon, in the layout Bridge's Qwen-VL task encoder reads.

Layout (`write`, the one Bridge's own converters write): `train-shard-NNNNNN.tar` shards whose samples hold a
pickled list of encoded images (`<key>.jpgs`) and the conversation with `{"type": "image"}` placeholders
(`<key>.json`), indexed by Energon's preparation API (`BaseWebdatasetFactory.prepare_dataset`, the call Bridge's
`prepare_webdataset` makes, used directly so that no Bridge import is needed), plus `.nv-meta/dataset.yaml` naming
Bridge's `ChatMLWebdataset` sample loader (`imgs: jpgs`, `conversation: json`), which the Energon CLI cannot
write because the class is Bridge's.

The scan reads the shards of the run's split as Energon's tar reader groups them (`<shard>/<base name>`, the key
an Energon split config excludes) and checks every image part (`jpg`, `png`, ... and pickled `jpgs` lists). Bad
samples are skipped through Energon's own mechanism, not a copy of the shards: a split config in the data cache
equal to the dataset's plus an `exclude` list of `<shard>/<key>`, passed as `dataset_kwargs={"split_config": ...}`
(Energon resolves it against `<dataset>/.nv-meta/`, and an absolute path stands as is). The shards and the user's
`.nv-meta` stay untouched, and Energon's tar reader never yields an excluded sample.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from vlmtrain.data.scan import Problem, Report, cached, identity_key

META = ".nv-meta"
DATASET_YAML = {
    "__module__": "megatron.bridge.data.energon.task_encoder_utils",
    "__class__": "ChatMLWebdataset",
    "field_map": {"imgs": "jpgs", "conversation": "json"},
    "subflavors": {},
}
#: Parts webdataset's imagehandler decodes (Bridge's ChatMLWebdataset decoder), by their last extension.
IMAGE_PARTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp"})
#: Parts Bridge's videohandler decodes as a pickled list of encoded images.
IMAGE_LIST_PARTS = frozenset({"jpgs"})
SAMPLES_PER_SHARD = 1000


class _PlainData(pickle.Unpickler):
    """Unpickles lists of bytes only (as Bridge's safe_pickle_loads would), never a class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def write(out: Path, samples: Iterable[tuple[str, list[dict[str, Any]], list[bytes]]]) -> None:
    """Shards, Energon index and Bridge sample loader for (key, conversation, encoded images) samples."""
    import webdataset as wds
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    out.mkdir(parents=True, exist_ok=True)
    shards: list[str] = []
    writer = None
    for i, (key, conversation, encoded) in enumerate(samples):
        if i % SAMPLES_PER_SHARD == 0:
            if writer is not None:
                writer.close()
            shards.append(f"train-shard-{len(shards):06d}.tar")
            writer = wds.TarWriter(str(out / shards[-1]))
        writer.write({"__key__": key, "jpgs": pickle.dumps(list(encoded)), "json": json.dumps(conversation).encode()})
    if writer is None:
        raise ValueError(f"no samples to write into {out}")
    writer.close()
    BaseWebdatasetFactory.prepare_dataset(out, shards, split_parts_patterns=[("train", r"train-shard-.*")],
                                          shuffle_seed=None, workers=1)
    (out / META / "dataset.yaml").write_text(yaml.safe_dump(DATASET_YAML, sort_keys=False))


def _split_file(root: Path) -> Path:
    return root / META / ("split.yaml" if (root / META / "split.yaml").is_file() else "split.json")


def _samples(shard: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(base name, {part: bytes}) per sample, grouped as Energon's tar reader groups members."""
    from megatron.energon.flavors.webdataset.config import skip_meta_re, split_name_re

    base, parts = None, {}
    with tarfile.open(shard, "r:*") as tar:
        for member in tar:
            if not member.isreg() or skip_meta_re.match(member.name) or not (m := split_name_re.match(member.name)):
                continue
            if m.group(1) != base:
                if parts:
                    yield base, parts
                base, parts = m.group(1), {}
            parts[m.group(2)] = tar.extractfile(member).read()
    if parts:
        yield base, parts


def _images(shard: Path, base: str, parts: dict[str, bytes]) -> list[tuple[bytes, str]]:
    found = []
    for part, data in parts.items():
        ext = part.rsplit(".", 1)[-1].lower()
        if ext in IMAGE_PARTS:
            found.append((data, f"{shard}: {base}.{part}"))
        elif ext in IMAGE_LIST_PARTS:
            items = _PlainData(io.BytesIO(data)).load()
            found += [(item, f"{shard}: {base}.{part}[{j}]") for j, item in enumerate(items)]
    return found


def scan(root: Path, cache: Path, seq_length: int, split: str = "train") -> Report:
    """The (cached) scan of every sample of the split (samples the dataset already excludes left out)."""
    root = Path(root).expanduser().resolve()

    def run() -> Report:
        from megatron.energon.epathlib import EPath
        from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

        meta = WebdatasetMeta.from_config(EPath(root), split_part=split)
        report = Report("energon", str(root))
        for f in sorted((root / META).glob("*.y*ml")) + sorted((root / META).glob("*.json")):
            report.track(f)
        for shard in meta.shards:
            path = root / shard.name
            report.track(path)
            for base, parts in _samples(path):
                key = f"{shard.name}/{base}"
                if key in meta.sample_excludes:
                    continue
                try:
                    found = _images(path, base, parts)
                except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
                    report.samples += 1
                    report.bad.append(Problem(key, f"sample {key}", f"image list unreadable ({e})", str(path)))
                    continue
                report.add(key, f"sample {key}", found, seq_length)
        return report

    return cached(cache, {"kind": "energon", "path": str(root), "split": split, "seq_length": seq_length}, run)


def excluding(root: Path, bad: Iterable[int | str], cache: Path) -> dict[str, Any]:
    """`EnergonDatasetConfig.dataset_kwargs` that make Energon skip the `bad` samples (a scan report's bad_refs, of
    every split the run reads: one exclude list covers them all; see the module)."""
    root = Path(root).expanduser().resolve()
    splits = yaml.safe_load(_split_file(root).read_text())
    splits["exclude"] = [*splits.get("exclude", []), *sorted(str(ref) for ref in bad)]
    out = cache / "energon" / f"split-{identity_key({'path': str(root), 'splits': splits})}.yaml"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(splits, sort_keys=False))
    return {"split_config": str(out)}
