"""Properties of the Qwen vision size and sampling rules (domain/inputs/media.py): the resize bounds,
multiples and aspect hold for any image or video, and the numbers agree with transformers' own
functions (the reference, imported here only)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref_image
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as ref_video

from vllm_srun.domain.inputs.media import (
    group_times,
    qwen_frame_count,
    qwen_frame_indices,
    smart_resize,
    video_smart_resize,
    vision_tokens,
)

sides = st.integers(1, 5000)
factors = st.sampled_from([28, 32, 8, 16])
budgets = st.tuples(st.integers(1, 300_000), st.integers(1, 5_000_000)).map(sorted)


@settings(max_examples=400, deadline=None)
@given(sides, sides, factors, budgets)
def test_image_size_is_transformers_smart_resize(height, width, factor, budget):
    low, high = budget
    try:
        expected = ref_image(height, width, factor, low, high)
    except ValueError:
        with pytest.raises(ValueError):
            smart_resize(height, width, factor, low, high)
        return
    if min(expected) < 1:  # transformers would hand on a zero side; we refuse it
        with pytest.raises(ValueError):
            smart_resize(height, width, factor, low, high)
        return
    got = smart_resize(height, width, factor, low, high)
    assert got == expected
    h, w = got
    assert h % factor == 0 and w % factor == 0 and min(h, w) >= factor


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), sides, sides, factors, st.sampled_from([1, 2]), budgets)
def test_video_size_is_transformers_video_smart_resize(frames, height, width, factor, temporal, budget):
    low, high = budget
    try:
        expected = ref_video(frames, height, width, temporal, factor, low, high)
    except ValueError:
        with pytest.raises(ValueError):
            video_smart_resize(frames, height, width, temporal, factor, low, high)
        return
    got = video_smart_resize(frames, height, width, temporal, factor, low, high)
    assert got == expected
    assert got[0] % factor == 0 and got[1] % factor == 0 and min(got) >= factor


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 20_000), st.floats(0.5, 240.0), st.integers(1, 8), st.integers(8, 64))
def test_frame_indices_follow_the_processor(total, fps, low, high):
    indices = qwen_frame_indices(total, fps, 2.0, low, high)
    count = qwen_frame_count(total, fps, 2.0, low, high)
    assert len(indices) == count
    assert count <= total and count <= high
    assert count >= min(low, total)
    assert (indices[0] == 0 and indices[-1] == total - 1) or count == 1
    assert indices == sorted(indices)
    # transformers' Qwen3VLVideoProcessor.sample_frames: int(total / fps * rate), clamped, linspace + round
    reference = min(max(int(total / fps * 2.0), low), high, total)
    assert count == reference
    if count > 1:
        assert indices == np.linspace(0, total - 1, count).round().astype(int).tolist()


def test_two_frames_a_second_between_4_and_32():
    assert qwen_frame_count(24 * 10, 24.0) == 20  # 10 s at 24 fps: 2 a second
    assert qwen_frame_count(24, 24.0) == 4  # 1 s: at least 4
    assert qwen_frame_count(24 * 300, 24.0) == 32  # 300 s: at most 32
    assert qwen_frame_count(3, 30.0) == 3  # never more than the video has


@given(st.lists(st.floats(0, 300, allow_nan=False), min_size=1, max_size=40), st.sampled_from([1, 2, 3]))
def test_group_times_are_group_means(times, temporal):
    groups = group_times(times, temporal)
    assert len(groups) == math.ceil(len(times) / temporal)
    padded = list(times) + [times[-1]] * (-len(times) % temporal)
    for g, t in enumerate(groups):
        first, last = padded[g * temporal], padded[g * temporal + temporal - 1]
        assert t == pytest.approx((first + last) / 2)


def test_tokens_and_refusals():
    assert vision_tokens(2, 4, 6, 2) == 12
    with pytest.raises(ValueError):
        vision_tokens(1, 3, 4, 2)
    with pytest.raises(ValueError, match="aspect"):
        smart_resize(10, 2010, 28, 56 * 56, 28 * 28 * 1280)
    with pytest.raises(ValueError, match="at least 2 frames"):
        video_smart_resize(1, 64, 64, 2, 32, 4096, 10**6)
    with pytest.raises(ValueError):
        qwen_frame_count(0, 24.0)
    with pytest.raises(ValueError):
        qwen_frame_count(10, 0.0)
