"""The encoder forward without padding (the *packed* accounting of R-BAT-2 on a CPU).

A padded forward computes rows × longest row tokens; on a CPU every padded token costs as much
as a real one in the linear layers, which are most of the work. Here the rows of a forward are
laid back to back as one [N, H] matrix of real tokens only: embeddings, the Q/K/V, output and
feed-forward linears and the norms run on N = Σ lengths rows. Only attention needs the rows
apart: rows are grouped into runs of equal length (sorted once per forward) and each run
attends over its own tokens with no mask and no padding. Pooling and the classification head
read each row's own tokens; answers come back in the caller's row order.

Rows are independent except through the shapes of the linear layers' matrix products, so a
forward's answers equal each row run alone up to rounding (`tests/integration/test_unpadded.py`).
The linears are passed in (`LayerLinears`), so the same forward runs on eager `nn.Linear`s or on
pre-packed oneDNN copies; so are attention and the residual + norm steps (`ForwardOps`), so on a
GPU one launch of a variable-length attention kernel can serve every row and head instead of one
SDPA per run (`engines/gpu_kernels.py`). `PackedRows.build(batch, device)` puts every index
tensor the forward uses on the model's device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from vllm_srun.adapters.models.bert import BertEncoder, BertLayer
from vllm_srun.adapters.models.pooling import PoolingConfig, pool
from vllm_srun.adapters.models.tokenization import Encoded

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class LayerLinears:
    qkv: Linear
    attn_out: Linear
    ffn_in_act: Linear  # the first feed-forward linear with its activation applied
    ffn_out: Linear


def _ffn_in_act(layer: BertLayer, x: torch.Tensor) -> torch.Tensor:
    return layer.act(layer.ffn_in(x))


def eager_linears(encoder: BertEncoder) -> list[LayerLinears]:
    return [
        LayerLinears(layer.qkv, layer.attn_out, partial(_ffn_in_act, layer), layer.ffn_out) for layer in encoder.blocks
    ]


@dataclass(frozen=True, slots=True)
class PackedRows:
    """A forward's rows sorted longest first and laid back to back (tensors on the model's device)."""

    order: list[int]  # sorted position → caller's row index
    runs: list[tuple[int, int, int, int]]  # (first row, end row, length, first token) of equal-length rows
    ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    types: torch.Tensor | None  # [N], None when every type id is 0
    starts: torch.Tensor  # [B] first token of each sorted row
    bounds: torch.Tensor  # int32 [B + 1]: each sorted row's first token, then N (variable-length kernels)
    inverse: torch.Tensor  # [B]: caller's row index → sorted position
    longest: int

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    @classmethod
    def build(cls, batch: Sequence[Encoded], device: torch.device | str = "cpu") -> PackedRows:
        if not batch:
            raise ValueError("empty batch")
        order = sorted(range(len(batch)), key=lambda i: -len(batch[i].ids))
        rows = [batch[i] for i in order]
        lengths = [len(r.ids) for r in rows]
        runs, token, start = [], 0, 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or lengths[i] != lengths[start]:
                runs.append((start, i, lengths[start], token))
                token += (i - start) * lengths[start]
                start = i
        ids = torch.tensor([t for r in rows for t in r.ids])
        positions = (
            torch.cat([torch.arange(n) for n in lengths])
            if len(runs) > 1
            else torch.arange(lengths[0]).repeat(len(rows))
        )
        types = None
        if any(any(r.type_ids) for r in rows):
            types = torch.tensor([t for r in rows for t in r.type_ids])
        bounds = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        if torch.device(device).type != "cpu":  # built on the host, moved once
            ids, positions, bounds, inverse = (
                t.to(device, non_blocking=True) for t in (ids, positions, bounds, inverse)
            )
            types = types.to(device, non_blocking=True) if types is not None else None
        starts = bounds[:-1].long()
        return cls(order, runs, ids, positions, types, starts, bounds, inverse, lengths[0])

    def unsort(self, sorted_rows: torch.Tensor) -> torch.Tensor:
        """Rows in sorted order → the caller's order."""
        return sorted_rows.index_select(0, self.inverse)


class ForwardOps:
    """Attention and the residual + norm steps of the unpadded forward, in eager torch: SDPA per run
    of equal-length rows, then `norm(delta + residual)`. GPU kernels subclass it."""

    name = "eager"

    def attention(self, qkv: torch.Tensor, packed: PackedRows, heads: int) -> torch.Tensor:
        """[N, 3·H] → [N, H]: each row attends to its own tokens only."""
        n_tokens, h = qkv.shape[0], qkv.shape[1] // 3
        attended = qkv.new_empty(n_tokens, h)
        for first, end, length, token in packed.runs:
            rows = end - first
            span = qkv[token : token + rows * length].view(rows, length, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(span[0], span[1], span[2])
            attended[token : token + rows * length] = a.transpose(1, 2).reshape(rows * length, h)
        return attended

    def add_norm(self, delta: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
        return norm(delta + residual)


EAGER_OPS = ForwardOps()


def hidden_states(
    encoder: BertEncoder, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps = EAGER_OPS
) -> torch.Tensor:
    """The last hidden state of every real token, [N, H], rows in sorted order."""
    emb = encoder.embeddings
    x = emb.word_embeddings(packed.ids) + emb.position_embeddings.weight[emb.offset + packed.positions]
    if packed.types is None:
        x = x + emb.token_type_embeddings.weight[0]
    else:
        x = x + emb.token_type_embeddings(packed.types)
    x = emb.LayerNorm(x)
    for layer, lin in zip(encoder.blocks, linears):
        attended = ops.attention(lin.qkv(x), packed, layer.heads)
        x = ops.add_norm(lin.attn_out(attended), x, layer.attn_norm)
        x = ops.add_norm(lin.ffn_out(lin.ffn_in_act(x)), x, layer.ffn_norm)
    return x


def pooled(hidden: torch.Tensor, packed: PackedRows, cfg: PoolingConfig) -> torch.Tensor:
    """Each row pooled over its own tokens, [B, D] in the caller's order."""
    h = hidden.shape[1]
    parts = []
    for first, end, length, token in packed.runs:
        rows = end - first
        parts.append(pool(hidden[token : token + rows * length].view(rows, length, h), None, cfg))
    return packed.unsort(torch.cat(parts))


def classify(hidden: torch.Tensor, packed: PackedRows, head: Linear) -> torch.Tensor:
    """Logits from each row's first ([CLS]) token, [B, labels] in the caller's order."""
    cls = hidden[packed.starts]
    return packed.unsort(head(cls[:, None, :]))
