"""The head of a `*ForTokenClassification` package (issue 24): a linear layer over every token's
last hidden state → one logit per label, as transformers' `BertForTokenClassification`,
`RobertaForTokenClassification`, `DistilBertForTokenClassification` and
`DebertaV2ForTokenClassification` store it (`classifier.weight` [labels, hidden] and
`classifier.bias`, no pooler — the architecture loaders read such a checkpoint as a bare encoder).

`is_token_classifier(config)` tells such a package by config.json's `architectures`. Each row runs
alone through the encoder's padded reference forward (float32 head), so a row's logits never
depend on the rows it shares a batch with. torch is imported only when a head is read or run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the family reads `is_token_classifier` without loading torch
    import torch

TOKEN_ARCHITECTURE_SUFFIX = "ForTokenClassification"
HEAD_NAMES = ("classifier.weight", "classifier.bias")


def is_token_classifier(config: dict[str, Any]) -> bool:
    return any(str(a).endswith(TOKEN_ARCHITECTURE_SUFFIX) for a in config.get("architectures") or [])


class TokenClassificationHead:
    """hidden [T, H] → logits [T, labels] (float32)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.weight = weight.float()
        self.bias = bias.float()

    @property
    def num_labels(self) -> int:
        return int(self.weight.shape[0])

    def to(self, device: torch.device) -> TokenClassificationHead:
        self.weight, self.bias = self.weight.to(device), self.bias.to(device)
        return self

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.linear(hidden.float(), self.weight, self.bias)


def read_token_head(folder: Path, hidden_size: int, num_labels: int) -> TokenClassificationHead:
    """The `classifier` tensors of FOLDER's checkpoint (any prefix is ignored); WeightsError when
    they are missing or do not fit HIDDEN_SIZE and NUM_LABELS."""
    from safetensors import safe_open

    from vllm_srun.adapters.models.weights import WeightsError, safetensors_files

    found: dict[str, torch.Tensor] = {}
    for file in safetensors_files(Path(folder)):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                name = next((n for n in HEAD_NAMES if key == n or key.endswith("." + n)), None)
                if name is not None and not key.startswith(("pooler.", "cls.")):
                    found[name] = f.get_tensor(key)
    missing = [n for n in HEAD_NAMES if n not in found]
    if missing:
        raise WeightsError(f"a token-classification package needs {', '.join(missing)} in {folder}")
    weight, bias = found["classifier.weight"], found["classifier.bias"]
    if tuple(weight.shape) != (num_labels, hidden_size) or tuple(bias.shape) != (num_labels,):
        raise WeightsError(
            f"classifier.weight {tuple(weight.shape)} / bias {tuple(bias.shape)} do not fit "
            f"{num_labels} labels over hidden size {hidden_size}"
        )
    return TokenClassificationHead(weight, bias)


def token_logits(reference: Any, head: TokenClassificationHead, rows: Sequence[Any]) -> list[np.ndarray]:
    """Each row (an `Encoded`) alone through REFERENCE's padded forward and HEAD: float32 [T, labels]."""
    return head_logits(head, reference.token_states(rows))


def head_logits(head: TokenClassificationHead, states: Sequence[Any]) -> list[np.ndarray]:
    """HEAD over each row's token states (its last hidden states [T, H], from the row alone through
    the padded forward: `ReferenceEncoder.token_states`): float32 [T, labels]."""
    import torch

    with torch.inference_mode():
        return [np.ascontiguousarray(head(hidden).to("cpu", torch.float32).numpy()) for hidden in states]
