"""One scan per data kind, run on CPU before any GPU work: every image is opened and fully decoded here.

A corrupt or missing image would otherwise surface inside a dataloader worker on the GPU node as a bare
`OSError: Truncated File Read` naming nothing. Each kind's scanner (vlmtrain.data.jsonl, .tables, .energon) walks
its samples and hands every sample's images to `Report.add`, which runs the one image checker (`check_image`) and
records the bad samples with the dataset, the sample (line, row index or key), the file and the reason.

Reports are cached in the data cache by what was scanned (`cached`): a report is reused while every file it read
(data files and external images) has the same size and mtime, so a second run does not decode a large dataset again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageFile

from vlmtrain.data.realistic import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS, TOKEN_PX

#: Bump when what a scan checks changes: older cached reports are then ignored.
SCAN_VERSION = 2  # 2: the checked copy's rows carry sample_index (vlmtrain.data.sample_ids)
#: Bad samples quoted in a BadSample error (`vlmtrain data check` lists them all).
QUOTED = 10


class BadSample(ValueError):
    """A sample that cannot be trained on; the message names the dataset, the sample, the file and the fix."""


def check_image(image: Path | bytes) -> tuple[str | None, int]:
    """(None, LLM tokens the image will cost) when it opens and fully decodes, else (why not, 0).

    Decoding with truncated-image loading off whatever a library set: a truncated JPEG must fail here as it would
    fail in Bridge's collate (datasets, qwen_vl_utils and PIL's default all refuse it)."""
    if isinstance(image, Path) and not image.is_file():
        return "file not found", 0
    lenient, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        with Image.open(image if isinstance(image, Path) else io.BytesIO(image)) as im:
            im.load()
            w, h = im.size
    except Exception as e:  # PIL raises many types for truncated/corrupt files
        return f"unreadable ({type(e).__name__}: {e})", 0
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = lenient
    # the tokens Bridge's Qwen collate gives it: its pixel bounds keep every image within 196..980 tokens
    return None, min(max(round(h / TOKEN_PX) * round(w / TOKEN_PX), COLLATE_MIN_TOKENS), COLLATE_MAX_TOKENS)


@dataclass
class Problem:
    """One bad sample: `ref` is what the filters drop (JSONL line, row index, Energon `<shard>/<key>`)."""

    ref: int | str
    sample: str
    """How a person finds it: "line 3 (id x)", "row 14 (id y)", "sample shard-0.tar/key"."""
    reason: str
    file: str | None = None

    def line(self, dataset: str) -> str:
        return f"{dataset}: {self.sample}" + (f", file {self.file}" if self.file else "") + f": {self.reason}"


@dataclass
class Report:
    """What a scan found; also the data manifest the run directory and the metrics read (skipped_samples)."""

    kind: str
    dataset: str
    samples: int = 0
    images: int = 0
    bad: list[Problem] = field(default_factory=list)
    files: dict[str, list[int]] = field(default_factory=dict)
    """Every file the scan read -> [size, mtime_ns]: the report is stale once one changes."""
    output: str | None = None
    """Where the scan wrote the checked copy Bridge reads (JSONL kinds)."""

    def track(self, path: Path) -> None:
        """Remember a file this report depends on."""
        try:
            st = path.stat()
        except OSError:
            return
        self.files[str(path)] = [st.st_size, st.st_mtime_ns]

    def add(self, ref: int | str, sample: str, images: Iterable[tuple[Path | bytes, str | None]],
            seq_length: int) -> bool:
        """Check one sample's images ((pixels or path, file label) pairs); False (and recorded) when it is bad. A
        sample whose images alone need train.seq_length tokens is bad too: truncation would cut image tokens."""
        self.samples += 1
        problem, tokens = None, 0
        for image, label in images:
            self.images += 1
            if isinstance(image, Path):
                self.track(image)
            why, cost = check_image(image)
            tokens += cost
            problem = problem or (why and Problem(ref, sample, why if label else f"image {why}", label))
        if not problem and tokens >= seq_length:
            problem = Problem(ref, sample, f"its images need {tokens} tokens but train.seq_length={seq_length}; "
                              "raise train.seq_length")
        if problem:
            self.bad.append(problem)
        return problem is None

    @property
    def bad_refs(self) -> set[int | str]:
        return {p.ref for p in self.bad}

    def lines(self) -> list[str]:
        return [p.line(self.dataset) for p in self.bad]

    def summary(self) -> str:
        return (f"data={self.kind} {self.dataset}: {self.samples} samples, {self.images} images, "
                f"{len(self.bad)} bad")

    def enforce(self, skip_bad: bool) -> None:
        """Raise BadSample naming the bad samples unless skip_bad; either way say what the run will read."""
        if self.bad and not skip_bad:
            more = f" (the first {QUOTED} of {len(self.bad)})" if len(self.bad) > QUOTED else ""
            raise BadSample("\n  ".join([f"{self.summary()}{more}:", *self.lines()[:QUOTED]]) + "\nFix them, or pass "
                            "data.skip_bad_images=true to drop such samples and count them (`vlmtrain data check` "
                            "with the same data overrides lists every one).")
        if self.samples and len(self.bad) == self.samples:
            raise BadSample(f"{self.summary()}: no usable samples.")
        print(f"[vlmtrain] {self.summary()}" + (f", {len(self.bad)} skipped (data.skip_bad_images=true)"
                                                  if self.bad else ""), flush=True)

    def fresh(self) -> bool:
        """Every file the scan read is unchanged (and the checked copy, if any, still exists)."""
        if self.output and not Path(self.output).is_file():
            return False
        for name, stamp in self.files.items():
            try:
                st = os.stat(name)
            except OSError:
                return False
            if [st.st_size, st.st_mtime_ns] != stamp:
                return False
        return True

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Report:
        raw = json.loads(path.read_text())
        return cls(**{**raw, "bad": [Problem(**p) for p in raw["bad"]]})


def identity_key(identity: dict[str, Any]) -> str:
    """Short stable hash of what determines a scan (or a filtered copy)."""
    return hashlib.sha256(json.dumps({**identity, "v": SCAN_VERSION}, sort_keys=True).encode()).hexdigest()[:16]


def cached(cache_dir: Path, identity: dict[str, Any], scan: Callable[[], Report]) -> Report:
    """The cached report of `identity` while its files are unchanged, else a new scan (then cached)."""
    path = cache_dir / "scan" / f"{identity['kind']}-{identity_key(identity)}.json"
    if path.is_file():
        try:
            report = Report.load(path)
        except (OSError, ValueError, TypeError):
            report = None
        if report is not None and report.fresh():
            return report
    report = scan()
    report.save(path)
    return report
