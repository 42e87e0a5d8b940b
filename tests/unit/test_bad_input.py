"""Bad data fails before any GPU work and names the sample; skip-and-count mode drops and counts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain.data import jsonl
from vlmtrain.data.photos import PHOTOS, load_photo


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


def test_missing_image_names_the_sample(user_data: Path, tmp_path: Path):
    with pytest.raises(jsonl.BadSample, match=r"train.jsonl:2 \(sample missing\).*nope.jpg: file not found"):
        jsonl.resolve(user_data, str(user_data.parent / "images"), tmp_path / "out", seq_length=4096)


def test_skip_bad_drops_and_counts(user_data: Path, tmp_path: Path):
    out = jsonl.resolve(user_data, str(user_data.parent / "images"), tmp_path / "out", seq_length=4096, skip_bad=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["ok-1", "ok-2"]
    report = json.loads(out.with_suffix(".report.json").read_text())
    problems = {s["sample"]: s["problem"] for s in report["skipped"]}
    assert set(problems) == {"missing", "corrupt"}
    assert problems["missing"].endswith("nope.jpg: file not found")
    assert "broken.jpg: unreadable" in problems["corrupt"] and "truncated" in problems["corrupt"]
    assert all(Path(r["conversation"][0]["content"][0]["image"]).is_absolute() for r in rows)


def test_sequence_too_short_for_image_tokens(user_data: Path, tmp_path: Path):
    with pytest.raises(jsonl.BadSample, match=r"sample ok-1\).*tokens but train.seq_length=128"):
        jsonl.resolve(user_data, str(user_data.parent / "images"), tmp_path / "out", seq_length=128, skip_bad=False)


def test_nonexistent_dataset_path_fails_in_preflight(compose):
    from vlmtrain import preflight

    found = {f.rule: f.message for f in preflight.check(compose("data=jsonl", "data.path=/no/such/train.jsonl"))}
    assert "does not exist" in found["data_path_exists"]
