"""Offline VLM data: a hub-free Qwen3-VL processor, wheel-shipped real photos and realistic payload sets."""

from vlmtrain.data.photos import PHOTOS, Photo, load_photo
from vlmtrain.data.processor import build_processor, vision_token_ids
from vlmtrain.data.realistic import generate
from vlmtrain.data.sample import write_sample_dataset

__all__ = [
    "PHOTOS",
    "Photo",
    "build_processor",
    "generate",
    "load_photo",
    "vision_token_ids",
    "write_sample_dataset",
]
