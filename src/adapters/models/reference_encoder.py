"""The device-side forward of the encoder family: one padded batch of tokenized rows in, numpy out.

`ReferenceEncoder.from_folder(folder)` loads the encoder (and its classification head when the
checkpoint has one) and the sentence-transformers pooling. `embed(batch)` → float32 [B, D]
(pooled, normalized when configured); `classify_logits(batch)` → float32 [B, num_labels].

Rows are right-padded to the longest one with the config's pad id (0 for BERT). When every row
has the same length no mask is built at all (attention and pooling take their unmasked paths).
Rows are never cut here: a row longer than the model's positions raises ValueError.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_srun.adapters.models.encoder_arch import EncoderConfigLike, EncoderHead, EncoderModule
from vllm_srun.adapters.models.encoders import load_encoder
from vllm_srun.adapters.models.pooling import PoolingConfig, pool
from vllm_srun.adapters.models.quantize import read_quantization
from vllm_srun.adapters.models.st_modules import load_pooling_config
from vllm_srun.adapters.models.tokenization import Encoded


class ReferenceEncoder:
    def __init__(
        self,
        encoder: EncoderModule,
        head: EncoderHead | None,
        pooling: PoolingConfig,
        device: torch.device | str = "cpu",
        quantization: dict[str, Any] | None = None,
    ) -> None:
        self.encoder = encoder
        # an int8 package's marker (`models/quantize.py`): its weights here are the dequantized int8 ones
        self.quantization = quantization
        self.head = head
        self.pooling = pooling
        self.config: EncoderConfigLike = encoder.config
        self.device = torch.device(device)
        self.pad_id = self.config.pad_token_id

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        pooling: PoolingConfig | None = None,
    ) -> ReferenceEncoder:
        """Load FOLDER. Pooling defaults to the folder's sentence-transformers config, else cls for a
        model with a classification head and mean for a bare encoder."""
        quantization = read_quantization(folder)  # before the weights: a foreign quantization is refused
        encoder, head = load_encoder(folder, dtype)
        if pooling is None:
            default = encoder.default_pooling or ("cls" if head is not None else "mean")
            pooling = load_pooling_config(folder, default_mode=default)
        if torch.device(device).type != "cpu":
            encoder = encoder.to(device)
            head = head.to(device) if head is not None else None
        return cls(encoder, head, pooling, device, quantization)

    @property
    def has_classifier(self) -> bool:
        return self.head is not None

    @property
    def labels(self) -> list[str]:
        return self.config.labels

    @property
    def dimensions(self) -> int:
        """The width of an embedding: pooled, then through the modules after pooling (Dense …)."""
        return self.pooling.dimensions(self.config.hidden_size)

    def on_host(self) -> ReferenceEncoder:
        """This model, or a copy of it on the CPU when it lives on another device (e.g. for an ONNX export)."""
        if self.device.type == "cpu":
            return self
        encoder = copy.deepcopy(self.encoder).to("cpu")
        head = copy.deepcopy(self.head).to("cpu") if self.head is not None else None
        return ReferenceEncoder(encoder, head, self.pooling, "cpu", self.quantization)

    def tensors(
        self, batch: Sequence[Encoded], device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """input_ids [B, T], mask [B, T] bool or None (all rows full), token types [B, T] or None (all 0),
        built on the host and placed on DEVICE (default: the model's)."""
        if not batch:
            raise ValueError("empty batch")
        lengths = [len(e.ids) for e in batch]
        longest = max(lengths)
        if longest > self.config.max_tokens:
            raise ValueError(f"a row of {longest} tokens exceeds this model's {self.config.max_tokens} positions")
        ragged = min(lengths) != longest
        if ragged:
            pad = self.pad_id
            ids = torch.tensor([[*e.ids, *([pad] * (longest - n))] for e, n in zip(batch, lengths)])
        else:
            ids = torch.tensor([e.ids for e in batch])
        types = None
        if any(any(e.type_ids) for e in batch):
            types = torch.tensor([[*e.type_ids, *([0] * (longest - n))] for e, n in zip(batch, lengths)])
        mask = None
        if ragged:
            mask = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
        place = torch.device(device) if device is not None else self.device
        if place.type != "cpu":
            ids = ids.to(place, non_blocking=True)
            types = types.to(place, non_blocking=True) if types is not None else None
            mask = mask.to(place, non_blocking=True) if mask is not None else None
        return ids, mask, types

    @staticmethod
    def numpy(out: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(out.to(device="cpu", dtype=torch.float32).numpy())

    def token_states(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """Each row alone through the padded forward: its last hidden states [tokens, hidden], on
        the model's device in its dtype (what the token heads read: sparse, multi-vector, token labels)."""
        out: list[torch.Tensor] = []
        with torch.inference_mode():
            for row in batch:
                ids, mask, types = self.tensors([row])
                out.append(self.encoder(ids, mask, types)[0])
        return out

    def embed(self, batch: Sequence[Encoded]) -> np.ndarray:
        """Pooled (and normalized when configured) embeddings, float32 [B, D]."""
        with torch.inference_mode():
            ids, mask, types = self.tensors(batch)
            return self.numpy(pool(self.encoder(ids, mask, types), mask, self.pooling))

    def classify_logits(self, batch: Sequence[Encoded]) -> np.ndarray:
        """Sequence-classification logits, float32 [B, num_labels]."""
        if self.head is None:
            raise ValueError("this model has no sequence-classification head")
        with torch.inference_mode():
            ids, mask, types = self.tensors(batch)
            return self.numpy(self.head(self.encoder(ids, mask, types), mask))
