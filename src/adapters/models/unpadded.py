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
SDPA per run (`engines/gpu_kernels.py`), and on a CPU one C++ op serves every row and head
(`engines/cpu_op_library.py`). `PackedRows.build(batch, device)` puts every index tensor the
forward uses on the model's device.

Linears that run on a bounded set of row counts (oneDNN's primitives, `domain.worker.kernels.bucket_rows`)
get the forward padded once: `build(..., pad_to=bucket_rows)` appends padding tokens (id 0,
position 0) up to the bucket, so every matrix of the forward already has a bucket's rows and no
linear copies its input to pad it. Padding rows are independent of the real ones everywhere (the
linears and norms work row by row, attention reads and writes only the real tokens and leaves the
padding rows zero), and pooling and the heads read real tokens only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vllm_srun.adapters.models.pooling import PoolingConfig, pool
from vllm_srun.adapters.models.tokenization import Encoded

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class LayerLinears:
    qkv: Linear
    attn_out: Linear
    ffn_in_act: Linear  # the first feed-forward linear with its activation applied
    ffn_out: Linear


@dataclass(frozen=True, slots=True)
class PackedRows:
    """A forward's rows sorted longest first and laid back to back (tensors on the model's device)."""

    order: list[int]  # sorted position → caller's row index
    runs: list[tuple[int, int, int, int]]  # (first row, end row, length, first token) of equal-length rows
    ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    types: torch.Tensor | None  # [N], None when every type id is 0
    starts: torch.Tensor  # [B] first token of each sorted row
    lengths: torch.Tensor  # [B] tokens of each sorted row
    bounds: torch.Tensor  # int32 [B + 1]: each sorted row's first token, then N (variable-length kernels)
    inverse: torch.Tensor  # [B]: caller's row index → sorted position
    longest: int
    tokens: int  # real tokens (ids holds `rows_total`: these, then any padding)

    @property
    def rows_total(self) -> int:
        """Rows of the forward's matrices: the real tokens and the padding after them."""
        return int(self.ids.shape[0])

    @classmethod
    def build(
        cls, batch: Sequence[Encoded], device: torch.device | str = "cpu", pad_to: Callable[[int], int] | None = None
    ) -> PackedRows:
        """BATCH sorted and laid back to back; PAD_TO(tokens): the row count to pad the forward to."""
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
        # every index built in numpy and handed to torch without a copy: a torch op here would give
        # up the GIL and wait for it again, up to a switch interval beside a busy event loop
        n_tokens = token
        total = pad_to(n_tokens) if pad_to is not None else n_tokens
        ids_np = np.zeros(total, dtype=np.int64)
        ids_np[:n_tokens] = [t for r in rows for t in r.ids]
        positions_np = np.zeros(total, dtype=np.int64)
        positions_np[:n_tokens] = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
        types_np = None
        if any(any(r.type_ids) for r in rows):
            types_np = np.zeros(total, dtype=np.int64)
            types_np[:n_tokens] = [t for r in rows for t in r.type_ids]
        bounds_np = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(lengths, out=bounds_np[1:])
        inverse_np = np.empty(len(order), dtype=np.int64)
        inverse_np[order] = np.arange(len(order), dtype=np.int64)
        ids, positions, bounds, inverse = (torch.from_numpy(a) for a in (ids_np, positions_np, bounds_np, inverse_np))
        types = torch.from_numpy(types_np) if types_np is not None else None
        starts = torch.from_numpy(bounds_np[:-1].astype(np.int64))
        sizes = torch.from_numpy(np.asarray(lengths, dtype=np.int64))
        if torch.device(device).type != "cpu":  # built on the host, moved once
            ids, positions, bounds, inverse, starts, sizes = (
                t.to(device, non_blocking=True) for t in (ids, positions, bounds, inverse, starts, sizes)
            )
            types = types.to(device, non_blocking=True) if types is not None else None
        return cls(order, runs, ids, positions, types, starts, sizes, bounds, inverse, lengths[0], n_tokens)

    def unsort(self, sorted_rows: torch.Tensor) -> torch.Tensor:
        """Rows in sorted order → the caller's order."""
        return sorted_rows.index_select(0, self.inverse)


@dataclass(frozen=True, slots=True)
class EmbeddingTables:
    """A BERT-shaped encoder's embeddings, for ops that run a whole forward in one call (`ForwardOps.encode`):
    (word + position) + token type, then NORM; positions start at row OFFSET of the position table.
    TYPE None: the architecture has no token types (DistilBERT), and the rows' type ids are ignored."""

    word: torch.Tensor
    position: torch.Tensor
    type: torch.Tensor | None
    norm: torch.nn.LayerNorm
    offset: int


QUERY_BLOCK = 16  # the one-call CPU op's query block
KEY_GROUP = 8  # and key group: it reads distance tables for its padding too


def reach(longest: int) -> tuple[int, torch.Tensor]:
    """The column of distance 0 and the distances (query − key, ascending from −centre) that a table
    read by the one-call CPU op must hold for rows of up to LONGEST tokens."""
    centre = -(-longest // KEY_GROUP) * KEY_GROUP - 1
    width = centre + -(-longest // QUERY_BLOCK) * QUERY_BLOCK
    return centre, torch.arange(width) - centre


def covers(width: int, centre: int, longest: int) -> bool:
    """Whether a table WIDTH wide with distance 0 at CENTRE reaches what `reach(LONGEST)` asks."""
    need, distances = reach(longest)
    return centre >= need and width - centre >= len(distances) - need


@dataclass(frozen=True, slots=True)
class RelativeBias:
    """A score bias that depends only on the distance query − key (MPNet's relative positions, a
    sliding window, a causal mask): query i of a row scoring key j of head h adds
    TABLE[h, CENTRE + i − j]; −inf takes a key away (each query keeps its own). TABLE [heads, span]
    reaches past a forward's longest row on both sides, because the one-call CPU op reads it for its
    padded query blocks (16) and key groups (8) too: `over` builds it that wide."""

    table: torch.Tensor
    centre: int
    # `square`'s masks by row length: a forward's every layer and run of that length reads the same one
    _squares: dict[int, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def over(cls, longest: int, lookup: Callable[[torch.Tensor], torch.Tensor]) -> RelativeBias:
        """LOOKUP(distances) → [len(distances), heads] for the distances a forward whose longest row
        has LONGEST tokens can read."""
        centre, distances = reach(longest)
        return cls(lookup(distances).t().contiguous(), centre)

    @classmethod
    def causal(cls, longest: int, heads: int, like: torch.Tensor) -> RelativeBias:
        """Each query sees the keys at and before it (LIKE's device and dtype)."""
        return cls._seen(longest, heads, like, lambda distance: distance >= 0)

    @classmethod
    def window(cls, longest: int, reach: int, heads: int, like: torch.Tensor) -> RelativeBias:
        """Each query sees the keys at most REACH positions away, on either side."""
        return cls._seen(longest, heads, like, lambda distance: distance.abs() <= reach)

    @classmethod
    def _seen(
        cls, longest: int, heads: int, like: torch.Tensor, seen: Callable[[torch.Tensor], torch.Tensor]
    ) -> RelativeBias:
        """0 where SEEN(distance), −inf elsewhere, the same for every head."""

        def lookup(distance: torch.Tensor) -> torch.Tensor:
            bias = torch.where(seen(distance), 0.0, float("-inf")).to(like.device, like.dtype)
            return bias[:, None].expand(-1, heads)

        return cls.over(longest, lookup)

    def square(self, length: int) -> torch.Tensor:
        """[1, heads, LENGTH, LENGTH]: the bias a row of LENGTH tokens adds (an SDPA mask), built
        once per length."""
        if length not in self._squares:
            pos = torch.arange(length, device=self.table.device)
            self._squares[length] = self.table[:, self.centre + pos[:, None] - pos[None, :]][None]
        return self._squares[length]


@dataclass(frozen=True, slots=True)
class DisentangledTables:
    """DeBERTa's relative position terms for one layer, laid out by distance: column CENTRE + i − j of
    KEYS [heads, head_dim, width] holds the relative key query i reads against key j (its c2p term is
    scale · q_i · that column), and of QUERIES the relative query key j reads against query i,
    multiplied by the scale already (its p2c term is k_j · that column). A term the model does not
    use is a table of zeros. `covers(longest)`: whether the tables reach rows of LONGEST tokens."""

    keys: torch.Tensor
    queries: torch.Tensor
    centre: int

    def covers(self, longest: int) -> bool:
        return covers(int(self.keys.shape[2]), self.centre, longest)


POOLINGS = ("none", "cls", "mean")  # what `ForwardOps.encode` may pool: none (the hidden states), cls, mean


class ForwardOps:
    """Attention and the residual + norm steps of the unpadded forward, in eager torch: SDPA per run
    of equal-length rows, then `norm(delta + residual)`. GPU kernels subclass it."""

    name = "eager"
    norm_card = "torch add, then LayerNorm"  # what the card says of `add_norm`
    layers_card = "a Python loop over the layers"  # what the card says of `layers`
    stack_card = layers_card  # what the card says of `stack`

    def attention(
        self, qkv: torch.Tensor, packed: PackedRows, heads: int, relative: RelativeBias | None = None
    ) -> torch.Tensor:
        """[N, 3·H] → [N, H]: each row attends to its own tokens only (its scores biased by
        RELATIVE where given)."""
        n_rows, h = qkv.shape[0], qkv.shape[1] // 3
        attended = qkv.new_empty(n_rows, h)
        attended[packed.tokens :] = 0  # padding rows (`PackedRows.build`'s PAD_TO)
        for first, end, length, token in packed.runs:
            rows = end - first
            span = qkv[token : token + rows * length].view(rows, length, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            mask = relative.square(length) if relative is not None else None
            a = F.scaled_dot_product_attention(span[0], span[1], span[2], attn_mask=mask)
            attended[token : token + rows * length] = a.transpose(1, 2).reshape(rows * length, h)
        return attended

    def runs_biased(self, head_dim: int, dtype: torch.dtype) -> bool:
        """Whether `attention` with a RelativeBias is one call here for these heads (the eager ops
        run one SDPA per run with a full [L, L] mask, slower than SDPA's own causal path)."""
        return False

    def disentangled_attention(
        self, qkv: torch.Tensor, packed: PackedRows, heads: int, scale: float, tables: DisentangledTables
    ) -> torch.Tensor | None:
        """[N, 3·H] → [N, H] with DeBERTa's position terms from TABLES (see `DisentangledTables`),
        q · k scaled by SCALE, in one call; None where the ops have none (the eager ops: the caller
        runs its per-run bias)."""
        return None

    def add_norm(self, delta: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
        """NORM(DELTA + RESIDUAL). DELTA is a fresh result (a linear's output) that the forward never
        reads again: a subclass may write the answer over it."""
        return norm(delta + residual)

    def layers(
        self, x: torch.Tensor, packed: PackedRows, blocks: Sequence[Any], linears: Sequence[LayerLinears]
    ) -> torch.Tensor | None:
        """Every layer of a BERT-like encoder at once, or None: the caller runs its layer loop (the
        eager ops have no such call)."""
        return None

    def runs_stack(self, encoder: Any, linears: Sequence[LayerLinears]) -> bool:
        """Whether `stack` runs ENCODER's layers on these LINEARS (the eager ops never do)."""
        return False

    def stack(
        self,
        encoder: Any,
        linears: Sequence[LayerLinears],
        x: torch.Tensor,
        packed: PackedRows,
        inputs: tuple[Any, ...],
    ) -> torch.Tensor | None:
        """Every layer of ENCODER and its final norm at once, from the embedded tokens X, where ENCODER
        names a stack (`one_call_stack`: `decoder`, `modernbert`, `deberta`) the ops have: INPUTS are what its
        layer loop computes first (its rotary tables and masks: the encoder's `packed_forward` says
        which). None: the caller runs its layer loop (the eager ops have no such call)."""
        return None

    def hybrid_kernels(self) -> Any | None:
        """The kernels a Qwen3.5 backbone's Gated DeltaNet layers and layer loop run on with these
        ops (`models/qwen3_5_kernels.HybridKernels`); None: the model's own (torch's)."""
        return None

    def runs_whole(self, encoder: Any, linears: Sequence[LayerLinears]) -> bool:
        """Whether `encode` runs ENCODER's forwards on these LINEARS (the eager ops never do)."""
        return False

    def encode(
        self,
        encoder: Any,
        linears: Sequence[LayerLinears],
        batch: Sequence[Encoded],
        rows_total: int,
        pooling: str,
        normalize: bool,
    ) -> torch.Tensor | None:
        """A whole forward of ENCODER (embeddings, every layer, then POOLING, one of `POOLINGS`) in one
        call, its token rows padded to ROWS_TOTAL: `none` gives the hidden states [ROWS_TOTAL, H] with
        the rows back to back in BATCH's order, `cls` / `mean` [B, H] (L2-normalized when NORMALIZE).
        None where the ops have no such call for this encoder: the caller builds `PackedRows` and
        runs `packed_forward` (the eager ops never have one)."""
        return None


EAGER_OPS = ForwardOps()


Bias = Callable[[torch.Tensor, torch.Tensor, int], "torch.Tensor | None"]


def attend_runs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedRows,
    *,
    bias: Bias | None = None,
    scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention of every row over its own tokens, for architectures whose attention is more than
    plain SDPA: Q as [N, heads, head_dim], K and V as [N, kv_heads, head_dim] (already rotated,
    scaled or normed as the architecture wants; kv_heads divides heads), one SDPA per run of
    equal-length rows. BIAS(q_run, k_run, length) gives the run's additive score bias or bool mask
    ([rows or 1, heads or 1, L, L]; None for none), with q_run / k_run as [rows, heads, L, head_dim].
    CAUSAL: each token sees only the tokens before it (decoder backbones). Returns [N, heads · head_dim]."""
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    rep = heads // kv_heads
    out = q.new_empty(n, heads * d)
    out[packed.tokens :] = 0  # padding rows (`PackedRows.build`'s PAD_TO)
    for first, end, length, token in packed.runs:
        rows = end - first
        span = slice(token, token + rows * length)
        qr = q[span].view(rows, length, heads, d).transpose(1, 2)
        kr, vr = (t[span].view(rows, length, kv_heads, d).transpose(1, 2) for t in (k, v))
        if rep > 1:  # grouped-query attention: each K/V head serves REP query heads
            kr, vr = kr.repeat_interleave(rep, dim=1), vr.repeat_interleave(rep, dim=1)
        mask = bias(qr, kr, length) if bias is not None else None
        a = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale, is_causal=causal)
        out[span] = a.transpose(1, 2).reshape(rows * length, heads * d)
    return out


def pooled(hidden: torch.Tensor, packed: PackedRows, cfg: PoolingConfig) -> torch.Tensor:
    """Each row pooled over its own tokens, then through the modules after pooling (Dense,
    Normalize, …: `pooling.pool`, the padded forward's function too), [B, D] in the caller's order."""
    h = hidden.shape[1]
    parts = []
    for first, end, length, token in packed.runs:
        rows = end - first
        parts.append(pool(hidden[token : token + rows * length].view(rows, length, h), None, cfg))
    return packed.unsort(torch.cat(parts))


def classify(hidden: torch.Tensor, packed: PackedRows, head: Linear, *, first_token: bool = True) -> torch.Tensor:
    """Logits [B, labels] in the caller's order. FIRST_TOKEN: the head reads only each row's first
    token ([CLS], <s>), so it runs once on those; otherwise once per run on the run's whole rows."""
    if first_token:
        cls = hidden[packed.starts]
        return packed.unsort(head(cls[:, None, :]))
    h = hidden.shape[1]
    parts = [
        head(hidden[token : token + (end - first) * length].view(end - first, length, h))
        for first, end, length, token in packed.runs
    ]
    return packed.unsort(torch.cat(parts))
