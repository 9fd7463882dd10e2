"""Images and videos made in code (pillow, PyAV), deterministic by seed: the media of fixture
golden files, tests and benchmarks. Nothing is ever downloaded.
"""

from __future__ import annotations

import base64
import io
from fractions import Fraction

import numpy as np
from PIL import Image

MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
EXIF_ORIENTATION = 0x0112


def picture(seed: int, width: int, height: int) -> np.ndarray:
    """[height, width, 3] uint8: gradients, a few blocks and noise, different for every seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.5, 3.0, 2)
        out[:, :, c] = 127.5 + 100 * np.sin(fx * x / max(width, 1) * 6.28 + fy * y / max(height, 1) * 6.28 + c)
    for _ in range(4):
        x0, y0 = rng.integers(0, max(width, 1)), rng.integers(0, max(height, 1))
        out[y0 : y0 + height // 4 + 1, x0 : x0 + width // 4 + 1] = rng.uniform(0, 255, 3)
    out += rng.normal(0, 8, out.shape)
    return np.clip(out, 0, 255).astype(np.uint8)


def image_bytes(
    seed: int,
    width: int = 48,
    height: int = 40,
    *,
    mode: str = "RGB",
    fmt: str = "PNG",
    orientation: int | None = None,
) -> bytes:
    """An encoded image in MODE (RGB, RGBA, L, LA, P, CMYK, I;16…) and FMT; ORIENTATION sets the
    EXIF orientation tag (JPEG, PNG, WebP, TIFF)."""
    rgb = Image.fromarray(picture(seed, width, height), "RGB")
    if mode == "RGBA" or mode == "LA":
        alpha = Image.fromarray(picture(seed + 1, width, height)[:, :, 0], "L")
        image = rgb.convert("RGBA") if mode == "RGBA" else rgb.convert("L").convert("LA")
        image.putalpha(alpha)
    elif mode == "I;16":
        image = Image.fromarray(np.asarray(rgb.convert("L"), dtype=np.uint16) * 257)
    else:
        image = rgb.convert(mode)
    buf = io.BytesIO()
    extra = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
        extra["exif"] = exif.tobytes()
    image.save(buf, format=fmt, **extra)
    return buf.getvalue()


def video_bytes(
    seed: int,
    frames: int = 8,
    width: int = 48,
    height: int = 40,
    *,
    fps: int = 8,
    container: str = "mp4",
    codec: str = "mpeg4",
) -> bytes:
    """An encoded video of FRAMES frames that each differ (single-threaded encoding: the same
    seed gives the same bytes on one machine)."""
    import av
    from av.video.stream import VideoStream

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=Fraction(fps, 1))
        assert isinstance(stream, VideoStream)
        stream.width, stream.height = width, height
        stream.pix_fmt = "rgb8" if codec == "gif" else "yuv420p"
        stream.codec_context.thread_count = 1
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(picture(seed * 1000 + i, width, height), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_url(
    seed: int, width: int = 48, height: int = 40, *, fmt: str = "PNG", mode: str = "RGB", orientation: int | None = None
) -> str:
    data = image_bytes(seed, width, height, mode=mode, fmt=fmt, orientation=orientation)
    return data_url(data, MIME.get(fmt, "application/octet-stream"))


def video_url(seed: int, frames: int = 8, width: int = 48, height: int = 40) -> str:
    return data_url(video_bytes(seed, frames, width, height), "video/mp4")
