"""Decoder backbones (Qwen3 / Qwen2 / Llama) on the encoder surfaces: last-token embedders
(Qwen3-Embedding, gte-Qwen2 …) and yes/no rerankers (the Qwen3-Reranker recipe).

`load_decoder_encoder(folder, dtype)` → `(DecoderEncoder, head | None)`. The encoder wraps our
`DecoderLM` (`decoder.py`: config, embeddings, RMSNorms, rotary tables) and follows
`encoder_arch.EncoderModule`:
- padded `forward(ids, mask, types)` → final-normed hidden states [B, T, H] of RIGHT-padded rows:
  attention is causal, so padding after a row's real tokens never changes them (the mask is not
  needed; padded positions hold meaningless values that pooling and the heads never read);
- `packed_forward(packed, linears, ops)` → [N, H]: every token of the forward back to back through
  the linears as one matrix, rotary at `packed.positions` (restarting at 0 per row), causal
  attention of each row over its own tokens (never across rows): in one call of `ops.attention`
  for every row, causality as a bias of the distance (`RelativeBias.causal`, K/V heads repeated for
  grouped-query attention), where the ops run that in one call (the CPU's C++ op, FP32), else one
  causal SDPA per run of equal-length rows; where the ops have a layer stack for it
  (`ForwardOps.stack`, `one_call_stack = "decoder"`: the CPU's packed linears, FP32) every layer and
  the final norm run in one C++ call instead. The blocks are pre-norm (`x + delta`, the norm of the
  sum feeding the next linear), so `ops.add_norm` (post-norm) has nothing to do here;
- `blocks`: one `DecoderBlock` per layer with `qkv` (q_proj, k_proj, v_proj concatenated: sizes differ
  under GQA), `attn_out` (o_proj), `ffn_in` (gate_proj, up_proj concatenated; `glu`, `activate(y) =
  silu(gate) * up`), `ffn_out` (down_proj). The concatenated linears own the weights; the wrapped
  model's q/k/v, gate and up projections are views of them (re-tied after `.to()`).
`default_pooling` is `lasttoken` (each row's last real token, under any padding side).

Heads (`decoder_heads.py`): `ScoreHead` for a `…ForSequenceClassification` checkpoint
(`score.weight`, read where transformers reads it: config.json's `pad_token_id` kept as
`config_pad_token_id`); otherwise `YesNoHead` when srun.json has `rerank` or lists the `rerank`
surface. A `…ForTokenClassification` checkpoint loads as the bare backbone: the family reads its
`score` layer as a token head. The wrapped model's output layer is not kept (only the yes/no head's
two rows are): its `logits_at` are not for use.

`families/fixtures/decoder_encoder_fixture.py` writes tiny random packages under transformers' names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.decoder import DecoderConfig, DecoderLayer, DecoderLM, RMSNorm, apply_rotary
from vllm_srun.adapters.models.decoder_heads import (
    HEAD_TENSORS,
    ScoreHead,
    YesNoHead,
    decoder_head,
    labelled,
    tokenizer_pad_id,
)
from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import ConfigBase, config_labels, decoder_pad_ids
from vllm_srun.adapters.models.manifest import read_config
from vllm_srun.adapters.models.unpadded import RelativeBias, attend_runs
from vllm_srun.adapters.models.weights import WeightsError, load_weights

if TYPE_CHECKING:
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows

SUPPORTED_TYPES = ("qwen3", "qwen2", "llama")
ARCH_NAMES = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class DecoderEncoderConfig(ConfigBase):
    """The `EncoderConfigLike` view of a decoder's config.json (the decoder's own fields in `decoder`)."""

    decoder: DecoderConfig
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    hidden_act: str = "silu"
    pad_token_id: int = 0  # the id that pads rows (config.json's, else the tokenizer's, else 0)
    config_pad_token_id: int | None = None  # config.json's own: what a score head reads by (decoder_heads.py)
    architectures: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict[str, Any], pad_token_id: int | None = None) -> DecoderEncoderConfig:
        """Read a config.json (transformers 4.x or 5.x); PAD_TOKEN_ID is the fallback when it has none."""
        kind = str(raw.get("model_type", "")).lower()
        if kind not in SUPPORTED_TYPES:
            raise ValueError(
                f"model_type {kind!r} is not a decoder backbone we serve as an encoder ({SUPPORTED_TYPES})"
            )
        decoder = DecoderConfig.from_dict(raw)
        if decoder.head_dim % 2:
            raise ValueError(f"head_dim {decoder.head_dim} is odd: rotary embeddings need an even head size")
        if decoder.num_heads % decoder.num_kv_heads:
            raise ValueError(
                f"num_key_value_heads {decoder.num_kv_heads} does not divide num_attention_heads {decoder.num_heads}"
            )
        num_labels, id2label = config_labels(raw)
        pad, own = decoder_pad_ids(raw.get("pad_token_id"), pad_token_id, decoder.vocab_size)
        return cls(
            decoder=decoder,
            model_type=kind,
            vocab_size=decoder.vocab_size,
            hidden_size=decoder.hidden_size,
            num_hidden_layers=decoder.num_layers,
            num_attention_heads=decoder.num_heads,
            max_position_embeddings=decoder.max_position_embeddings,
            pad_token_id=pad,
            config_pad_token_id=own,
            architectures=tuple(str(a) for a in raw.get("architectures") or ()),
            num_labels=num_labels,
            id2label=id2label,
            problem_type=raw.get("problem_type"),
        )

    @property
    def max_tokens(self) -> int:
        return self.max_position_embeddings


def _fuse(parts: Sequence[nn.Linear]) -> nn.Linear:
    """One linear layer whose outputs are PARTS' outputs one after the other."""
    bias = parts[0].bias is not None
    with torch.device("meta"):
        fused = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=bias)
    fused.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts]), requires_grad=False)
    if bias:
        fused.bias = nn.Parameter(
            torch.cat([cast("torch.Tensor", p.bias).detach() for p in parts]), requires_grad=False
        )
    _tie(fused, parts)
    return fused


def _tie(fused: nn.Linear, parts: Sequence[nn.Linear]) -> None:
    """PARTS' weights (and biases) become views of FUSED's, so no tensor is held twice."""
    sizes = [p.out_features for p in parts]
    for part, w in zip(parts, fused.weight.detach().split(sizes), strict=True):
        part.weight = nn.Parameter(w, requires_grad=False)
    if fused.bias is not None:
        for part, b in zip(parts, fused.bias.detach().split(sizes), strict=True):
            part.bias = nn.Parameter(b, requires_grad=False)


class DecoderBlock(nn.Module):
    """One decoder layer seen as an encoder block (`encoder_arch.EncoderBlock`): pre-norm attention
    (causal, rotary, per-head q/k norms for Qwen3) then a SwiGLU feed-forward."""

    hidden_act = "silu"
    glu = True  # ffn_in gives [gate, up]; activate → silu(gate) * up

    def __init__(self, layer: DecoderLayer, c: DecoderConfig) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.sizes = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim)
        self.intermediate = c.intermediate_size
        self.input_norm = layer.input_layernorm
        self.post_norm = layer.post_attention_layernorm
        self.q_norm: RMSNorm | None = getattr(attn, "q_norm", None)
        self.k_norm: RMSNorm | None = getattr(attn, "k_norm", None)
        self.qkv = _fuse((attn.q_proj, attn.k_proj, attn.v_proj))
        self.attn_out = attn.o_proj
        self.ffn_in = _fuse((mlp.gate_proj, mlp.up_proj))
        self.ffn_out = mlp.down_proj
        self._layer = (layer,)  # the wrapped layer (registered under the encoder's `lm`)

    def retie(self) -> None:
        """Make the wrapped layer's split projections views of the fused ones again (after `.to()`)."""
        attn, mlp = self._layer[0].self_attn, self._layer[0].mlp
        _tie(self.qkv, (attn.q_proj, attn.k_proj, attn.v_proj))
        _tie(self.ffn_in, (mlp.gate_proj, mlp.up_proj))

    def activate(self, y: torch.Tensor) -> torch.Tensor:
        gate, up = y.split(self.intermediate, dim=-1)
        return F.silu(gate) * up

    def split_heads(
        self, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv's output [..., T, q+k+v] → q [..., T, heads, d], k and v [..., T, kv_heads, d]; q and k
        normed per head (Qwen3) and turned by the rotary tables COS / SIN [..., T, 1, d]."""
        q, k, v = y.split(self.sizes, dim=-1)
        d = self.head_dim
        q = q.reshape(*q.shape[:-1], self.heads, d)
        k = k.reshape(*k.shape[:-1], self.kv_heads, d)
        v = v.reshape(*v.shape[:-1], self.kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of rows [B, T, heads, d] (k / v with kv_heads) → [B, T, heads · d]."""
        rep = self.heads // self.kv_heads
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], self.heads * self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Right-padded rows [B, T, H]; COS / SIN [B, T, 1, d]."""
        q, k, v = self.split_heads(self.qkv(self.input_norm(x)), cos, sin)
        x = x + self.attn_out(self.attend(q, k, v))
        return x + self.ffn_out(self.activate(self.ffn_in(self.post_norm(x))))


class DecoderEncoder(EncoderModuleDefaults, nn.Module):
    """A `DecoderLM` as an encoder (module doc): final-normed hidden states of every token."""

    default_pooling = "lasttoken"
    one_call_stack = "decoder"  # `ForwardOps.stack` (engines/cpu_stacks.py) runs every layer at once

    def __init__(self, config: DecoderEncoderConfig, lm: DecoderLM) -> None:
        super().__init__()
        self.config = config
        self.lm = lm
        self.layers = nn.ModuleList(DecoderBlock(layer, config.decoder) for layer in lm.model.blocks)

    @property
    def blocks(self) -> list[DecoderBlock]:
        return cast("list[DecoderBlock]", list(self.layers))

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        for block in self.blocks:  # moving or casting copies each parameter on its own: share again
            block.retie()
        return out

    def _check_length(self, longest: int) -> None:
        if longest > self.config.max_tokens:
            raise ValueError(f"row of {longest} tokens exceeds the {self.config.max_tokens} positions of this model")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [B, T, H] of right-padded rows (the mask and type ids are not needed)."""
        self._check_length(int(input_ids.shape[1]))
        positions = torch.ones_like(input_ids).cumsum(1) - 1  # 0..T-1 per row (trace-friendly)
        cos, sin = self.lm.rotary(positions)
        cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)  # [B, T, 1, d]
        x = self.lm.model.embed_tokens(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm.model.norm(x)

    def packed_forward(
        self,
        packed: PackedRows,
        linears: Sequence[LayerLinears],
        ops: ForwardOps,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states of every real token, [N, H], rows in PACKED's sorted order;
        with KEEP (int64 token indices [K], K a row bucket) only those tokens', [K, H]: the last
        layer still attends over every token, and runs its output linear, feed-forward and the
        final norm on the KEEP rows only (a decision reads each row's last token)."""
        self._check_length(packed.longest)
        cos, sin = self.lm.rotary(packed.positions[None])
        cos, sin = cos[0, 0, :, None], sin[0, 0, :, None]  # [N, 1, d]
        x = self.lm.model.embed_tokens(packed.ids)
        stacked = ops.stack(self, linears, x, packed, (cos, sin, keep))  # one call where the ops have it
        if stacked is not None:
            return stacked
        causal: RelativeBias | None = None
        last = len(self.blocks) - 1
        for i, (block, lin) in enumerate(zip(self.blocks, linears, strict=True)):
            q, k, v = block.split_heads(lin.qkv(block.input_norm(x)), cos, sin)
            n, heads, dim = q.shape
            if ops.runs_biased(dim, q.dtype):  # every row in one call, causal as a bias of the distance
                if causal is None:
                    causal = RelativeBias.causal(packed.longest, heads, x)
                rep = heads // k.shape[1]
                if rep > 1:  # grouped-query attention: each K/V head serves REP query heads
                    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
                qkv = torch.cat((q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)), dim=1)
                attended = ops.attention(qkv, packed, heads, causal)
            else:
                attended = attend_runs(q, k, v, packed, causal=True)
            if keep is not None and i == last:  # the last layer: only the KEEP tokens go on
                attended, x = attended.index_select(0, keep), x.index_select(0, keep)
            x = x + lin.attn_out(attended)
            x = x + lin.ffn_out(lin.ffn_in_act(block.post_norm(x)))
        return self.lm.model.norm(x)


def load_decoder_encoder(
    folder: Path, dtype: torch.dtype = torch.float32
) -> tuple[DecoderEncoder, YesNoHead | ScoreHead | None]:
    """Read config.json, srun.json and the safetensors of FOLDER: the encoder and its head (module doc)."""
    folder = Path(folder)
    cfg = DecoderEncoderConfig.from_dict(read_config(folder), tokenizer_pad_id(folder))
    w = load_weights(folder, dtype)
    state = {
        f"model.{k}": v for k, v in w.tensors.items() if k not in HEAD_TENSORS and not k.endswith(_IGNORED_SUFFIXES)
    }
    with torch.device("meta"):
        lm = DecoderLM(cfg.decoder)
    lm.lm_head = None  # the output layer is not kept: the yes/no head takes its two rows (below)
    try:
        missing, unexpected = lm.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # shape mismatches between config.json and the tensors
        raise WeightsError(f"{folder} does not fit its config.json: {str(exc).splitlines()[-1].strip()}") from exc
    if missing or unexpected:
        raise WeightsError(
            f"weights in {folder} do not fit the {cfg.model_type} layout: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    lm.eval().requires_grad_(False)
    tied = cfg.decoder.tie_word_embeddings
    head = decoder_head(folder, w, cfg, lambda: lm.model.embed_tokens.weight if tied else w.take("lm_head.weight"))
    return DecoderEncoder(labelled(cfg, head), lm).eval().requires_grad_(False), head
