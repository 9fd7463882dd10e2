"""Videos (R-MEDIA): PyAV decodes, N frames are sampled uniformly over the duration (the frame
shown at the middle of each of N equal slices), each preprocessed like an image; every bad or
oversize video is refused with one line before its frames cost anything. Videos are made here."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from vllm_srun.adapters.contracts import MediaError, MediaLimits
from vllm_srun.adapters.media.decoder import PillowAvDecoder
from vllm_srun.adapters.media.preprocess import ImagePreprocess
from vllm_srun.adapters.media.samples import video_bytes

transformers = pytest.importorskip("transformers")

LIMITS = MediaLimits(max_bytes=1 << 26, max_pixels=1 << 22, max_frames=32, max_duration_s=60, max_decoded_frames=2000)
SPEC = ImagePreprocess(size=(24, 24), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _frames(data: bytes) -> tuple[list[float], list[Image.Image], float]:
    """Every frame's start time and RGB image, and the stream's duration, decoded independently."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        duration = float(stream.duration * stream.time_base) if stream.duration else container.duration / av.time_base
        decoded = [(float(f.time), f.to_image()) for f in container.decode(stream)]
    return [t for t, _ in decoded], [im for _, im in decoded], duration


def _expected(data: bytes, n: int) -> np.ndarray:
    """The reference: the frame shown at the middle of each of N equal slices, through the
    transformers SigLIP processor at the same settings."""
    times, images, duration = _frames(data)
    processor = transformers.SiglipImageProcessor(size={"height": 24, "width": 24})
    picked = []
    for i in range(n):
        at = times[0] + duration * (i + 0.5) / n
        index = max(j for j, t in enumerate(times) if t <= at) if at >= times[0] else 0
        picked.append(processor(images=images[index], return_tensors="np")["pixel_values"][0])
    return np.stack(picked)


@pytest.mark.parametrize(
    ("container", "codec"),
    [
        ("mp4", "mpeg4"),
        ("mp4", "libx264"),
        ("webm", "libvpx-vp9"),
        ("matroska", "libvpx"),
        ("mpegts", "mpeg2video"),
        ("gif", "gif"),
    ],
)
@pytest.mark.parametrize("n", [1, 3, 8, 20])
def test_frames_sampled_uniformly_equal_the_reference(container: str, codec: str, n: int) -> None:
    data = video_bytes(5, 12, 40, 30, fps=6, container=container, codec=codec)
    got = PillowAvDecoder().video_frames(data, n, LIMITS, SPEC)
    assert got.shape == (n, 3, 24, 24) and got.dtype == np.float32
    assert np.abs(got - _expected(data, n)).max() <= 1e-6


def test_more_samples_than_frames_repeat_frames_in_order() -> None:
    data = video_bytes(6, 3, 32, 32, fps=3)
    got = PillowAvDecoder().video_frames(data, 9, LIMITS, SPEC)
    distinct = [0] + [i for i in range(1, 9) if not np.array_equal(got[i], got[i - 1])]
    assert len(distinct) == 3  # each frame covers three samples, in order


def _write(
    frames: int, *, container: str = "matroska", fps: int = 10, size: tuple[int, int] = (16, 16), audio: bool = False
) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream("mpeg4", rate=Fraction(fps, 1))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        if audio:
            sound = out.add_stream("aac", rate=8000)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate = 8000
            for packet in [*sound.encode(frame), *sound.encode()]:
                out.mux(packet)
        for i in range(frames):
            image = np.full((size[1], size[0], 3), i % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _audio_only() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        sound = out.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*sound.encode(frame), *sound.encode()]:
            out.mux(packet)
    return buf.getvalue()


MP4 = video_bytes(1, 8, 32, 24)


@pytest.mark.parametrize(
    ("data", "frames", "limits", "message"),
    [
        (b"", 4, LIMITS, "empty"),
        (b"\x00\x00\x00\x18ftypmp42 then nothing useful", 4, LIMITS, "unreadable mov container"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", 4, LIMITS, "not a video in a supported container"),
        (Image.new("RGB", (4, 4)).tobytes() * 50, 4, LIMITS, "not a video in a supported container"),
        (_audio_only(), 4, LIMITS, "no video stream"),
        (_write(0, audio=True), 4, LIMITS, "no frames"),
        (MP4[: len(MP4) // 2], 4, LIMITS, "unreadable mov container"),
        (MP4, 4, MediaLimits(max_bytes=100, max_pixels=1 << 22), "over the limit of 100 bytes"),
        (MP4, 4, MediaLimits(max_bytes=1 << 26, max_pixels=500), "over the limit of 500"),
        (_write(80, fps=1), 4, MediaLimits(max_bytes=1 << 26, max_pixels=1 << 22, max_duration_s=60), "lasts 80.0 s"),
        (
            _write(50),
            4,
            MediaLimits(max_bytes=1 << 26, max_pixels=1 << 22, max_decoded_frames=30),
            "more than 30 frames",
        ),
        (MP4, 33, LIMITS, "frames must be between 1 and 32"),
        (MP4, 0, LIMITS, "frames must be between 1 and 32"),
    ],
)
def test_bad_videos_are_refused_with_one_line(data: bytes, frames: int, limits: MediaLimits, message: str) -> None:
    with pytest.raises(MediaError, match=message) as caught:
        PillowAvDecoder().video_frames(data, frames, limits, SPEC)
    assert "\n" not in str(caught.value)


def test_a_matroska_stream_cut_short_is_refused_as_truncated() -> None:
    whole = _write(60)  # 6 s at 10 frames per second; the duration is written in the header
    assert PillowAvDecoder().video_frames(whole, 4, LIMITS, SPEC).shape == (4, 3, 24, 24)
    with pytest.raises(MediaError, match=r"truncated|corrupt|unreadable"):
        PillowAvDecoder().video_frames(whole[: len(whole) // 3], 4, LIMITS, SPEC)


def test_a_video_without_a_declared_duration_is_measured() -> None:
    """MPEG-TS declares no stream duration: a first pass over the frames finds it."""
    data = video_bytes(2, 10, 32, 24, fps=5, container="mpegts", codec="mpeg2video")
    got = PillowAvDecoder().video_frames(data, 5, LIMITS, SPEC)
    assert np.abs(got - _expected(data, 5)).max() <= 1e-6
