"""Bad data fails before any GPU work and names the sample; skip-and-count mode drops and counts it.

Real files only: the shipped photos, written by `vlmtrain data export` (datasets, Energon) or saved by PIL, with
truncated copies as the corrupt images.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vlmtrain.data import energon, hf, jsonl
from vlmtrain.data.export import export
from vlmtrain.data.photos import PHOTOS, load_photo
from vlmtrain.data.scan import BadSample, check_image

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def user_data(tmp_path: Path) -> Path:
    """A user's JSONL + image folder: two real photos, one missing file, one truncated (corrupt) JPEG."""
    images = tmp_path / "images"
    images.mkdir()
    for p in PHOTOS[:2]:
        load_photo(p).save(images / f"{p.name}.jpg")
    good = (images / f"{PHOTOS[0].name}.jpg").read_bytes()
    (images / "broken.jpg").write_bytes(good[: len(good) // 3])
    rows = [
        {"id": "ok-1", "image": f"{PHOTOS[0].name}.jpg", "prompt": "What is shown?", "answer": PHOTOS[0].caption},
        {"id": "missing", "image": "nope.jpg", "prompt": "What is shown?", "answer": "x"},
        {"id": "corrupt", "image": "broken.jpg", "prompt": "What is shown?", "answer": "y"},
        {
            "id": "ok-2",
            "conversation": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": f"{PHOTOS[1].name}.jpg"},
                        {"type": "text", "text": "Describe."},
                    ],
                },
                {"role": "assistant", "content": [{"type": "text", "text": PHOTOS[1].caption}]},
            ],
        },
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> dict[str, dict]:
    """Each format of the shipped photos with the last two images truncated."""
    root = tmp_path_factory.mktemp("exports")
    return {fmt: export(fmt, root / fmt, corrupt=2, cache=cache) for fmt in ("jsonl", "parquet", "hf", "energon")}


def test_one_checker_decodes_fully(tmp_path: Path) -> None:
    """A truncated JPEG or PNG opens (its header is intact) but fails to decode: the checker decodes it all."""
    photo = load_photo(PHOTOS[0])
    for fmt in ("JPEG", "PNG"):
        buf = io.BytesIO()
        photo.save(buf, format=fmt)
        data = buf.getvalue()
        assert check_image(data) == (None, 256)  # 512x512 px = 16x16 tokens of 32 px
        why, tokens = check_image(data[: len(data) // 3])
        assert tokens == 0 and why.startswith("unreadable (OSError") and "truncated" in why
    assert check_image(tmp_path / "nope.jpg") == ("file not found", 0)


def test_missing_image_names_the_sample(user_data: Path, tmp_path: Path) -> None:
    report = jsonl.scan(user_data, str(user_data.parent / "images"), tmp_path / "cache", seq_length=4096)
    with pytest.raises(BadSample, match=r"train.jsonl: line 2 \(id missing\), file .*nope.jpg: file not found"):
        report.enforce(skip_bad=False)


def test_skip_bad_drops_and_counts(user_data: Path, tmp_path: Path) -> None:
    report = jsonl.scan(user_data, str(user_data.parent / "images"), tmp_path / "cache", seq_length=4096)
    report.enforce(skip_bad=True)
    rows = [json.loads(line) for line in Path(report.output).read_text().splitlines()]
    assert [r["id"] for r in rows] == ["ok-1", "ok-2"]
    problems = {p.ref: p for p in report.bad}
    assert set(problems) == {2, 3} and (report.samples, report.images) == (4, 4)
    assert problems[2].file.endswith("nope.jpg") and problems[2].reason == "file not found"
    assert problems[3].file.endswith("broken.jpg") and "truncated" in problems[3].reason
    assert all(Path(r["conversation"][0]["content"][0]["image"]).is_absolute() for r in rows)


def test_scan_is_cached_until_a_file_changes(user_data: Path, tmp_path: Path) -> None:
    """A second scan reads the cached report; fixing the broken image makes the next scan decode it again."""
    images = user_data.parent / "images"
    first = jsonl.scan(user_data, str(images), tmp_path / "cache", seq_length=4096)
    (cached,) = (tmp_path / "cache" / "scan").glob("jsonl-*.json")
    stamp = cached.stat().st_mtime_ns
    assert jsonl.scan(user_data, str(images), tmp_path / "cache", seq_length=4096) == first
    assert cached.stat().st_mtime_ns == stamp
    (images / "broken.jpg").write_bytes((images / f"{PHOTOS[0].name}.jpg").read_bytes())
    again = jsonl.scan(user_data, str(images), tmp_path / "cache", seq_length=4096)
    assert [p.ref for p in again.bad] == [2]


def test_sequence_too_short_for_image_tokens(user_data: Path, tmp_path: Path) -> None:
    report = jsonl.scan(user_data, str(user_data.parent / "images"), tmp_path / "cache", seq_length=128)
    with pytest.raises(BadSample, match=r"line 1 \(id ok-1\): its images need 256 tokens but train.seq_length=128"):
        report.enforce(skip_bad=False)


def test_nonexistent_dataset_path_fails_in_preflight(compose) -> None:
    from vlmtrain.check import preflight
    from vlmtrain.config.resolve import resolve

    run = compose("data=jsonl", "data.path=/no/such/train.jsonl")
    found = {f.rule: f.message for f in preflight.check(run, resolve(run))}
    assert "does not exist" in found["data_path_exists"]


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_datasets_formats_name_row_and_image_and_filter(exported: dict, cache: Path, fmt: str) -> None:
    """parquet (to_parquet) and hf (save_to_disk): every row's Image feature decoded; the skip copy drops the rows."""
    m = exported[fmt]
    src = hf.source(fmt, m["path"], "train", "rdr", "Describe this image.")
    report = hf.scan(fmt, m["path"], src, cache, seq_length=4096)
    assert (report.samples, report.images) == (len(PHOTOS), len(PHOTOS))
    for bad, line in zip(m["corrupt"], report.lines(), strict=True):
        assert line.startswith(f"{m['path']}: row {bad['ref']} (id {bad['id']}), file {bad['image']}: unreadable "
                               "(OSError: image file is truncated")
    kept = hf.load(hf.without_bad(fmt, src, report, cache))
    assert len(kept) == len(PHOTOS) - 2 and not {b["id"] for b in m["corrupt"]} & set(kept["id"])


def test_energon_names_shard_key_and_excludes_through_split_config(exported: dict, cache: Path) -> None:
    m = exported["energon"]
    report = energon.scan(Path(m["path"]), cache, seq_length=4096)
    assert [p.ref for p in report.bad] == [b["ref"] for b in m["corrupt"]]
    assert all("train-shard-000000.tar" in p.file and "truncated" in p.reason for p in report.bad)
    kwargs = energon.excluding(Path(m["path"]), report.bad_refs, cache)
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    meta = WebdatasetMeta.from_config(EPath(m["path"]), split_part="train", split_config=kwargs["split_config"])
    assert meta.sample_excludes == {b["ref"] for b in m["corrupt"]}


def _check(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlmtrain.cli", "data", "check", *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf", "energon"])
def test_data_check_lists_every_bad_sample(exported: dict, cache: Path, tmp_path: Path, fmt: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`vlmtrain data check` in this process (cli.main); test_data_check_passes_clean_data runs the command."""
    from vlmtrain import cli

    m = exported[fmt]
    status = cli.main(["data", "check", *m["overrides"], f"data.cache_dir={tmp_path}"])
    done = capsys.readouterr()
    assert status == 1, done.err
    lines = done.out.strip().splitlines()
    assert len(lines) == 3
    for bad, line in zip(m["corrupt"], lines, strict=False):
        assert line.startswith(f"{m['path']}: {bad['sample']} (id {bad['id']})" if fmt != "energon" else
                               f"{m['path']}: {bad['sample']}, file ")
        assert bad["image"] in line and "image file is truncated" in line
    assert lines[-1] == f"data={fmt} {m['path']}: {len(PHOTOS)} samples, {len(PHOTOS)} images, 2 bad"


def test_data_check_passes_clean_data(cache: Path, tmp_path: Path) -> None:
    m = export("parquet", tmp_path / "clean", cache=cache)
    done = _check(*m["overrides"], f"data.cache_dir={tmp_path / 'cache'}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [f"data=parquet {m['path']}: {len(PHOTOS)} samples, {len(PHOTOS)} "
                                                "images, 0 bad"]


def test_launcher_refuses_bad_data_before_torchrun(exported: dict, tmp_path: Path) -> None:
    """The local launch path scans in train.py's own process: status 2 naming the row, and no rank was started."""
    m = exported["parquet"]
    done = subprocess.run([sys.executable, "train.py", *m["overrides"], f"data.cache_dir={tmp_path / 'cache'}",
                           "dry_run=false", "gpus_per_node=1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{m['path']}: row {m['corrupt'][0]['ref']} (id {m['corrupt'][0]['id']})" in done.stderr
    assert not (tmp_path / "run" / "ranks.log").exists()
