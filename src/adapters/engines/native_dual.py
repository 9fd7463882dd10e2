"""The native (torch) engine for dual encoders (the multimodal family's `dual_encoder` kind).

Text rows run as one padded batch through the text tower, images as one batch of pixels through
the vision tower (`models/dual_encoder.py`); both come back L2-normalized, float32, on the CPU.
Eager torch kernels with `scaled_dot_product_attention`; the oneDNN packed path of the encoder
engine is not used here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vllm_srun.adapters.contracts import Determinism
from vllm_srun.adapters.models.dual_encoder import DualEncoder
from vllm_srun.domain.scheduling.lanes import Accounting


class NativeDualEncoder:
    name = "native"
    accounting = Accounting.PADDED  # text rows pad to the longest; every image row has the same length
    kernel_switch_tokens: int | None = None
    forward_threads = True  # torch kernels read the count each forward declares
    # padded eager forwards change a row's bits with its batch; a row alone is reproducible
    determinism = Determinism.ROWS_ALONE

    def __init__(self, network: DualEncoder) -> None:
        self.network = network
        self.device = next(network.parameters()).device

    def describe(self) -> dict[str, Any]:
        return {"kernels": {"linear": "eager", "attention": "sdpa", "reason": "reference kernels"}}

    def embed_text(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        with torch.inference_mode():
            return self.network.embed_text(batch).float().cpu().numpy()

    def embed_images(self, pixels: Sequence[Any]) -> np.ndarray:
        batch = torch.from_numpy(np.stack(pixels)).to(self.device)
        with torch.inference_mode():
            return self.network.embed_images(batch).float().cpu().numpy()
