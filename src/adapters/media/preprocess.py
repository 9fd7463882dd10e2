"""Image preprocessing exactly as a package's `preprocessor_config.json` says (pillow + numpy).

`ImagePreprocess.from_config(raw)` reads a CLIP or SigLIP image processor's config (keys missing
from the file take that processor's defaults); `pixels(image, spec)` turns a decoded image into
the float32 [3, H, W] tensor the vision tower reads, in the order `transformers`' image
processors use (its PIL backend, which is the reference these pixels are tested against):

1. RGB: an image with an alpha band, or a palette/grayscale image with a transparent colour,
   is composited onto white; every other mode (L, I;16, CMYK, P, …) goes through pillow's
   `convert("RGB")` (16-bit values above 255 clip, as pillow does);
2. resize with pillow's filter (`resample`, bicubic for CLIP and SigLIP): either the shortest
   edge to `size.shortest_edge` keeping the aspect ratio (the long edge truncated to an int), or
   to exactly `size.height` × `size.width`;
3. center crop to `crop_size` (zero-padded when the image is smaller);
4. rescale (× `rescale_factor`, computed in float64 then cast to float32) and normalize
   (`(x - mean) / std` in float32), done with one 256-entry table per channel.

EXIF orientation is applied by the decoder before this (`decoder.py`). Pure CPU work with no
torch, so it runs in media worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

# the processors' defaults (transformers' CLIPImageProcessor and SiglipImageProcessor)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip": dict(
        do_resize=True,
        size={"shortest_edge": 224},
        resample=3,
        do_center_crop=True,
        crop_size={"height": 224, "width": 224},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    ),
    "siglip": dict(
        do_resize=True,
        size={"height": 224, "width": 224},
        resample=3,
        do_center_crop=False,
        crop_size=None,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=HALF,
        image_std=HALF,
    ),
}
PROCESSOR_KINDS = {"CLIPImageProcessor": "clip", "SiglipImageProcessor": "siglip"}
_UNSUPPORTED = ("do_pad", "do_image_splitting", "image_grid_pinpoints")


@dataclass(frozen=True)
class ImagePreprocess:
    """What `preprocessor_config.json` asks for, checked (picklable: it crosses into media workers)."""

    shortest_edge: int | None = None  # resize the shortest edge to this, keeping the aspect ratio
    size: tuple[int, int] | None = None  # or resize to exactly (height, width); both None: no resize
    resample: int = 3
    crop: tuple[int, int] | None = None  # center crop (height, width)
    rescale: float | None = 1 / 255
    mean: tuple[float, float, float] | None = None  # normalize when set (with std)
    std: tuple[float, float, float] | None = None

    @classmethod
    def from_config(cls, raw: dict[str, Any], kind: str) -> ImagePreprocess:
        """The spec of RAW (a preprocessor_config.json), defaults of KIND's processor (clip|siglip)."""
        named = str(raw.get("image_processor_type") or "")
        for prefix, known in PROCESSOR_KINDS.items():
            if named.startswith(prefix):
                kind = known
        if kind not in _DEFAULTS:
            raise ValueError(f"no image processor defaults for {kind!r}")
        for key in _UNSUPPORTED:
            if raw.get(key):
                raise ValueError(f"preprocessor_config.json sets {key}, which is not supported")
        c = {**_DEFAULTS[kind], **{k: v for k, v in raw.items() if k in _DEFAULTS[kind]}}
        shortest, size = None, None
        if c["do_resize"]:
            shortest, size = _resize_size(c["size"])
        resample = int(c["resample"])
        if resample not in RESAMPLE_NAMES:
            raise ValueError(f"preprocessor_config.json resample {resample} is not a pillow filter")
        crop = _crop_size(c["crop_size"]) if c["do_center_crop"] else None
        mean = std = None
        if c["do_normalize"]:
            mean, std = _triple(c["image_mean"], "image_mean"), _triple(c["image_std"], "image_std")
            if any(s == 0 for s in std):
                raise ValueError("preprocessor_config.json image_std has a zero")
        rescale = float(c["rescale_factor"]) if c["do_rescale"] else None
        return cls(shortest, size, resample, crop, rescale, mean, std)

    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output; None when it depends on the input image."""
        if self.crop is not None:
            return self.crop
        return self.size

    def key(self) -> str:
        """A short stable text naming this spec (part of the decode cache key)."""
        return repr((self.shortest_edge, self.size, self.resample, self.crop, self.rescale, self.mean, self.std))

    def tables(self) -> np.ndarray:
        """[3, 256] float32: what each 8-bit value of each channel becomes."""
        values = np.arange(256, dtype=np.uint8)
        out = np.empty((3, 256), dtype=np.float32)
        for c in range(3):
            x = (
                (values.astype(np.float64) * self.rescale).astype(np.float32)
                if self.rescale
                else values.astype(np.float32)
            )
            if self.mean is not None and self.std is not None:
                x = (x - np.float32(self.mean[c])) / np.float32(self.std[c])
            out[c] = x
        return out


def _resize_size(size: Any) -> tuple[int | None, tuple[int, int] | None]:
    if isinstance(size, int):
        return size, None
    if isinstance(size, dict):
        if set(size) == {"shortest_edge"}:
            return int(size["shortest_edge"]), None
        if set(size) == {"height", "width"}:
            return None, (int(size["height"]), int(size["width"]))
    raise ValueError(f"preprocessor_config.json size {size!r} is not supported (shortest_edge, or height and width)")


def _crop_size(size: Any) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if isinstance(size, dict) and set(size) == {"height", "width"}:
        return int(size["height"]), int(size["width"])
    raise ValueError(f"preprocessor_config.json crop_size {size!r} is not supported (height and width)")


def _triple(value: Any, name: str) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        v = float(value)
        return (v, v, v)
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return (float(value[0]), float(value[1]), float(value[2]))
    raise ValueError(f"preprocessor_config.json {name} must be a number or three numbers (got {value!r})")


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB: transparency composited onto white, everything else through pillow's conversion."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def resized_size(height: int, width: int, spec: ImagePreprocess) -> tuple[int, int]:
    """(height, width) after the resize step."""
    if spec.size is not None:
        return spec.size
    if spec.shortest_edge is None:
        return height, width
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(spec.shortest_edge * long / short)
    return (new_long, spec.shortest_edge) if width <= height else (spec.shortest_edge, new_long)


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """[H, W, 3] uint8 cut to HEIGHT × WIDTH around the center, zero-padded where it is smaller."""
    h, w = pixels.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return pixels[top : top + height, left : left + width]
    new_h, new_w = max(height, h), max(width, w)
    padded = np.zeros((new_h, new_w, pixels.shape[2]), dtype=pixels.dtype)
    pad_top, pad_left = -(-(new_h - h) // 2), -(-(new_w - w) // 2)
    padded[pad_top : pad_top + h, pad_left : pad_left + w] = pixels
    top, left = top + pad_top, left + pad_left
    return padded[max(0, top) : min(new_h, top + height), max(0, left) : min(new_w, left + width)]


def pixels(image: Image.Image, spec: ImagePreprocess, tables: np.ndarray | None = None) -> np.ndarray:
    """IMAGE (any mode, already upright) → float32 [3, H, W] as SPEC says."""
    rgb = to_rgb(image)
    height, width = resized_size(rgb.height, rgb.width, spec)
    if spec.shortest_edge is not None or spec.size is not None:
        rgb = rgb.resize((width, height), resample=Image.Resampling(spec.resample))
    array = np.asarray(rgb, dtype=np.uint8)
    if spec.crop is not None:
        array = center_crop(array, *spec.crop)
    lut = spec.tables() if tables is None else tables
    out = np.empty((3, *array.shape[:2]), dtype=np.float32)
    for c in range(3):
        np.take(lut[c], array[:, :, c], out=out[c])
    return out
