"""vlmtrain.data on real photos and the real offline Qwen3-VL processor (no mocks, CPU only)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
from PIL import Image

from vlmtrain.config.groups.data import PayloadConfig
from vlmtrain.data import PHOTOS, build_processor, generate, vision_token_ids
from vlmtrain.data.processor import MARKER_FILE
from vlmtrain.data.realistic import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS, TOKEN_PX
from vlmtrain.data.sample import write_sample_dataset

ALLOWED_LICENSE = re.compile(r"CC0|[Pp]ublic domain|No known copyright|CC BY 2\.0")
# Bridge's Qwen collate arguments; sizes inside this range reach the processor unchanged.
MIN_PIXELS, MAX_PIXELS = 200704, 1003520


@pytest.fixture(scope="module")
def processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_processor(tmp_path_factory.mktemp("data") / "processor")


@pytest.fixture(scope="module")
def processor(processor_dir: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(processor_dir), local_files_only=True)


@pytest.fixture(scope="module")
def realistic_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(PayloadConfig(), 200, tmp_path_factory.mktemp("data") / "realistic")


def _rows(jsonl: Path) -> list[dict]:
    return [json.loads(line) for line in jsonl.read_text().splitlines()]


def _image_paths(row: dict) -> list[str]:
    return [part["image"] for turn in row["conversation"] for part in turn["content"] if part["type"] == "image"]


def _tokens_from_file(path: str) -> int:
    with Image.open(path) as image:
        return (image.height // TOKEN_PX) * (image.width // TOKEN_PX)


def test_processor_token_ids_match_qwen3_vl(processor_dir: Path) -> None:
    ids = vision_token_ids(processor_dir)
    assert ids["vision_start_token_id"] == 151652
    assert ids["vision_end_token_id"] == 151653
    assert ids["image_token_id"] == 151655
    assert ids["video_token_id"] == 151656
    assert ids["bos_token_id"] == 151643
    assert ids["eos_token_id"] == 151645
    assert ids["vocab_size"] == 151669


def test_image_processor_uses_qwen3_vl_geometry(processor) -> None:
    assert type(processor).__name__ == "Qwen3VLProcessor"
    for sub in (processor.image_processor, processor.video_processor):
        assert sub.patch_size == 16
        assert sub.merge_size == 2
        assert sub.temporal_patch_size == 2
        assert list(sub.image_mean) == [0.5, 0.5, 0.5]
        assert list(sub.image_std) == [0.5, 0.5, 0.5]


def test_build_processor_is_idempotent(processor_dir: Path) -> None:
    marker = processor_dir / MARKER_FILE
    before = marker.stat().st_mtime_ns
    assert build_processor(processor_dir) == processor_dir
    assert marker.stat().st_mtime_ns == before


def test_chat_template_renders_chatml_with_vision_markers(processor) -> None:
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image", "image": "x.jpg"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ]
    text = processor.apply_chat_template(conversation, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
    )
    prompt = processor.apply_chat_template(conversation[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_sample_dataset_has_real_licensed_photos(tmp_path: Path) -> None:
    jsonl = write_sample_dataset(tmp_path / "sample")
    rows = _rows(jsonl)
    manifest = json.loads((jsonl.parent / "manifest.json").read_text())
    assert len(rows) == len(PHOTOS) >= 10
    assert len({row["id"] for row in rows}) == len(rows)
    for entry in manifest["photos"]:
        assert ALLOWED_LICENSE.search(entry["license"]), entry
        assert len(entry["caption"].split()) >= 5
    for row in rows:
        (path,) = _image_paths(row)
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert min(image.size) >= 150
        assert row["conversation"][1]["content"][0]["text"]
    assert write_sample_dataset(tmp_path / "sample") == jsonl


def test_realistic_is_deterministic_per_seed(tmp_path: Path) -> None:
    def fingerprint(out: Path, seed: int) -> tuple[str, list[str]]:
        jsonl = generate(PayloadConfig(seed=seed), 12, out)
        text = jsonl.read_text().replace(str(out), "<root>")
        images = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for r in _rows(jsonl) for p in _image_paths(r)]
        return text, images

    first = fingerprint(tmp_path / "a", 7)
    assert first == fingerprint(tmp_path / "b", 7)
    assert first != fingerprint(tmp_path / "c", 8)


def test_realistic_is_idempotent(realistic_jsonl: Path) -> None:
    manifest = realistic_jsonl.parent / "manifest.json"
    before = manifest.stat().st_mtime_ns
    assert generate(PayloadConfig(), 200, realistic_jsonl.parent) == realistic_jsonl
    assert manifest.stat().st_mtime_ns == before


def test_realistic_respects_declared_distribution(realistic_jsonl: Path) -> None:
    rows = _rows(realistic_jsonl)
    manifest = json.loads((realistic_jsonl.parent / "manifest.json").read_text())
    dist = PayloadConfig(**manifest["distribution"])
    assert dist == PayloadConfig()
    n = len(rows)
    assert n == 200

    # Images per sample: each count's share within 4 binomial standard deviations of its weight.
    counts = [len(_image_paths(row)) for row in rows]
    for k, weight in enumerate(dist.images_per_sample):
        share = counts.count(k) / n
        assert abs(share - weight) <= 4 * math.sqrt(weight * (1 - weight) / n) + 1e-12, (k, share, weight)
    assert max(counts) < len(dist.images_per_sample)

    # Image tokens measured from the saved files: inside the range and roughly uniform over it.
    tokens = [_tokens_from_file(p) for row in rows for p in _image_paths(row)]
    assert tokens == [img["tokens"] for s in manifest["samples"] for img in s["images"]]
    assert all(COLLATE_MIN_TOKENS <= t <= COLLATE_MAX_TOKENS for t in tokens)
    lo, hi = dist.effective_token_range
    quarter = (hi - lo) / 4
    for q in range(4):
        share = sum(lo + q * quarter <= t < lo + (q + 1) * quarter + (q == 3) for t in tokens) / len(tokens)
        assert 0.15 <= share <= 0.35, (q, share)
    for path in (p for row in rows[:40] for p in _image_paths(row)):
        with Image.open(path) as image:
            assert image.width % TOKEN_PX == 0 and image.height % TOKEN_PX == 0

    # Text lengths hit the requested word counts exactly.
    for row, sample in zip(rows, manifest["samples"], strict=True):
        prompt = row["conversation"][0]["content"][-1]["text"]
        answer = row["conversation"][1]["content"][0]["text"]
        assert len(prompt.split()) == sample["prompt_words"]
        assert dist.prompt_words_min <= sample["prompt_words"] <= dist.prompt_words_max
        assert len(answer.split()) == sample["answer_words"]
        assert dist.answer_words_min <= sample["answer_words"] <= dist.answer_words_max
    assert manifest["realized"]["images_per_sample"]["histogram"] == {
        str(k): counts.count(k) for k in range(len(dist.images_per_sample))
    }


def test_distribution_clamps_and_validates() -> None:
    wide = PayloadConfig(image_tokens_min=16, image_tokens_max=4096, images_per_sample=[0, 1])
    assert wide.effective_token_range == (COLLATE_MIN_TOKENS, COLLATE_MAX_TOKENS)
    assert wide.images_per_sample == [0.0, 1.0]
    with pytest.raises(ValueError, match="images_per_sample"):
        PayloadConfig(images_per_sample=(0.0, 0.0))
    with pytest.raises(ValueError, match="does not overlap"):
        PayloadConfig(image_tokens_min=1000, image_tokens_max=2000)


def test_text_only_and_log_uniform_samples(tmp_path: Path) -> None:
    dist = PayloadConfig(images_per_sample=(0.5, 0.5), token_sampling="log_uniform", seed=1)
    rows = _rows(generate(dist, 16, tmp_path / "mixed"))
    counts = [len(_image_paths(row)) for row in rows]
    assert 0 in counts and 1 in counts


def _check_image_pad_counts(input_ids, rows: list[dict], image_pad_id: int) -> None:
    for row_ids, row in zip(input_ids, rows, strict=True):
        expected = sum(_tokens_from_file(p) for p in _image_paths(row))
        assert int((row_ids == image_pad_id).sum()) == expected, row["id"]


def _rows_via_datasets(jsonl: Path, cache: Path, count: int) -> list[dict]:
    """First multi-image row plus `count - 1` other rows with images, loaded the way Bridge loads json."""
    import datasets

    dataset = datasets.load_dataset("json", data_files={"train": str(jsonl)}, split="train", cache_dir=str(cache))
    rows = [row for row in dataset if _image_paths(row)]
    multi = next(row for row in rows if len(_image_paths(row)) > 1)
    return [multi, *[row for row in rows if row is not multi][: count - 1]]


def test_processor_image_pad_count_matches_saved_size(processor, realistic_jsonl: Path, tmp_path: Path) -> None:
    from qwen_vl_utils import process_vision_info

    rows = _rows_via_datasets(realistic_jsonl, tmp_path / "hf_cache", count=2)
    texts = [processor.apply_chat_template(row["conversation"], tokenize=False) for row in rows]
    images = [process_vision_info(row["conversation"])[0] for row in rows]
    batch = processor(
        text=texts,
        images=images,
        padding=True,
        return_tensors="pt",
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )
    ids = vision_token_ids(Path(processor.tokenizer.name_or_path))
    _check_image_pad_counts(batch["input_ids"], rows, ids["image_token_id"])
    sizes = [Image.open(p).size for row in rows for p in _image_paths(row)]
    assert batch["image_grid_thw"].tolist() == [[1, h // 16, w // 16] for w, h in sizes]


@pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None, reason="megatron.bridge is not installed")
def test_bridge_direct_hf_sft_collates_realistic_rows(processor_dir: Path, realistic_jsonl: Path) -> None:
    """Bridge's own config path: json source -> DirectSFTDataset -> registry-chosen Qwen collate."""
    try:
        from megatron.bridge.data.builders.direct_hf_sft import DirectHFSFTDatasetConfig
        from megatron.bridge.data.sources.hf import HFDatasetSourceConfig
        from megatron.bridge.data.utils import get_dataset_provider
    except (ImportError, OSError) as error:  # OSError: Transformer Engine's shared library is not loadable
        pytest.skip(f"megatron.bridge cannot be imported: {error}")

    config = DirectHFSFTDatasetConfig(
        seq_length=4096,
        hf_processor_path=str(processor_dir),
        source=HFDatasetSourceConfig(
            path_or_dataset="json", split="train", load_kwargs={"data_files": {"train": str(realistic_jsonl)}}
        ),
        do_validation=False,
        do_test=False,
    )
    config.finalize()
    train, _, _ = get_dataset_provider(config)([200, 0, 0], config)
    rows = _rows(realistic_jsonl)
    multi = next(i for i, row in enumerate(rows) if len(_image_paths(row)) > 1)
    picked = [multi, *[i for i, row in enumerate(rows) if _image_paths(row) and i != multi][:3]]
    examples = [train[i] for i in picked]
    assert [example["id"] for example in examples] == [rows[i]["id"] for i in picked]

    batch = train.collate_fn(examples)
    image_pad_id = vision_token_ids(processor_dir)["image_token_id"]
    _check_image_pad_counts(batch["input_ids"], [rows[i] for i in picked], image_pad_id)
    grids = batch["visual_inputs"].image_grid_thw
    sizes = [Image.open(p).size for i in picked for p in _image_paths(rows[i])]
    assert grids.tolist() == [[1, h // 16, w // 16] for w, h in sizes]
    assert batch["visual_inputs"].pixel_values.shape == (int(grids.prod(-1).sum()), 3 * 2 * 16 * 16)
    assert batch["input_ids"].shape[1] % 128 == 0
    # Loss only on the assistant answers: every row has loss tokens, fewer than its non-pad tokens.
    loss_tokens = batch["loss_mask"].sum(-1)
    assert (loss_tokens > 0).all() and (loss_tokens < batch["attention_mask"].sum(-1)).all()
