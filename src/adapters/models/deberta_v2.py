"""Our own torch DeBERTa-v2 encoder (DeBERTa-v2, DeBERTa-v3, mDeBERTa), inference only, no `transformers`.

Reads a Hugging Face `DebertaV2Model` / `DebertaV2ForSequenceClassification` folder (`model_type`
"deberta-v2"). The maths, as the paper and the reference define it:

- embeddings: word (+ absolute positions when `position_biased_input`, + token types when
  `type_vocab_size` > 0), a linear `embed_proj` when `embedding_size` differs from `hidden_size`,
  LayerNorm; padded positions are zeroed;
- disentangled attention: the content score q·k plus, for `pos_att_type` "c2p", q_i · Kr[δ(i, j)]
  and, for "p2c", k_j · Qr[δ'(i, j)], where Kr / Qr are the shared relative embeddings
  (`rel_embeddings`, LayerNorm-ed when `norm_rel_ebd` says "layer_norm") projected by the block's
  own key / query weights (`share_att_key`) or by `pos_key_proj` / `pos_query_proj`; δ is the
  query-minus-key distance, log-bucketed past `position_buckets`/2 (`log_bucket`), shifted by the
  span and clamped to the table. Every term is divided by sqrt(head_dim · (1 + number of position
  terms));
- post-norm blocks like BERT's; after the first block an optional ConvLayer (`conv_kernel_size` > 0:
  conv1d over the embeddings, activation, LayerNorm(block output + conv)).

Q, K, V are merged into one linear (`qkv`); the position projections Kr / Qr of each block depend
only on the weights, so `prepare_relative` computes them once at load (buffers, moved with `.to`).
The padded forward passes the position terms (and the padded-key mask) to SDPA as an additive bias.
The unpadded one (`packed_forward`) hands Kr / Qr laid out by distance (`distance_tables`, kept
across forwards) to the one-call CPU op where it runs them (FP32, its head sizes), which adds both
terms inside its score loop, and where the ops have a layer stack for it (`ForwardOps.stack`,
`one_call_stack = "deberta"`: no convolution, the packed linears) every layer runs in one C++ call
with those tables; elsewhere it builds them per run of equal-length rows for `attend_runs`, reading
only the table rows a run's distances reach.

`deberta_v2_config.py` reads config.json and maps each distance to its relative-embedding row.
`load_deberta_v2(folder)` → `(DebertaV2Encoder, DebertaV2ClassificationHead | None)`: the head (pooler
dense + `pooler_hidden_act` on token 0, then the classifier) is there when the checkpoint has it.
`families/fixtures/deberta_v2_fixture.py` writes tiny random packages under transformers' names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.deberta_v2_config import (
    EXTRA_ACTIVATIONS,
    DebertaV2Config,
    relative_positions,
)
from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import (
    BERT_BLOCK_NAMES,
    PostNormBlock,
    load_parts,
    post_norm_block_state,
    take_linear,
)
from vllm_srun.adapters.models.unpadded import DisentangledTables, attend_runs, reach
from vllm_srun.adapters.models.weights import Weights

if TYPE_CHECKING:
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows


@dataclass(frozen=True)
class RelativeIndex:
    """For rows of one length L: which relative-table rows each score reads. `c2p[i, j]` indexes the
    c2p term of query i / key j; `p2c[j, i]` the p2c term (gathered along the key's row, then
    transposed); both relative to the first table row read (`c2p_rows` / `p2c_rows`)."""

    c2p: torch.Tensor  # [L, L] long
    p2c: torch.Tensor  # [L, L] long
    c2p_rows: slice
    p2c_rows: slice


class DebertaV2Embeddings(nn.Module):
    def __init__(self, cfg: DebertaV2Config) -> None:
        super().__init__()
        e, h = cfg.embedding_size, cfg.hidden_size
        # `_weight` skips the random init (slow on the meta device; every table is loaded anyway)
        self.word_embeddings = nn.Embedding(cfg.vocab_size, e, _weight=torch.empty(cfg.vocab_size, e))
        self.position_embeddings = (
            nn.Embedding(cfg.max_position_embeddings, e, _weight=torch.empty(cfg.max_position_embeddings, e))
            if cfg.position_biased_input
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(cfg.type_vocab_size, e, _weight=torch.empty(cfg.type_vocab_size, e))
            if cfg.type_vocab_size > 0
            else None
        )
        self.embed_proj = nn.Linear(e, h, bias=False) if e != h else None
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)

    def combine(self, words: torch.Tensor, positions: torch.Tensor | None, types: torch.Tensor | None) -> torch.Tensor:
        """Word vectors (+ position rows, + token types), projected and normed."""
        x = words
        if self.position_embeddings is not None and positions is not None:
            x = x + positions
        if self.token_type_embeddings is not None:
            x = x + (self.token_type_embeddings(types) if types is not None else self.token_type_embeddings.weight[0])
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.LayerNorm(x)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = self.position_embeddings.weight[:t] if self.position_embeddings is not None else None
        return self.combine(self.word_embeddings(input_ids), positions, token_type_ids)

    def packed(self, packed: PackedRows) -> torch.Tensor:
        positions = self.position_embeddings.weight[packed.positions] if self.position_embeddings is not None else None
        return self.combine(self.word_embeddings(packed.ids), positions, packed.types)


class DebertaV2Layer(PostNormBlock):
    """One post-norm block with disentangled attention."""

    def __init__(self, cfg: DebertaV2Config) -> None:
        h, d = cfg.hidden_size, cfg.attention_head_size
        inner = cfg.num_attention_heads * d
        super().__init__(cfg, inner)
        self.head_dim = d
        self.c2p = "c2p" in cfg.pos_att_type
        self.p2c = "p2c" in cfg.pos_att_type
        self.relative = cfg.uses_relative
        self.share_att_key = cfg.share_att_key
        # every score term is divided by this (the content term through SDPA's scale)
        self.divisor = math.sqrt(d * (1 + self.c2p + self.p2c))
        self.scale = 1.0 / self.divisor
        own = self.relative and not cfg.share_att_key
        self.pos_key_proj = nn.Linear(h, inner) if own and self.c2p else None
        self.pos_query_proj = nn.Linear(h, inner) if own and self.p2c else None
        # Kr / Qr [heads, 2·span, head_dim]: the relative embeddings projected (`set_relative`)
        self.register_buffer("pos_key", None, persistent=False)
        self.register_buffer("pos_query", None, persistent=False)

    @torch.no_grad()
    def set_relative(self, rel: torch.Tensor) -> None:
        """Project the (normed) relative embeddings [2·span, H] with this block's position weights."""
        inner = self.heads * self.head_dim

        def project(linear: nn.Linear | None, part: int) -> torch.Tensor:
            if linear is not None:
                y = linear(rel)
            else:  # share_att_key: the block's own query (part 0) / key (part 1) weights
                rows = slice(part * inner, (part + 1) * inner)
                y = F.linear(rel, self.qkv.weight[rows], self.qkv.bias[rows])
            return y.view(rel.shape[0], self.heads, self.head_dim).transpose(0, 1).contiguous()

        if self.c2p:
            self.pos_key = project(self.pos_key_proj, 1)
        if self.p2c:
            self.pos_query = project(self.pos_query_proj, 0)

    def distance_tables(self, rows: torch.Tensor, centre: int) -> DisentangledTables:
        """This block's relative keys and queries (the latter times the scale) at table ROWS, one
        column per distance (`DisentangledTables`); zeros for a term the block does not have."""

        table_like = self.pos_key if self.pos_key is not None else self.pos_query
        assert table_like is not None, "prepare_relative() was not called after loading"

        def laid(table: torch.Tensor | None, factor: float) -> torch.Tensor:
            if table is None:
                return table_like.new_zeros(self.heads, self.head_dim, len(rows))
            return (table[:, rows] * factor).transpose(1, 2).contiguous()

        return DisentangledTables(laid(self.pos_key, 1.0), laid(self.pos_query, self.scale), centre)

    def position_bias(self, q: torch.Tensor, k: torch.Tensor, index: RelativeIndex) -> torch.Tensor:
        """The c2p + p2c score terms [B, heads, L, L] for Q, K [B, heads, L, head_dim], already divided."""
        b, heads, n, _ = q.shape
        score = None
        if self.c2p:
            assert self.pos_key is not None, "prepare_relative() was not called after loading"
            c2p = torch.matmul(q, self.pos_key[:, index.c2p_rows].transpose(-1, -2))
            c2p = torch.gather(c2p, -1, index.c2p.expand(b, heads, n, n))
            score = c2p / self.divisor
        if self.p2c:
            assert self.pos_query is not None, "prepare_relative() was not called after loading"
            p2c = torch.matmul(k, self.pos_query[:, index.p2c_rows].transpose(-1, -2))
            p2c = torch.gather(p2c, -1, index.p2c.expand(b, heads, n, n)).transpose(-1, -2)
            score = p2c / self.divisor if score is None else score + p2c / self.divisor
        assert score is not None
        return score

    def run_bias(
        self, indices: dict[int, RelativeIndex], q: torch.Tensor, k: torch.Tensor, length: int
    ) -> torch.Tensor:
        """`attend_runs`' BIAS for a run of LENGTH-token rows."""
        return self.position_bias(q, k, indices[length])

    def forward(self, x: torch.Tensor, index: RelativeIndex | None, key_mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        mask = self.position_bias(q, k, index) if self.relative and index is not None else None
        if key_mask is not None:  # padded keys: never attended
            mask = key_mask if mask is None else mask.masked_fill(~key_mask, torch.finfo(mask.dtype).min)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        a = a.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.feed_forward(self.attn_norm(self.attn_out(a) + x))


class ConvLayer(nn.Module):
    """After the first block: LayerNorm(block output + act(conv1d(embeddings))), each row zero-padded."""

    def __init__(self, cfg: DebertaV2Config) -> None:
        super().__init__()
        h, k = cfg.hidden_size, cfg.conv_kernel_size
        self.conv = nn.Conv1d(h, h, k, padding=(k - 1) // 2, groups=cfg.conv_groups)
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.act = EXTRA_ACTIVATIONS[cfg.conv_act]

    def convolve(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, T, H] → [B, T, H]: the convolution over each row's tokens."""
        return self.conv(rows.transpose(1, 2)).transpose(1, 2)

    def forward(self, embedded: torch.Tensor, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        out = self.convolve(embedded)
        if keep is not None:
            out = out.masked_fill(~keep[..., None], 0.0)
        y = self.LayerNorm(x + self.act(out))
        return y * keep[..., None].to(y.dtype) if keep is not None else y

    def packed(self, embedded: torch.Tensor, x: torch.Tensor, packed: PackedRows, ops: ForwardOps) -> torch.Tensor:
        h = embedded.shape[1]
        out = torch.empty_like(embedded)
        out[packed.tokens :] = 0  # padding rows
        for first, end, length, token in packed.runs:
            span = slice(token, token + (end - first) * length)
            out[span] = self.convolve(embedded[span].view(end - first, length, h)).reshape(-1, h)
        return ops.add_norm(self.act(out), x, self.LayerNorm)


class DebertaV2Encoder(EncoderModuleDefaults, nn.Module):
    """Embeddings + the blocks (+ the relative embeddings); `forward` returns the last hidden state [B, T, H]."""

    one_call_stack = "deberta"  # `ForwardOps.stack` (engines/cpu_stacks.py) runs every layer at once

    def __init__(self, cfg: DebertaV2Config) -> None:
        super().__init__()
        self.config = cfg
        h, span = cfg.hidden_size, cfg.relative_span
        self.embeddings = DebertaV2Embeddings(cfg)
        self.layers = nn.ModuleList(DebertaV2Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.rel_embeddings = (
            nn.Embedding(2 * span, h, _weight=torch.empty(2 * span, h)) if cfg.relative_attention else None
        )
        self.rel_norm = (
            nn.LayerNorm(h, eps=cfg.layer_norm_eps)
            if cfg.relative_attention and "layer_norm" in cfg.norm_rel_ebd
            else None
        )
        self.conv = ConvLayer(cfg) if cfg.conv_kernel_size > 0 else None
        self.relative = cfg.uses_relative
        self._tables: list[DisentangledTables] | None = None  # `distance_tables`, widest so far

    @property
    def blocks(self) -> list[DebertaV2Layer]:
        """The transformer blocks, typed (an `nn.ModuleList` yields plain modules)."""
        return cast("list[DebertaV2Layer]", list(self.layers))

    @torch.no_grad()
    def prepare_relative(self) -> None:
        """Compute every block's projected relative embeddings; call once the weights are loaded."""
        if self.rel_embeddings is None:
            return
        rel = self.rel_embeddings.weight
        if self.rel_norm is not None:
            rel = self.rel_norm(rel)
        for layer in self.blocks:
            layer.set_relative(rel)
        self._tables = None

    def distance_tables(self, longest: int) -> list[DisentangledTables]:
        """Every block's position terms by distance (the one-call CPU op's), reaching rows of LONGEST
        tokens: built for the next power of two (at least 64, at most the model's rows) and kept until
        a longer row needs more, so that a forward rarely builds them. Two forwards at once may both
        build them; each uses its own."""
        tables = self._tables
        if tables is None or not tables[0].covers(longest):
            size = max(longest, min(max(64, 1 << (longest - 1).bit_length()), self.config.max_tokens))
            centre, distances = reach(size)
            span = self.config.relative_span
            # the table row of each distance query − key: both terms read the same one (the
            # buckets are odd in the distance, so p2c's span − bucket(j − i) is span + bucket(i − j))
            rows = (relative_positions(distances, self.config) + span).clamp(0, 2 * span - 1)
            assert self.rel_embeddings is not None  # relative attention has its table
            rows = rows.to(self.rel_embeddings.weight.device)
            tables = [layer.distance_tables(rows, centre) for layer in self.blocks]
            self._tables = tables
        return tables

    def _index(self, distance: torch.Tensor, c2p_rows: slice, p2c_rows: slice) -> RelativeIndex:
        """Table rows for a [L, L] grid of query-minus-key distances (p2c: key-minus-query, transposed)."""
        top = 2 * self.config.relative_span - 1
        rel = relative_positions(distance, self.config)
        c2p = (rel + self.config.relative_span).clamp(0, top) - (c2p_rows.start or 0)
        p2c = (self.config.relative_span - rel).clamp(0, top) - (p2c_rows.start or 0)
        return RelativeIndex(c2p, p2c, c2p_rows, p2c_rows)

    def padded_index(self, input_ids: torch.Tensor) -> RelativeIndex:
        """The whole table for T-token rows, in tensor ops only (the ONNX export traces it)."""
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        whole = slice(0, 2 * self.config.relative_span)
        return self._index(pos[:, None] - pos[None, :], whole, whole)

    def run_index(self, length: int, device: torch.device) -> RelativeIndex:
        """For LENGTH-token rows: only the table rows their distances reach (a short row reads a few)."""
        span, top = self.config.relative_span, 2 * self.config.relative_span - 1
        rel = relative_positions(torch.arange(-(length - 1), length), self.config)
        c2p, p2c = (rel + span).clamp(0, top), (span - rel).clamp(0, top)
        c2p_rows = slice(int(c2p.min()), int(c2p.max()) + 1)
        p2c_rows = slice(int(p2c.min()), int(p2c.max()) + 1)
        pos = torch.arange(length, device=device)
        return self._index(pos[:, None] - pos[None, :], c2p_rows, p2c_rows)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        t = input_ids.shape[1]
        if t > self.config.max_tokens:
            raise ValueError(f"row of {t} tokens exceeds the {self.config.max_tokens} positions of this model")
        x = self.embeddings(input_ids, token_type_ids)
        keep = key_mask = None
        if attention_mask is not None:  # [B, T], True / 1 = a real token
            keep = attention_mask.to(torch.bool)
            x = x * keep[..., None].to(x.dtype)
            key_mask = keep[:, None, None, :]
        index = self.padded_index(input_ids) if self.relative else None
        embedded = x
        for i, layer in enumerate(self.layers):
            x = layer(x, index, key_mask)
            if i == 0 and self.conv is not None:
                x = self.conv(embedded, x, keep)
        return x

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor:
        """The last hidden state of every real token, [N, H], rows in PACKED's sorted order."""
        x = self.embeddings.packed(packed)
        device = x.device
        head_dim = self.config.attention_head_size
        # the position terms in the one-call op where it runs them, else a bias per run of rows
        tables = self.distance_tables(packed.longest) if self.relative and ops.runs_biased(head_dim, x.dtype) else None
        if tables is not None:  # every layer in one call where the ops have it
            stacked = ops.stack(self, linears, x, packed, (tables,))
            if stacked is not None:
                return stacked
        indices: dict[int, RelativeIndex] = {}  # the per-run path's, built at its first use
        embedded = x
        for i, (layer, lin) in enumerate(zip(self.blocks, linears)):
            n = x.shape[0]
            qkv = lin.qkv(x)
            attended = None
            if tables is not None:
                attended = ops.disentangled_attention(qkv, packed, layer.heads, layer.scale, tables[i])
            elif not layer.relative:  # plain attention, scaled by 1 / sqrt(head_dim)
                attended = ops.attention(qkv, packed, layer.heads)
            if attended is None:
                if layer.relative and not indices:
                    indices.update((length, self.run_index(length, device)) for _, _, length, _ in packed.runs)
                q, k, v = qkv.view(n, 3, layer.heads, layer.head_dim).unbind(1)
                bias = partial(layer.run_bias, indices) if layer.relative else None
                attended = attend_runs(q, k, v, packed, bias=bias, scale=layer.scale)
            x = ops.add_norm(lin.attn_out(attended), x, layer.attn_norm)
            x = ops.add_norm(lin.ffn_out(lin.ffn_in_act(x)), x, layer.ffn_norm)
            if i == 0 and self.conv is not None:
                x = self.conv.packed(embedded, x, packed, ops)
        return x


class ContextPooler(nn.Module):
    """dense + `pooler_hidden_act` on the first ([CLS]) token."""

    def __init__(self, hidden: int, act: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.act = EXTRA_ACTIVATIONS[act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(hidden_states[:, 0]))


class DebertaV2ClassificationHead(nn.Module):
    """`DebertaV2ForSequenceClassification`'s head: the context pooler, then a linear layer to the logits."""

    reads_first_token = True  # the unpadded forward may hand it each row's first token alone

    def __init__(self, cfg: DebertaV2Config) -> None:
        super().__init__()
        self.pooler = ContextPooler(cfg.hidden_size, cfg.pooler_hidden_act)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.classifier(self.pooler(hidden_states))


def _encoder_state(w: Weights, cfg: DebertaV2Config) -> dict[str, torch.Tensor]:
    state = {
        **take_linear(w, "embeddings.word_embeddings", "embeddings.word_embeddings", bias=False),
        **take_linear(w, "embeddings.LayerNorm", "embeddings.LayerNorm"),
    }
    if cfg.position_biased_input:
        state.update(take_linear(w, "embeddings.position_embeddings", "embeddings.position_embeddings", bias=False))
    if cfg.type_vocab_size > 0:
        state.update(take_linear(w, "embeddings.token_type_embeddings", "embeddings.token_type_embeddings", bias=False))
    if cfg.embedding_size != cfg.hidden_size:
        state.update(take_linear(w, "embeddings.embed_proj", "embeddings.embed_proj", bias=False))
    if cfg.relative_attention:
        state.update(take_linear(w, "rel_embeddings", "encoder.rel_embeddings", bias=False))
        if "layer_norm" in cfg.norm_rel_ebd:
            state.update(take_linear(w, "rel_norm", "encoder.LayerNorm"))
    if cfg.conv_kernel_size > 0:
        state.update(take_linear(w, "conv.conv", "encoder.conv.conv"))
        state.update(take_linear(w, "conv.LayerNorm", "encoder.conv.LayerNorm"))
    own = cfg.uses_relative and not cfg.share_att_key
    qkv = [f"attention.self.{n}_proj" for n in ("query", "key", "value")]
    for i in range(cfg.num_hidden_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        state |= post_norm_block_state(w, src, dst, qkv, BERT_BLOCK_NAMES)
        if own and "c2p" in cfg.pos_att_type:
            state.update(take_linear(w, dst + "pos_key_proj", src + "attention.self.pos_key_proj"))
        if own and "p2c" in cfg.pos_att_type:
            state.update(take_linear(w, dst + "pos_query_proj", src + "attention.self.pos_query_proj"))
    return state


def _head_state(w: Weights, cfg: DebertaV2Config) -> dict[str, torch.Tensor] | None:
    if "classifier.weight" not in w or "pooler.dense.weight" not in w:  # bare, or a token head
        return None
    return take_linear(w, "pooler.dense", "pooler.dense") | take_linear(w, "classifier", "classifier")


def load_deberta_v2(
    folder: Path, dtype: torch.dtype = torch.float32
) -> tuple[DebertaV2Encoder, DebertaV2ClassificationHead | None]:
    """Read config.json and the safetensors of FOLDER: the encoder, and the head when there is one."""
    encoder, head = load_parts(
        folder,
        dtype,
        config=DebertaV2Config.from_folder,
        encoder=DebertaV2Encoder,
        head=DebertaV2ClassificationHead,
        encoder_state=_encoder_state,
        head_state=_head_state,
    )
    encoder.prepare_relative()
    return encoder, head
