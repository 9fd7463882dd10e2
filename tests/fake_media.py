"""A `MediaDecoder` for tests (no pillow, no PyAV): what the bytes start with says what happens.

- `exit` — the process dies on the spot (a media worker crashing in a native library);
- `sleep:S;…` — takes S seconds first (a slow decode, to be killed or timed out); with a field
  `mark:PATH;` it creates the file PATH as it starts (a test waits for that: the job is in a worker);
- `bad` — a `MediaError` (bad media);
- anything else — pixels of shape [3, H, W] (a video: [frames, 3, H, W]) filled with a value
  decided by the bytes alone (equal bytes give equal pixels in any process); H × W is what the
  preprocessing makes (`output_size()`), 4 × 4 without one.
Loaded by media worker processes as `tests.fake_media:FakeDecoder`.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import MediaError, MediaLimits


def _value(data: bytes) -> float:
    return float(int.from_bytes(hashlib.sha256(data).digest()[:2], "little") % 1000) / 1000


class FakeDecoder:
    def _act(self, data: bytes) -> None:
        if data.startswith(b"exit"):
            os._exit(3)
        if data.startswith(b"sleep:"):
            seconds, *fields = data[6:].split(b";")
            for field in fields:
                if field.startswith(b"mark:"):
                    Path(field[5:].decode()).touch()
            time.sleep(float(seconds))
        if data.startswith(b"bad"):
            raise MediaError("bad fake media")

    def image(self, data: bytes, limits: MediaLimits, preprocess: Any) -> np.ndarray:
        self._act(data)
        return np.full((3, *_size(preprocess)), _value(data), dtype=np.float32)

    def video_frames(self, data: bytes, frames: int, limits: MediaLimits, preprocess: Any) -> np.ndarray:
        self._act(data)
        size = _size(preprocess)
        return np.stack([np.full((3, *size), _value(data + bytes([i])), dtype=np.float32) for i in range(frames)])


def _size(preprocess: Any) -> tuple[int, int]:
    size = preprocess.output_size() if preprocess is not None else None
    return size or (4, 4)
