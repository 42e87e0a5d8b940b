"""Users' JSONL + image folder (and the generated sample/realistic sets): scanned into a checked copy for Bridge.

Rows are Bridge `conversation` rows, or the short form {"image": path | [paths], "prompt": str, "answer": str}
(`text` is accepted for `answer`). Relative image paths resolve against `image_dir` (default: the JSONL's
folder). The scan (vlmtrain.data.scan) decodes every image; the copy it writes holds the good rows with absolute
image paths, which is what Bridge reads: with data.skip_bad_images=true the bad rows are simply not in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlmtrain.data.sample_ids import KEY
from vlmtrain.data.scan import Problem, Report, cached, identity_key


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


def image_parts(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation's image parts, in order (Bridge's collate reads `part["image"]`)."""
    return [part for turn in conversation if isinstance(turn["content"], list) for part in turn["content"]
            if part.get("type") == "image"]


def scan(path: Path, image_dir: str | None, cache: Path, seq_length: int, kind: str = "jsonl") -> Report:
    """The (cached) scan of a JSONL; its `output` is the checked copy of the good rows."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data.path={path} does not exist (data=jsonl needs a JSONL file).")
    base = Path(image_dir).expanduser() if image_dir else path.parent
    if not base.is_dir():
        raise FileNotFoundError(f"data.image_dir={base} does not exist.")
    identity = {"kind": kind, "path": str(path.resolve()), "image_dir": str(base.resolve()), "seq_length": seq_length}
    out = cache / "jsonl" / f"{path.stem}-{identity_key(identity)}.jsonl"
    return cached(cache, identity, lambda: _scan(kind, path, base, out, seq_length))


def _scan(kind: str, path: Path, base: Path, out: Path, seq_length: int) -> Report:
    report = Report(kind, str(path))
    report.track(path)
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            sample = f"line {lineno}" + (f" (id {row['id']})" if "id" in row else "")
            conversation = _conversation(row)
        except (ValueError, KeyError, TypeError) as e:
            report.samples += 1
            report.bad.append(Problem(lineno, f"line {lineno}", f"not a sample row ({type(e).__name__}: {e})"))
            continue
        images = []
        for part in image_parts(conversation):
            img = Path(str(part["image"]).removeprefix("file://")).expanduser()
            img = (img if img.is_absolute() else base / img).resolve()
            part["image"] = str(img)
            images.append((img, str(img)))
        if report.add(lineno, sample, images, seq_length):
            rows.append({"conversation": conversation, "id": str(row.get("id", f"line {lineno}")), KEY: len(rows)})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out)
    report.output = str(out)
    return report
