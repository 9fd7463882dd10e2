"""What an encoder architecture gives the encoder family and its engines, whatever its maths.

Every architecture (`bert.py` for BERT / RoBERTa / XLM-RoBERTa, `distilbert.py`, `mpnet.py`,
`deberta_v2.py`, `modernbert.py`, `decoder_encoder.py` for Qwen3 / Qwen2 / Llama embedders and
yes/no rerankers) is a module with a loader `load(folder, dtype) -> (encoder, head | None)`
(registered in `encoders.py`), an encoder module and an optional head that follow the protocols
below. The engines only ever talk to these protocols:

- the padded reference forward `encoder(ids, mask, types)` (`ReferenceEncoder`, the ONNX export,
  the oneDNN numerics check) — right-padded rows, `mask` a bool [B, T] (True = real token) or
  None when every row is full, `types` [B, T] or None (all 0);
- the unpadded serving forward `encoder.packed_forward(packed, linears, ops)` (`unpadded.py`):
  rows back to back as [N, H], the four linears of each block taken from LINEARS (eager
  `nn.Linear`s or the oneDNN packed copies), attention per run of equal-length rows;
- `encoder.blocks`: each block's four linears under the names `qkv` (Q, K and V concatenated in
  that order), `attn_out`, `ffn_in` and `ffn_out`, plus `hidden_act`, `glu` and `activate(y)` (the
  activation that follows `ffn_in`: `act(y)`, or `act(a) * g` for a gated unit where `y = [a, g]`),
  so that `cpu_onednn.PackedEncoder` packs any architecture's linears the same way;
- the optional attributes the engines read (`default_pooling`, `asks_for_layers`, `one_call_stack`,
  `hybrid_backbone`, `embedding_tables()`, `distance_table()`), declared on `EncoderModule` and
  given their defaults by `EncoderModuleDefaults`, which every encoder module derives from;
- `head(hidden, mask)`: [B, T, H] (+ the padded mask) → logits [B, num_labels]; the unpadded
  forward calls it per run of equal-length rows with `mask=None`.

A config (`encoder.config`) exposes the fields of `EncoderConfigLike`; the family and the engines
read nothing else of it.

Two functions serve the engines over these protocols: `eager_linears(encoder)`, each block's four
linears as `LayerLinears` (eager `nn.Linear`s, activation applied after `ffn_in`), and
`hidden_states(encoder, packed, linears, ops)`, the unpadded forward's last hidden states. This
module imports `unpadded.py` (the forward's rows, linears and ops), never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import torch
from torch import nn

from vllm_srun.adapters.models.unpadded import (
    EAGER_OPS,
    EmbeddingTables,
    ForwardOps,
    LayerLinears,
    PackedRows,
    RelativeBias,
)


class EncoderConfigLike(Protocol):
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    hidden_act: str
    pad_token_id: int
    num_labels: int
    problem_type: str | None

    @property
    def max_tokens(self) -> int:
        """The longest row (special tokens included) the model can take."""
        ...

    @property
    def labels(self) -> list[str]: ...


class EncoderBlock(Protocol):
    qkv: nn.Linear
    attn_out: nn.Linear
    ffn_in: nn.Linear
    ffn_out: nn.Linear
    hidden_act: str
    glu: bool

    def activate(self, y: torch.Tensor) -> torch.Tensor: ...


class EncoderModule(Protocol):
    """Every attribute the engines read of an encoder module (`EncoderModuleDefaults` gives the
    optional ones their defaults, so that an engine reads them plainly, never probing)."""

    config: EncoderConfigLike
    # the pooling a package without sentence-transformers settings gets; None: cls with a head, else mean
    default_pooling: str | None
    # `packed_forward` runs BERT-shaped layers through `ForwardOps.layers` where the ops have it
    asks_for_layers: bool
    # the C++ stack (`engines/cpu_stacks.STACKS`) that runs every layer in one call; "" for none
    one_call_stack: str
    # a hybrid backbone (Qwen3.5) runs its own layers on `ForwardOps.hybrid_kernels`
    hybrid_backbone: bool

    @property
    def blocks(self) -> Sequence[EncoderBlock]: ...

    def embedding_tables(self) -> EmbeddingTables | None:
        """A BERT-shaped encoder's embeddings for the one-call forward (`ForwardOps.encode`); None
        where the encoder is not BERT-shaped."""
        ...

    def distance_table(self, longest: int | None = None) -> RelativeBias | None:
        """Every layer's relative-position bias held with the one-call forward's weights (MPNet); None without one."""
        ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True): ...  # nn.Module's

    def to(self, *args, **kwargs): ...  # nn.Module's

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor: ...


class EncoderModuleDefaults:
    """The optional attributes of `EncoderModule` at their defaults: every encoder module derives
    from it (beside `nn.Module`) and overrides what it has."""

    default_pooling: str | None = None
    asks_for_layers: bool = False
    one_call_stack: str = ""
    hybrid_backbone: bool = False

    def embedding_tables(self) -> EmbeddingTables | None:
        return None

    def distance_table(self, longest: int | None = None) -> RelativeBias | None:
        return None


class EncoderHead(Protocol):
    reads_first_token: bool  # only token 0 of each row matters: the unpadded forward hands it that alone

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor: ...

    def to(self, *args, **kwargs): ...  # nn.Module's


Loader = Callable[..., "tuple[EncoderModule, EncoderHead | None]"]


def _ffn_in_act(layer: EncoderBlock, x: torch.Tensor) -> torch.Tensor:
    return layer.activate(layer.ffn_in(x))


def eager_linears(encoder: EncoderModule) -> list[LayerLinears]:
    """Each block's four linears, eager (the first feed-forward linear with its activation)."""
    return [
        LayerLinears(layer.qkv, layer.attn_out, partial(_ffn_in_act, layer), layer.ffn_out) for layer in encoder.blocks
    ]


def hidden_states(
    encoder: EncoderModule, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps = EAGER_OPS
) -> torch.Tensor:
    """The last hidden state of every real token, [N, H], rows in sorted order (the architecture's
    own `packed_forward`)."""
    return encoder.packed_forward(packed, linears, ops)
