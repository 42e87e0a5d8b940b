"""An unpacked sample longer than train.seq_length on real files (the shipped photos written by `vlmtrain data
export`, plus one row with a real photo and a long answer): refused before GPU work naming it with packing's
message (one check: vlmtrain.data.bins.refuse_longer), or with data.truncate_long_samples=true trained cut and counted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain.config.resolve import resolve
from vlmtrain.data import prepare, rows
from vlmtrain.data.bins import SampleTooLong, refuse_longer
from vlmtrain.data.export import export

SEQ = 2048


@pytest.fixture(scope="module")
def long_jsonl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(jsonl, data cache): the exported photos and one more row of ~3000 answer words."""
    cache = tmp_path_factory.mktemp("cache")
    manifest = export("jsonl", tmp_path_factory.mktemp("export") / "jsonl", cache=cache)
    path = Path(manifest["path"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    long = json.loads(json.dumps(rows[0]))  # the first photo row again, its answer made long
    long["id"] = "long-answer"
    long["conversation"][-1]["content"] = [{"type": "text", "text": " ".join(["mountain lake"] * 1500)}]
    rows.insert(1, long)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, cache


def _run(compose, long_jsonl, tmp_path: Path, *overrides: str):
    path, cache = long_jsonl
    return compose("data=jsonl", f"data.path={path}", f"data.cache_dir={cache}", f"train.seq_length={SEQ}",
                   *overrides, output_dir=str(tmp_path / "run"))


def test_refusal_names_the_sample_its_length_and_the_fixes():
    with pytest.raises(SampleTooLong) as err:
        refuse_longer([100, 5000, 6000], 4096, ["d: a", "d: b", "d: c"], "train.seq_length=4096", "Raise to {n}.")
    assert str(err.value) == ("d: b is 5000 tokens long but train.seq_length=4096 (2 of 3 samples are longer than "
                              "4096). Raise to 5000.")


def test_long_unpacked_sample_is_refused_before_gpu_work(compose, long_jsonl, tmp_path: Path) -> None:
    path, _ = long_jsonl
    run = _run(compose, long_jsonl, tmp_path)
    with pytest.raises(SampleTooLong) as err:
        prepare.prepare(run, resolve(run))
    msg = str(err.value)
    assert f"{path}: sample 1 (id long-answer) is " in msg and f"train.seq_length={SEQ} with data.packing=false" in msg
    for fix in ("Raise train.seq_length to at least", "data.packing=<capacity>", "data.truncate_long_samples=true"):
        assert fix in msg
    assert int(msg.split(" is ")[1].split(" tokens")[0]) > SEQ


def test_truncation_opt_in_is_counted(compose, long_jsonl, tmp_path: Path) -> None:
    from vlmtrain.data.bins import sample_lengths

    run = _run(compose, long_jsonl, tmp_path, "data.truncate_long_samples=true")
    prepared = prepare.prepare(run, resolve(run))
    scan = json.loads((tmp_path / "run" / prepare.SCAN_FILE).read_text())
    source = prepared.hf_source
    lengths, _ = sample_lengths(long_jsonl[1], rows.identity(prepared.report, source), source,
                                str(prepare.processor_dir(run)))
    assert scan["truncated_samples"] == 1 == prepare.scan_count(run, "truncated_samples")
    assert scan["truncated_tokens"] == lengths[1] - SEQ > 0
    assert all(n <= SEQ for i, n in enumerate(lengths) if i != 1)


def test_default_runs_record_no_truncation(compose, long_jsonl, tmp_path: Path) -> None:
    """The shipped sample fits its default seq_length: no refusal, data_scan.json as before (no truncation keys)."""
    _, cache = long_jsonl
    run = compose(f"data.cache_dir={cache}", output_dir=str(tmp_path / "run"))
    prepare.prepare(run, resolve(run))
    assert "truncated_samples" not in json.loads((tmp_path / "run" / prepare.SCAN_FILE).read_text())
