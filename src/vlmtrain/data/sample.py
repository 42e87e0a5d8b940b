"""Embedded sample dataset: the wheel-shipped photos as Megatron Bridge native conversation rows."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vlmtrain.data.photos import PHOTOS, load_photo

#: Bump when the row format or image encoding changes; stale folders get rebuilt.
SAMPLE_VERSION = 1
MANIFEST_FILE = "manifest.json"
JSONL_FILE = "train.jsonl"
IMAGES_DIR = "images"
JPEG_QUALITY = 92

#: Prompt variants, assigned round-robin so the rows are not all identical at the text level.
PROMPTS: tuple[str, ...] = (
    "Describe this image.",
    "What is shown in this picture?",
    "Write a one-sentence caption for this photo.",
    "Briefly describe what you see.",
)


def conversation_row(image_paths: Sequence[Path], prompt: str, answer: str, row_id: str) -> dict[str, Any]:
    """One row in Bridge's native `conversation` schema (images first, then the prompt)."""
    user: list[dict[str, str]] = [{"type": "image", "image": str(path)} for path in image_paths]
    user.append({"type": "text", "text": prompt})
    return {
        "conversation": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ],
        "id": row_id,
    }


def manifest_matches(out_dir: Path, expected: dict[str, Any]) -> bool:
    """True when `out_dir` holds a finished dataset whose manifest agrees with every `expected` key."""
    try:
        manifest = json.loads((out_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return False
    return all(manifest.get(key) == value for key, value in expected.items()) and (out_dir / JSONL_FILE).is_file()


def build_atomically(out_dir: Path, write: Callable[[Path, Path], None], done: Callable[[], bool]) -> None:
    """Run `write(tmp_dir, final_dir)` in a sibling temp folder and swap it in: readers never see half a set.

    `write` gets the final folder too because rows hold absolute image paths. If `done()` turns true while
    writing (another process finished the same set first), the new copy is dropped. Multi-rank jobs should
    still build on one rank and barrier.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(tmp, out_dir)
        if done():
            return
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write rows as JSON lines (UTF-8, one object per line)."""
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_sample_dataset(out_dir: Path) -> Path:
    """Write every photo as JPEG plus `train.jsonl` (one captioning row per photo); idempotent."""
    out_dir = Path(out_dir).absolute()
    names = [photo.name for photo in PHOTOS]
    expected = {"version": SAMPLE_VERSION, "photo_names": names}
    if manifest_matches(out_dir, expected):
        return out_dir / JSONL_FILE

    def write(tmp: Path, final: Path) -> None:
        (tmp / IMAGES_DIR).mkdir()
        rows, entries = [], []
        for index, photo in enumerate(PHOTOS):
            image = load_photo(photo)
            file_name = f"{photo.name}.jpg"
            image.save(tmp / IMAGES_DIR / file_name, quality=JPEG_QUALITY)
            prompt = PROMPTS[index % len(PROMPTS)]
            rows.append(conversation_row([final / IMAGES_DIR / file_name], prompt, photo.caption, photo.name))
            entries.append(
                {
                    "name": photo.name,
                    "file": f"{IMAGES_DIR}/{file_name}",
                    "width": image.width,
                    "height": image.height,
                    "loader": photo.loader,
                    "caption": photo.caption,
                    "license": photo.license,
                }
            )
        write_jsonl(tmp / JSONL_FILE, rows)
        manifest = {
            "version": SAMPLE_VERSION,
            "rows": len(rows),
            "images": len(entries),
            "photo_names": names,
            "prompts": list(PROMPTS),
            "photos": entries,
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")

    build_atomically(out_dir, write, lambda: manifest_matches(out_dir, expected))
    return out_dir / JSONL_FILE
