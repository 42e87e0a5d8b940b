"""The held-out samples of a run (data.validation, data.validation_fraction): the split and its sizes.

`data.validation_fraction=f` holds out round(f x n) of the n samples Bridge would train on (at least one, never
all): those whose position's salted SHA-256 is smallest. It depends on nothing but n and f, so every run of the
same data holds out the same samples (no seed, no data order from a shuffle), and a held-out sample is never in the
training copy. The split writes two copies in the data cache: JSONL lines for the JSONL kinds (sample, realistic,
jsonl: each copy's `sample_index` renumbered to its own rows), parquet rows through `datasets` for parquet and hf
(as the bad-sample filter writes them).

`count()` is the cheap sample count preflight compares with one evaluation batch (file metadata, no decoding);
the data stage checks the exact size after the scan again (`require_batch`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from vlmtrain.data.sample_ids import KEY
from vlmtrain.data.scan import BadSample, identity_key

SALT = "vlmtrain-validation"


def held_out_count(n: int, fraction: float) -> int:
    """Samples held out of n: round(fraction x n), at least 1 and at most n - 1 (0 when n < 2)."""
    return 0 if n < 2 else min(max(round(fraction * n), 1), n - 1)


def held_out(n: int, fraction: float) -> list[int]:
    """The held-out positions among n samples, ascending: the held_out_count smallest salted hashes."""
    def rank(i: int) -> str:
        return hashlib.sha256(f"{SALT}:{i}".encode()).hexdigest()

    return sorted(sorted(range(n), key=rank)[: held_out_count(n, fraction)])


def split_jsonl(path: Path, fraction: float, out_dir: Path) -> tuple[Path, Path]:
    """(training copy, held-out copy) of a checked JSONL copy, each row's sample_index its row in its own copy."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    st = Path(path).stat()
    key = identity_key({"path": str(path), "stamp": [st.st_size, st.st_mtime_ns], "fraction": fraction})
    train, val = out_dir / f"{Path(path).stem}-train-{key}.jsonl", out_dir / f"{Path(path).stem}-val-{key}.jsonl"
    if train.is_file() and val.is_file():
        return train, val
    out = set(held_out(len(lines), fraction))
    for dest, keep in ((train, False), (val, True)):
        rows = [json.loads(ln) for i, ln in enumerate(lines) if (i in out) == keep]
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({**r, KEY: j}) + "\n" for j, r in enumerate(rows)))
        tmp.replace(dest)
    return train, val


def split_rows(src: dict[str, Any], fraction: float, out_dir: Path,
               files: dict[str, list[int]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training, held-out) sources: parquet copies of an HF source's rows (parquet, hf), written once per source,
    fraction and state of the `files` it was scanned from (a scan report's files: path -> [size, mtime])."""
    from vlmtrain.data import hf

    key = identity_key({"source": src, "fraction": fraction, "files": files})
    paths = out_dir / f"train-{key}.parquet", out_dir / f"val-{key}.parquet"
    r = hf.resolved(src)
    if not all(p.is_file() for p in paths):
        ds = hf.load(src)
        out = set(held_out(len(ds), fraction))
        out_dir.mkdir(parents=True, exist_ok=True)
        for dest, keep in zip(paths, (False, True), strict=True):
            tmp = dest.with_suffix(".tmp")
            ds.select([i for i in range(len(ds)) if (i in out) == keep]).to_parquet(str(tmp))
            tmp.replace(dest)
    return tuple({"path_or_dataset": "parquet", "split": "train", "load_kwargs": {"data_files": {"train": [str(p)]}},
                  "schema_adapter": r.get("schema_adapter"), "adapter_kwargs": r.get("adapter_kwargs")}
                 for p in paths)  # type: ignore[return-value]


def split_of(path: str, split: str) -> str:
    """The split to read from a held-out hf folder: `validation` of a DatasetDict that has one, else data.split."""
    local = Path(path).expanduser()
    return "validation" if (local / "dataset_dict.json").is_file() and (local / "validation").is_dir() else split


def require_batch(samples: int, batch: int, what: str, unit: str = "samples") -> None:
    """Refuse a validation set that cannot fill one evaluation batch (its samples would repeat inside it);
    `unit`: what a batch counts (samples, or packed rows)."""
    if samples < batch:
        raise BadSample(f"{what} holds {samples} {unit}, fewer than one evaluation batch of {batch} "
                        "(validation.eval_global_batch_size, default train.global_batch_size). Hold out more "
                        "(a larger data.validation_fraction or data.validation file), or evaluate smaller batches "
                        f"with +bridge.validation.eval_global_batch_size=<at most {samples}, a multiple of "
                        "train.micro_batch_size x DP>.")


def count(kind: str, path: str | None, split: str = "train") -> int | None:
    """Samples in a local data source from its metadata (no image decoded); None when unknown (a hub dataset,
    an unreadable file). JSONL: non-blank lines; parquet: the footers' row counts; hf: save_to_disk's Arrow
    files or the data files' rows; energon: the split part's shard counts."""
    p = Path(path).expanduser() if path else None
    if p is None or not p.exists():
        return None
    try:
        if kind in ("jsonl", "sample", "realistic"):
            return sum(1 for ln in p.read_text().splitlines() if ln.strip())
        if kind == "parquet":
            import pyarrow.parquet as pq

            files = sorted(p.glob("*.parquet")) if p.is_dir() else [p]
            return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        if kind == "hf":
            from vlmtrain.data import hf

            return len(hf.load(hf.source("hf", str(p), split_of(str(p), split), None, "")))
        if kind == "energon":
            return _energon_count(p, split)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def _energon_count(root: Path, split: str) -> int:
    """Samples in an Energon dataset's split part; 0 when the dataset has no such part or it has no shards."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    try:
        meta = WebdatasetMeta.from_config(EPath(root.resolve()), split_part=split)
    except (AssertionError, EmptyDatasetError):  # Energon asserts the part exists, raises when it is empty
        return 0
    return sum(s.count for s in meta.shards) - len(meta.sample_excludes)
