"""Token-classification heads on `/v1/classify` (issue 24): what the surface asks of a model whose
head labels every token (`*ForTokenClassification`) instead of the whole input.

- `TokenLogitsRow`: the payload of such a row; the model answers it with float32 logits
  [tokens, labels], one row per token of `encoded` (special tokens included).
- `TokenClassifier`: a model whose `classify_kind` is `token`; `labels` name the head's outputs
  in order. A sequence head's model has no `classify_kind` (or `sequence`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vllm_srun.adapters.contracts.capability import Capability
from vllm_srun.adapters.contracts.common import Encoded

__all__ = ["CLASSIFY_KINDS", "TokenClassifier", "TokenLogitsRow", "is_token_classifier"]

CLASSIFY_KINDS = ("sequence", "token")


@dataclass(frozen=True, slots=True)
class TokenLogitsRow:
    encoded: Encoded


@runtime_checkable
class TokenClassifier(Protocol):
    classify_kind: str
    labels: list[str]


is_token_classifier: Capability[TokenClassifier] = Capability(TokenClassifier)  # per request (`capability.py`)
