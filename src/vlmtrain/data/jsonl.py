"""Users' JSONL + image folder: resolved and checked before any GPU work.

Rows are Bridge `conversation` rows, or the short form {"image": path | [paths], "prompt": str, "answer": str}
(`text` is accepted for `answer`). Relative image paths resolve against `image_dir` (default: the JSONL's
folder). Every image is opened and verified here, so a missing or corrupt file names its sample instead of
failing inside a dataloader worker on the cluster; `skip_bad=True` drops such samples and counts them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from PIL import Image


class BadSample(ValueError):
    """A sample that cannot be trained on; the message names the line, the sample and the fix."""


def _conversation(row: dict[str, Any]) -> list[dict[str, Any]]:
    if "conversation" in row:
        return row["conversation"]
    images = row.get("image", row.get("images", []))
    images = images if isinstance(images, list) else [images]
    answer = row.get("answer", row.get("text"))
    if answer is None:
        raise KeyError("a row needs `conversation`, or `image` + `prompt` + `answer`")
    content = [{"type": "image", "image": im} for im in images]
    content.append({"type": "text", "text": row.get("prompt", "Describe this image.")})
    return [{"role": "user", "content": content}, {"role": "assistant", "content": [{"type": "text", "text": answer}]}]


# Bridge's Qwen collate bounds every image to 200704..1003520 pixels, i.e. 196..980 LLM tokens of 32x32 px.
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 196, 980


def _check_image(path: Path) -> tuple[str | None, int]:
    """(None, LLM tokens the image will cost) when it opens and decodes, else (why not, 0)."""
    if not path.is_file():
        return "file not found", 0
    try:
        with Image.open(path) as im:
            im.load()
            w, h = im.size
    except Exception as e:  # PIL raises many types for truncated/corrupt files
        return f"unreadable ({type(e).__name__}: {e})", 0
    return None, min(max(round(h / 32) * round(w / 32), MIN_IMAGE_TOKENS), MAX_IMAGE_TOKENS)


def resolve(path: Path, image_dir: str | None, out_dir: Path, seq_length: int, skip_bad: bool = False) -> Path:
    """Write a checked copy with absolute image paths into out_dir and return it. A sample whose images alone
    need more tokens than seq_length is bad too: truncation would cut image tokens from their pixels."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data.path={path} does not exist (data=jsonl needs a JSONL file).")
    base = Path(image_dir).expanduser() if image_dir else path.parent
    if not base.is_dir():
        raise FileNotFoundError(f"data.image_dir={base} does not exist.")
    st = path.stat()
    key = hashlib.sha256(
        f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{base.resolve()}|{skip_bad}|{seq_length}".encode()
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{path.stem}-{key.hexdigest()[:12]}.jsonl"
    if out.exists():
        return out
    rows, skipped, n_images = [], [], 0
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        sample = row.get("id", f"line {lineno}")
        try:
            conv = _conversation(row)
        except KeyError as e:
            raise BadSample(f"{path}:{lineno} (sample {sample}): {e}") from None
        problem, image_tokens = None, 0
        for turn in conv:
            for item in turn["content"] if isinstance(turn["content"], list) else []:
                if item.get("type") != "image":
                    continue
                img = Path(str(item["image"]).removeprefix("file://")).expanduser()
                img = img if img.is_absolute() else base / img
                item["image"] = str(img.resolve())
                n_images += 1
                why, tokens = _check_image(img)
                image_tokens += tokens
                problem = problem or (why and f"image {img}: {why}")
        if not problem and image_tokens >= seq_length:
            problem = f"its images need {image_tokens} tokens but train.seq_length={seq_length}; raise train.seq_length"
        if problem:
            if not skip_bad:
                raise BadSample(
                    f"{path}:{lineno} (sample {sample}): {problem}. Fix the file, or pass "
                    "data.skip_bad_images=true to skip such samples and count them."
                )
            skipped.append({"line": lineno, "sample": sample, "problem": problem})
            continue
        rows.append({"conversation": conv, "id": str(sample)})
    if not rows:
        raise BadSample(f"{path}: no usable samples ({len(skipped)} skipped).")
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(out)
    report = {"source": str(path), "samples": len(rows), "images": n_images, "skipped": skipped}
    out.with_suffix(".report.json").write_text(json.dumps(report, indent=1))
    print(
        f"[vlmtrain] data: {len(rows)} samples from {path}, {n_images} images checked, {len(skipped)} skipped"
        + (f" (see {out.with_suffix('.report.json')})" if skipped else ""),
        flush=True,
    )
    return out
