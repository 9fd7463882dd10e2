"""Image preprocessing (R-MEDIA): from encoded bytes to pixel tensors, equal to `transformers`'
CLIP and SigLIP image processors (the test-only reference, its PIL backend) within 1e-6, on
images generated here in many sizes, modes and formats, EXIF orientations included (the
reference gets the upright image, as `transformers.image_utils.load_image` makes it)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from vllm_srun.adapters.contracts import MediaError, MediaLimits
from vllm_srun.adapters.families.multimodal import read_preprocess
from vllm_srun.adapters.media.decoder import PillowAvDecoder
from vllm_srun.adapters.media.preprocess import ImagePreprocess
from vllm_srun.adapters.media.samples import image_bytes

transformers = pytest.importorskip("transformers")

TOL = 1e-6
LIMITS = MediaLimits(max_bytes=1 << 26, max_pixels=1 << 24)
SIZES = [(1, 1), (3, 200), (200, 3), (224, 224), (225, 223), (640, 480), (31, 97), (50, 50)]
MODES = ["RGB", "RGBA", "L", "LA", "P", "CMYK", "I;16", "1"]


def _processors() -> dict[str, Any]:
    return {
        "clip-224": transformers.CLIPImageProcessor(),
        "clip-40-bilinear": transformers.CLIPImageProcessor(
            size={"shortest_edge": 40}, crop_size={"height": 36, "width": 44}, resample=2
        ),
        "siglip-224": transformers.SiglipImageProcessor(),
        "siglip-32-lanczos": transformers.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=1),
    }


PROCESSORS = _processors()


def _spec(name: str) -> ImagePreprocess:
    processor = PROCESSORS[name]
    return ImagePreprocess.from_config(processor.to_dict(), "clip" if name.startswith("clip") else "siglip")


def _reference(name: str, data: bytes) -> np.ndarray:
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    return PROCESSORS[name](images=upright, return_tensors="np")["pixel_values"][0]


def _format_for(mode: str) -> str:
    return {"CMYK": "JPEG", "I;16": "PNG", "LA": "PNG", "P": "PNG", "1": "BMP"}.get(mode, "PNG")


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_pixels_equal_the_reference_in_every_size_and_mode(name: str) -> None:
    decoder = PillowAvDecoder()
    spec = _spec(name)
    worst = 0.0
    for seed, (width, height) in enumerate(SIZES):
        for mode in MODES:
            data = image_bytes(seed, width, height, mode=mode, fmt=_format_for(mode))
            got = decoder.image(data, LIMITS, spec)
            want = _reference(name, data)
            assert got.shape == want.shape and got.dtype == np.float32, (mode, width, height)
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= TOL


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_every_format(fmt: str) -> None:
    decoder = PillowAvDecoder()
    data = image_bytes(7, 120, 90, fmt=fmt)
    for name in ("clip-224", "siglip-224"):
        assert np.abs(decoder.image(data, LIMITS, _spec(name)) - _reference(name, data)).max() <= TOL


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    decoder = PillowAvDecoder()
    data = image_bytes(11, 64, 40, fmt="JPEG", orientation=orientation)
    plain = decoder.image(image_bytes(11, 64, 40, fmt="JPEG"), LIMITS, _spec("siglip-32-lanczos"))
    got = decoder.image(data, LIMITS, _spec("siglip-32-lanczos"))
    assert np.abs(got - _reference("siglip-32-lanczos", data)).max() <= TOL
    # orientations 5-8 swap width and height: a tall image in, the same square out but not the same pixels
    assert (np.array_equal(got, plain)) is (orientation == 1)


def test_transparency_is_composited_onto_white() -> None:
    decoder = PillowAvDecoder()
    clear = Image.new("RGBA", (8, 8), (10, 200, 30, 0))
    buf = io.BytesIO()
    clear.save(buf, format="PNG")
    spec = ImagePreprocess(size=(8, 8), mean=None, std=None)
    got = decoder.image(buf.getvalue(), LIMITS, spec)
    assert np.all(got == np.float32(1.0))  # white, rescaled


def test_the_fixture_packages_preprocessing_is_the_processors(multimodal_fixture: Any) -> None:
    for variant in ("clip", "siglip"):
        folder: Path = multimodal_fixture(variant)
        ours = read_preprocess(folder, variant)
        reference_class = transformers.CLIPImageProcessor if variant == "clip" else transformers.SiglipImageProcessor
        reference = reference_class.from_pretrained(folder)
        data = image_bytes(3, 70, 45)
        want = reference(images=Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
        assert np.abs(PillowAvDecoder().image(data, LIMITS, ours) - want).max() <= TOL
        assert ours.output_size() == (32, 32)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares WIDTH × HEIGHT pixels and holds one tiny compressed row (a bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"GIF89a but not really", "corrupt GIF image: its header cannot be read"),
        (b"%PDF-1.4 not an image", "not an image in a supported format"),
        (_png_header(20_000, 20_000), "over the limit of 16777216 .refused before decoding"),
        (_png_header(100_000, 100_000), "10000000000 pixels, over the limit"),
        (image_bytes(1, 64, 64, fmt="PNG")[:200], "corrupt or truncated"),
        (image_bytes(1, 64, 64, fmt="JPEG")[:300], "corrupt or truncated|unreadable image header"),
        (b"\0" * (1 << 26) + b"x", "over the limit of 67108864 bytes"),
    ],
)
def test_bad_images_are_refused_with_one_line(data: bytes, message: str) -> None:
    with pytest.raises(MediaError, match=message) as caught:
        PillowAvDecoder().image(data, LIMITS, _spec("clip-224"))
    assert "\n" not in str(caught.value)


def test_config_refusals() -> None:
    for raw, message in [
        ({"size": {"longest_edge": 10}}, "size"),
        ({"do_center_crop": True, "crop_size": {"shortest_edge": 3}}, "crop_size"),
        ({"image_std": [0.5, 0, 0.5]}, "zero"),
        ({"resample": 9}, "resample"),
        ({"do_pad": True}, "do_pad"),
        ({"image_mean": [0.5, 0.5]}, "image_mean"),
    ]:
        with pytest.raises(ValueError, match=message):
            ImagePreprocess.from_config({"image_processor_type": "SiglipImageProcessor", **raw}, "siglip")
    old_style = ImagePreprocess.from_config({"size": 224, "crop_size": 224}, "clip")
    assert old_style.shortest_edge == 224 and old_style.crop == (224, 224)
