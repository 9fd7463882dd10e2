"""Media rules (R-MEDIA): the default number of media workers, frame sampling (the streaming
picker never disagrees with the plain rule), `data:` URLs, and the media contract check."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.adapters.contracts import LoadedModel, MediaError, MediaLimits, surface_contract_problems
from vllm_srun.adapters.media.data_url import data_url_bytes
from vllm_srun.domain.inputs.media import FramePicker, default_media_workers, pick_frames, sample_times


@pytest.mark.parametrize(
    ("budget", "workers"), [(1, 1), (2, 1), (15.5, 1), (16, 1), (32, 2), (48.0, 3), (64, 4), (256, 4)]
)
def test_one_media_worker_per_16_cpus_at_least_one_at_most_four(budget: float, workers: int) -> None:
    assert default_media_workers(budget) == workers


def test_samples_are_the_middles_of_equal_slices() -> None:
    assert sample_times(1.0, 4.0, 4) == [1.5, 2.5, 3.5, 4.5]
    assert sample_times(0.0, 2.0, 1) == [1.0]
    with pytest.raises(ValueError):
        sample_times(0.0, 1.0, 0)


def _stream(times: Sequence[float], targets: Sequence[float]) -> list[int]:
    """FramePicker fed one frame at a time, as the decoder does, stopping once it is done."""
    picker = FramePicker(targets)
    picks: list[int | None] = [None] * len(targets)
    for k, t in enumerate(times):
        for i in picker.offer(t):
            picks[i] = max(k - 1, 0)
        if picker.done:
            break
    else:
        for i in picker.finish():
            picks[i] = len(times) - 1
    assert all(p is not None for p in picks)
    return [p for p in picks if p is not None]


@given(
    gaps=st.lists(st.floats(0.001, 2.0), min_size=1, max_size=60),
    start=st.floats(-5, 5),
    duration=st.floats(0.01, 100),
    n=st.integers(1, 32),
)
def test_the_streaming_picker_picks_what_the_rule_picks(
    gaps: list[float], start: float, duration: float, n: int
) -> None:
    times = [start]
    for g in gaps[1:]:
        times.append(times[-1] + g)
    targets = sample_times(start, duration, n)
    assert _stream(times, targets) == pick_frames(times, targets)
    picked = pick_frames(times, targets)
    assert picked == sorted(picked)  # in order, never back in time
    for target, index in zip(targets, picked):
        assert times[index] <= target or index == 0
        assert index == len(times) - 1 or times[index + 1] > target


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("url", "kind", "message"),
    [
        ("http://example.com/cat.png", "image", r"only data: URLs are read \(a http: URL\)"),
        ("https://example.com/v.mp4", "video", "only data: URLs"),
        ("file:///etc/passwd", "image", r"a file: URL"),
        ("/etc/passwd", "image", "not a URL"),
        ("data:image/png;base64", "image", "no comma"),
        ("data:image/png," + "abc", "image", "not base64"),
        ("data:image/png;base64,@@@@", "image", "invalid base64"),
        ("data:image/png;base64,", "image", "no data"),
        ("data:text/plain;base64," + _b64(b"x"), "image", "type text/plain"),
        ("data:image/png;base64," + _b64(b"x"), "video", "type image/png where a video"),
        ("data:image/png;base64," + _b64(b"x" * 200), "image", "over the limit of 100 bytes"),
    ],
)
def test_bad_data_urls_are_refused_with_one_line(url: str, kind: str, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        data_url_bytes(url, kind, 100)


def test_good_data_urls() -> None:
    assert data_url_bytes("data:image/png;base64," + _b64(b"\x89PNG"), "image", 100) == b"\x89PNG"
    assert data_url_bytes("DATA:;base64," + _b64(b"abc"), "image", 100) == b"abc"
    assert data_url_bytes("data:application/octet-stream;base64," + _b64(b"v"), "video", 100) == b"v"
    assert data_url_bytes("data:image/gif;base64," + _b64(b"GIF89a"), "video", 100) == b"GIF89a"
    assert data_url_bytes("data:video/mp4;name=a.mp4;base64," + _b64(b"m"), "video", 100) == b"m"


class _TextOnly(LoadedModel):
    """An embeddings model without media: complete (text-only encoders keep working)."""

    family = "t"
    surfaces = frozenset({"embeddings"})
    dimensions = 4
    normalized = True
    max_input_tokens = 8

    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Any]:
        return []

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        return []


class _SaysItReadsImages(_TextOnly):
    modalities = frozenset({"text", "image"})


class _ReadsImages(_SaysItReadsImages):
    media_lane = "media"
    image_tokens = 5
    image_limits = video_limits = MediaLimits(max_bytes=1, max_pixels=1)
    video_frames = 1
    preprocess = None


def test_the_media_contract_is_an_extension_of_embeddings() -> None:
    assert surface_contract_problems(_TextOnly()) == []
    assert surface_contract_problems(_ReadsImages()) == []
    assert surface_contract_problems(_SaysItReadsImages()) == ["reads image but does not implement MediaEmbedder"]
