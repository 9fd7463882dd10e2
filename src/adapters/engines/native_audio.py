"""The native (torch) engine for the audio family's `audio_encoder` kind.

Audio rows run as one batch of feature arrays (all of one shape: the model's window) through the
model's audio tower; text rows (a model with a text tower) as one padded batch through it. Both
come back float32 on the CPU, pooled as the model says (`models/whisper.py`: mean, not normalized;
`models/clap.py`: projected and L2-normalized). Eager torch kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vllm_srun.adapters.contracts import Determinism
from vllm_srun.adapters.models.audio_arch import AudioNetwork
from vllm_srun.domain.scheduling.lanes import Accounting


class NativeAudioEncoder:
    name = "native"
    accounting = Accounting.PADDED  # every audio row has the window's length
    kernel_switch_tokens: int | None = None
    forward_threads = True  # torch kernels read the count each forward declares
    determinism = Determinism.ROWS_ALONE  # eager batched forwards may change a row's last bits

    def __init__(self, network: AudioNetwork) -> None:
        self.network = network
        self.device = next(network.parameters()).device

    def describe(self) -> dict[str, Any]:
        return {"kernels": {"linear": "eager", "attention": "sdpa", "reason": "reference kernels"}}

    def embed_audio(self, features: Sequence[Any]) -> np.ndarray:
        batch = torch.from_numpy(np.stack(features)).to(self.device)
        with torch.inference_mode():
            return self.network.embed_audio(batch).float().cpu().numpy()

    def embed_text(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        if not self.network.has_text_tower:
            raise ValueError("this audio model has no text tower")
        with torch.inference_mode():
            return self.network.embed_text(batch).float().cpu().numpy()
