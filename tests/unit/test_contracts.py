"""The contracts package: media jobs meet decoder methods in one typed place, determinism and
numerics are enums that read and print as the strings the card has always had, and importing
the contracts loads no implementation (checked in a fresh interpreter)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

from vllm_srun.adapters.contracts import (
    Determinism,
    ImageJob,
    MediaError,
    MediaLimits,
    Numerics,
    VideoJob,
    decode,
)
from vllm_srun.adapters.media.worker import answer, load_decoder

LIMITS = MediaLimits(max_bytes=100, max_pixels=100, max_frames=4)


class RecordingDecoder:
    """A MediaDecoder that says which method ran, with what."""

    def image(self, data: bytes, limits: MediaLimits, preprocess: object) -> np.ndarray:
        if data == b"bad":
            raise MediaError("bad image")
        return np.full((3, 2, 2), len(data), dtype=np.float32)

    def video_frames(self, data: bytes, frames: int, limits: MediaLimits, preprocess: object) -> np.ndarray:
        return np.full((frames, 3, 2, 2), -len(data), dtype=np.float32)


def test_each_job_kind_runs_its_own_decoder_method() -> None:
    decoder = RecordingDecoder()
    image = decode(decoder, ImageJob(b"abc", LIMITS, None))
    video = decode(decoder, VideoJob(b"abcd", 3, LIMITS, None))
    assert image.shape == (3, 2, 2) and float(image[0, 0, 0]) == 3.0
    assert video.shape == (3, 3, 2, 2) and float(video[0, 0, 0, 0]) == -4.0
    assert (ImageJob.kind, VideoJob.kind) == ("image", "video")


def test_a_media_worker_answers_jobs_and_refuses_anything_else() -> None:
    decoder = RecordingDecoder()
    status, pixels = answer(decoder, pickle.dumps(ImageJob(b"ab", LIMITS, None)))
    assert status == "ok" and isinstance(pixels, np.ndarray) and pixels.shape == (3, 2, 2)
    assert answer(decoder, pickle.dumps(ImageJob(b"bad", LIMITS, None))) == ("media", "bad image")
    # the old by-name form (a method name and its arguments) is not a job
    assert answer(decoder, pickle.dumps(("image", (b"ab", LIMITS, None)))) == ("error", "unknown media job tuple")


def test_a_decoder_target_that_does_not_decode_is_refused_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"^builtins:object is not a MediaDecoder"):
        load_decoder("builtins:object")
    assert decode(load_decoder("tests.fake_media:FakeDecoder"), ImageJob(b"ok", LIMITS, None)).shape == (3, 4, 4)


def test_media_limits_check_the_byte_count() -> None:
    LIMITS.check_bytes(b"x" * 100, "image")
    with pytest.raises(MediaError, match=r"^the image is empty$"):
        LIMITS.check_bytes(b"", "image")
    with pytest.raises(MediaError, match=r"^the video is 101 bytes .* over the limit of 100 bytes$"):
        LIMITS.check_bytes(b"x" * 101, "video")


def test_determinism_and_numerics_read_and_print_as_their_strings() -> None:
    assert Determinism("rows_alone") is Determinism.ROWS_ALONE and Determinism.BATCH_INVARIANT == "batch_invariant"
    assert f"{Determinism.ROWS_ALONE}" == "rows_alone" and [str(n) for n in Numerics] == [
        "deterministic",
        "exact",
        "approximate",
    ]
    with pytest.raises(ValueError):
        Determinism("sometimes")


def test_importing_the_contracts_loads_no_implementation() -> None:
    code = (
        "import sys, vllm_srun.adapters.contracts, vllm_srun.adapters.media.worker\n"
        "loaded = sorted(m for m in sys.modules if m in {'torch', 'numpy', 'tokenizers', 'PIL'}"
        " or m.startswith(('vllm_srun.adapters.families', 'vllm_srun.adapters.models',"
        " 'vllm_srun.adapters.engines', 'vllm_srun.adapters.serving')))\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == ""
