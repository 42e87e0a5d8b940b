"""The rows a run's data fills, known before any GPU work: every sample's exact length (what Bridge's Qwen collate
makes of it: vlmtrain.data.bins, cached), one row per sample unpacked, the greedy bins at a capacity packed.

The data stage checks each sample against its row (`fit`, `bin_source`). The defaults, preflight and the dry-run
plan count the rows of a run's training and held-out samples (`Lengths`, from vlmtrain.data.prepare.lengths)
against one global batch and one evaluation batch, so a run whose epoch is less than one step is settled otherwise
or refused before it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.config.groups.data import cache_dir
from vlmtrain.data import bins

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig
    from vlmtrain.data.scan import Report


@dataclass(frozen=True)
class Lengths:
    """The exact token lengths of the samples a run trains on and holds out, in the order Bridge reads them."""

    train: tuple[int, ...]
    held_out: tuple[int, ...] = ()

    @property
    def longest(self) -> int:
        return max(self.train + self.held_out)

    def rows(self, capacity: int | None, align: int = 1) -> tuple[int, int]:
        """(training rows, held-out rows): one per sample without a capacity, else the data stage's bins (a sample
        longer than the capacity raises SampleTooLong, naming it)."""
        if not capacity:
            return len(self.train), len(self.held_out)
        return (len(bins.greedy_bins(list(self.train), capacity, align=align)),
                len(bins.greedy_bins(list(self.held_out), capacity, align=align)))

    def fullest(self, capacity: int, align: int = 1) -> int:
        """The most training samples one of the data stage's bins at `capacity` holds."""
        return max(map(len, bins.greedy_bins(list(self.train), capacity, align=align)))


def identity(report: Report, source: dict[str, Any]) -> dict[str, Any]:
    """What the samples' lengths depend on: the source, the files the scan read and the checked copy Bridge reads
    (size, mtime), and the processor."""
    from vlmtrain.data import processor

    stamps = dict(report.files)
    for files in source.get("load_kwargs", {}).get("data_files", {}).values():  # the checked copy Bridge reads
        for path in [files] if isinstance(files, str) else files:  # a split's files: one path or a list (data=hf)
            st = Path(path).stat()
            stamps[str(path)] = [st.st_size, st.st_mtime_ns]
    return {"source": source, "files": stamps, "processor": processor.PROCESSOR_VERSION}


def source_lengths(run: RunConfig, report: Report, source: dict[str, Any], proc: str) -> tuple[list[int], list[str]]:
    """Every sample's length and name in the source Bridge reads (`proc`: the processor dir), cached."""
    return bins.sample_lengths(cache_dir(run), identity(report, source), source, proc)


def bin_source(run: RunConfig, res: Resolved, report: Report, source: dict[str, Any], proc: str) -> bins.Bins:
    """The bins at the packing capacity of the samples Bridge reads from `source`, each sample's segment aligned
    to res.pack_align, saved in the data cache for the ranks."""
    out = bins.prepare_bins(cache_dir(run), identity(report, source), source, proc, res.packing_capacity,
                            report.dataset, res.pack_align)
    print(f"[vlmtrain] data.packing={out.capacity}: {out.summary()}", flush=True)
    return out


def fit(run: RunConfig, report: Report, source: dict[str, Any], proc: str) -> dict[str, int] | None:
    """Without packing a sample is one row of train.seq_length tokens, and Bridge silently cuts a longer one: refuse
    it naming it (packing's message, vlmtrain.data.bins.refuse_longer), or with data.truncate_long_samples=true
    count the samples and tokens cut ({"samples", "tokens"}; None when not opted in)."""
    seq = run.train.seq_length
    lengths, names = source_lengths(run, report, source, proc)
    if not run.data.truncate_long_samples:
        bins.refuse_longer(lengths, seq, [f"{report.dataset}: {n}" for n in names],
                           f"train.seq_length={seq} with data.packing=false (one sample per row)",
                           "Raise train.seq_length to at least {n}, pack (data.packing=<capacity> of at least {n}), "
                           "or set data.truncate_long_samples=true to train on each such sample's first "
                           "train.seq_length tokens (counted in data_scan.json, metrics and the report).")
        return None
    cut = [n - seq for n in lengths if n > seq]
    if cut:
        print(f"[vlmtrain] data.truncate_long_samples=true: {len(cut)} of {len(lengths)} samples are longer than "
              f"train.seq_length={seq}; {sum(cut)} tokens cut", flush=True)
    return {"samples": len(cut), "tokens": sum(cut)}
