"""Realistic VLM payloads: real photos cropped and resized to a declared image-token and text-length mix.

Mock VLM data uses one noise image of one size; this generator controls what drives cost and balance in
training: image tokens per image, images per sample and text length.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vlmtrain.config.groups.data import PayloadConfig
from vlmtrain.config.tokens import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS, TOKEN_PX
from vlmtrain.data.photos import PHOTOS, Photo, load_photo
from vlmtrain.data.sample import (
    IMAGES_DIR,
    JPEG_QUALITY,
    JSONL_FILE,
    MANIFEST_FILE,
    build_atomically,
    conversation_row,
    manifest_matches,
    write_jsonl,
)

#: Bump when sampling or encoding changes; it is part of the idempotency key.
GENERATOR_VERSION = 1


def dataset_key(dist: PayloadConfig, n_samples: int) -> str:
    """Hash of everything that determines the output (distribution, size, photo pool, generator version)."""
    identity = {
        "distribution": dist.identity(),
        "n_samples": n_samples,
        "photos": [photo.name for photo in PHOTOS],
        "version": GENERATOR_VERSION,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _token_grid(target: int, aspect: float, lo: int, hi: int) -> tuple[int, int]:
    """Token grid (rows, cols) with rows/cols close to `aspect` (h/w) and rows*cols close to `target`."""
    rows = max(1, round(math.sqrt(target * aspect)))
    cols = max(1, round(target / rows))
    while rows * cols > hi:
        rows, cols = (rows - 1, cols) if rows > cols else (rows, cols - 1)
    while rows * cols < lo:
        rows, cols = (rows + 1, cols) if rows < cols else (rows, cols + 1)
    return rows, cols


def _render_image(source: Image.Image, rng: np.random.Generator, dist: PayloadConfig) -> Image.Image:
    """Random crop of `source` at a random aspect ratio, resized to a whole number of 32x32 token tiles."""
    lo, hi = dist.effective_token_range
    if dist.token_sampling == "log_uniform":
        target = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    else:
        target = rng.uniform(lo, hi)
    log_r = math.log(dist.aspect_ratio_max)
    aspect = math.exp(rng.uniform(-log_r, log_r))  # crop height / width
    width, height = source.size
    # Largest crop of that aspect ratio inside the photo, then shrink it to 50-100 % of its side length.
    crop_h, crop_w = (height, height / aspect) if aspect >= height / width else (width * aspect, width)
    scale = rng.uniform(0.5, 1.0)
    crop_h, crop_w = max(1.0, crop_h * scale), max(1.0, crop_w * scale)
    top = rng.uniform(0, height - crop_h)
    left = rng.uniform(0, width - crop_w)
    rows, cols = _token_grid(round(target), crop_h / crop_w, lo, hi)
    box = (left, top, left + crop_w, top + crop_h)
    return source.resize((cols * TOKEN_PX, rows * TOKEN_PX), Image.Resampling.BICUBIC, box=box)


def _words(rng: np.random.Generator, pool: list[str], lead: str, count: int) -> str:
    """Exactly `count` words: `lead`'s words first, then random words from `pool`."""
    words = lead.split()[:count]
    words += [pool[i] for i in rng.integers(0, len(pool), size=count - len(words))]
    return " ".join(words)


def _summary(values: list[int] | list[float]) -> dict[str, float]:
    """Mean/min/max/percentiles of a list (zeros when empty)."""
    if not values:
        return {"count": 0, "mean": 0.0, "min": 0, "max": 0, "p50": 0.0, "p90": 0.0}
    array = np.asarray(values, dtype=np.float64)
    return {
        "count": len(values),
        "mean": round(float(array.mean()), 2),
        "min": int(array.min()),
        "max": int(array.max()),
        "p50": round(float(np.percentile(array, 50)), 2),
        "p90": round(float(np.percentile(array, 90)), 2),
    }


def _realized(samples: list[dict[str, Any]], dist: PayloadConfig) -> dict[str, Any]:
    """Statistics measured from what was written (token counts from saved sizes as (h//32)*(w//32))."""
    counts = [len(s["images"]) for s in samples]
    tokens = [image["tokens"] for s in samples for image in s["images"]]
    lo, hi = dist.effective_token_range
    edges = np.linspace(lo, hi + 1, 9).round().astype(int)
    histogram, _ = np.histogram(tokens, bins=edges)
    count_hist = Counter(counts)
    n = max(1, len(samples))
    return {
        "samples": len(samples),
        "images": len(tokens),
        "images_per_sample": {
            "histogram": {str(k): count_hist.get(k, 0) for k in range(len(dist.images_per_sample))},
            "fraction": {str(k): round(count_hist.get(k, 0) / n, 4) for k in range(len(dist.images_per_sample))},
            "mean": round(sum(counts) / n, 4),
        },
        "image_tokens_per_image": {
            **_summary(tokens),
            "histogram": {"edges": edges.tolist(), "counts": histogram.tolist()},
        },
        "image_tokens_per_sample": _summary([sum(i["tokens"] for i in s["images"]) for s in samples]),
        "vit_patches_per_image": _summary([4 * t for t in tokens]),
        "prompt_words": _summary([s["prompt_words"] for s in samples]),
        "answer_words": _summary([s["answer_words"] for s in samples]),
    }


def generate(dist: PayloadConfig, n_samples: int, out_dir: Path) -> Path:
    """Write `n_samples` conversation rows drawn from `dist` and a manifest; idempotent per (dist, n_samples).

    Returns the path of `train.jsonl`; images go to `out_dir/images/`, statistics to `out_dir/manifest.json`.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    out_dir = Path(out_dir).absolute()
    key = dataset_key(dist, n_samples)
    expected = {"version": GENERATOR_VERSION, "key": key}
    if manifest_matches(out_dir, expected):
        return out_dir / JSONL_FILE

    def write(tmp: Path, final: Path) -> None:
        (tmp / IMAGES_DIR).mkdir()
        rng = np.random.default_rng(dist.seed)
        sources = [load_photo(photo) for photo in PHOTOS]
        pool = [w for photo in PHOTOS for w in re.findall(r"[A-Za-z][A-Za-z'-]*", photo.caption)]
        weights = np.asarray(dist.images_per_sample) / sum(dist.images_per_sample)
        rows, samples = [], []
        for index in range(n_samples):
            sample_id = f"realistic-{index:06d}"
            n_images = int(rng.choice(len(weights), p=weights))
            picked: list[Photo] = [PHOTOS[int(i)] for i in rng.integers(0, len(PHOTOS), size=n_images)]
            paths, images = [], []
            for j, photo in enumerate(picked):
                image = _render_image(sources[PHOTOS.index(photo)], rng, dist)
                file_name = f"{sample_id}_{j}.jpg"
                image.save(tmp / IMAGES_DIR / file_name, quality=JPEG_QUALITY)
                paths.append(final / IMAGES_DIR / file_name)
                tokens = (image.height // TOKEN_PX) * (image.width // TOKEN_PX)
                size = {"width": image.width, "height": image.height, "tokens": tokens}
                images.append({"file": file_name, "source": photo.name, **size})
            prompt_words = int(rng.integers(dist.prompt_words_min, dist.prompt_words_max + 1))
            answer_words = int(rng.integers(dist.answer_words_min, dist.answer_words_max + 1))
            lead = "Describe the pictures." if n_images > 1 else "Describe the picture." if n_images else ""
            prompt = _words(rng, pool, lead, prompt_words)
            answer = _words(rng, pool, " ".join(photo.caption for photo in picked), answer_words)
            rows.append(conversation_row(paths, prompt, answer, sample_id))
            samples.append(
                {
                    "id": sample_id,
                    "images": images,
                    "prompt_words": prompt_words,
                    "answer_words": answer_words,
                }
            )
        write_jsonl(tmp / JSONL_FILE, rows)
        lo, hi = dist.effective_token_range
        manifest = {
            "version": GENERATOR_VERSION,
            "key": key,
            "n_samples": n_samples,
            "distribution": dist.identity(),
            "token_clamp": {
                "effective_image_tokens_min": lo,
                "effective_image_tokens_max": hi,
                "collate_min_pixels": COLLATE_MIN_TOKENS * TOKEN_PX * TOKEN_PX,
                "collate_max_pixels": COLLATE_MAX_TOKENS * TOKEN_PX * TOKEN_PX,
                "note": "Targets are clamped to the Qwen collate's min/max_pixels (196..980 tokens of 32x32 "
                "px) and images are saved with both sides multiples of 32, so the processor keeps their "
                "size and each image yields exactly (h//32)*(w//32) <|image_pad|> tokens.",
            },
            "realized": _realized(samples, dist),
            "photos": [{"name": p.name, "license": p.license} for p in PHOTOS],
            "samples": samples,
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")

    build_atomically(out_dir, write, lambda: manifest_matches(out_dir, expected))
    return out_dir / JSONL_FILE
