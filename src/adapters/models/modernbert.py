"""Our torch ModernBERT encoder (gte-modernbert, mmBERT, ModernBERT-base/large), inference only.

ModernBERT: token embeddings + LayerNorm (no position table), pre-norm blocks (block 0 has no
attention norm), rotary position embeddings on Q and K (one theta for global layers, another for
local ones), full attention on global layers and a sliding window on the others (a token attends to
keys within ±`local_attention // 2`), a gated MLP `Wo(act(a) * g)` with `[a, g] = Wi(x)`, and a
final LayerNorm. `layer_types` (transformers 5.x) or `global_attn_every_n_layers` (4.x: layer i is
global when i % n == 0) says which layer is which; the thetas come from `rope_parameters` (5.x) or
`global_rope_theta` / `local_rope_theta` (4.x).

The unpadded forward (`packed_forward`) hands its rotary tables and its window (a bias of the
distance, where the longest row passes it) to the ops' layer stack (`ForwardOps.stack`,
`one_call_stack = "modernbert"`: every layer in one C++ call on the CPU's packed linears), else
runs its layer loop with the one-call attention.

`load_modernbert(folder, dtype)` → `(ModernBertEncoder, ModernBertHead | None)`: the head
(`ModernBertForSequenceClassification`: cls or mean pooling → dense → act → norm → classifier) is
there when the checkpoint has `classifier.weight`. `families/fixtures/modernbert_fixture.py` writes
tiny random packages under transformers' names (`vllm-srun fixture`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import (
    ACTIVATIONS,
    SIZE_FIELDS,
    ConfigBase,
    check_heads,
    config_labels,
    given_fields,
    load_parts,
    read_activation,
    read_model_type,
    take_linear,
)
from vllm_srun.adapters.models.unpadded import RelativeBias
from vllm_srun.adapters.models.weights import Weights

if TYPE_CHECKING:
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows

GLOBAL, LOCAL = "full_attention", "sliding_attention"
POOLINGS = ("cls", "mean")


def _rope_theta(raw: dict[str, Any], kind: str, legacy: str, default: float | None) -> float | None:
    """The rotary theta of layer type KIND: `rope_parameters[KIND]` (5.x), else the 4.x field LEGACY."""
    rope = raw.get("rope_parameters")
    if isinstance(rope, dict):
        per_type = rope.get(kind)
        params: dict[str, Any] = per_type if isinstance(per_type, dict) else rope  # per layer type, or one for all
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_parameters[{kind!r}] rope_type {rope_type!r} is not supported (only 'default')")
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError(f"rope_parameters[{kind!r}] partial_rotary_factor is not supported (only 1.0)")
        if params.get("rope_theta") is not None:
            return float(params["rope_theta"])
    value = raw.get(legacy, default)
    return float(value) if value is not None else None


def _layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    types = raw.get("layer_types")
    if types is not None:
        types = tuple(str(t) for t in types)
        if len(types) != layers or any(t not in (GLOBAL, LOCAL) for t in types):
            raise ValueError(f"layer_types must list {layers} of {GLOBAL!r}/{LOCAL!r}, got {list(types)}")
        return types
    every = raw.get("global_attn_every_n_layers", 3)
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"global_attn_every_n_layers {every!r} is not a positive integer")
    return tuple(LOCAL if i % every else GLOBAL for i in range(layers))


@dataclass(frozen=True)
class ModernBertConfig(ConfigBase):
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_act: str = "gelu"  # config.json's `hidden_activation`
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    local_attention: int = 128
    layer_types: tuple[str, ...] = ()
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    classifier_pooling: str = "cls"
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    pad_token_id: int = 50283
    model_type: str = "modernbert"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModernBertConfig:
        model_type = read_model_type(raw, "modernbert")
        hidden_act = read_activation(raw, "hidden_activation")
        classifier_act = read_activation(raw, "classifier_activation")
        pooling = str(raw.get("classifier_pooling") or "cls")
        if pooling not in POOLINGS:
            raise ValueError(f"classifier_pooling {pooling!r} is not supported ({', '.join(POOLINGS)})")
        scaling = raw.get("rope_scaling")
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ValueError(f"rope_scaling {scaling!r} is not supported (only default rotary embeddings)")
        num_labels, id2label = config_labels(raw)
        own = (
            "norm_eps",
            "norm_bias",
            "attention_bias",
            "mlp_bias",
            "local_attention",
            "classifier_bias",
            "problem_type",
        )
        fields = given_fields(raw, (*SIZE_FIELDS, *own))
        layers = int(fields.get("num_hidden_layers", cls.num_hidden_layers))
        global_theta = _rope_theta(raw, GLOBAL, "global_rope_theta", cls.global_rope_theta) or cls.global_rope_theta
        # 4.x: a null local_rope_theta means the global one
        local_theta = _rope_theta(raw, LOCAL, "local_rope_theta", cls.local_rope_theta) or global_theta
        pad = raw.get("pad_token_id")
        cfg = cls(
            **fields,
            hidden_act=hidden_act,
            classifier_activation=classifier_act,
            classifier_pooling=pooling,
            layer_types=_layer_types(raw, layers),
            global_rope_theta=global_theta,
            local_rope_theta=local_theta,
            model_type=model_type,
            num_labels=num_labels,
            id2label=id2label,
            pad_token_id=int(pad) if pad is not None else 0,
        )
        check_heads(cfg.hidden_size, cfg.num_attention_heads)
        if cfg.head_dim % 2:
            raise ValueError(f"num_attention_heads {cfg.num_attention_heads} gives an odd head size {cfg.head_dim}")
        if cfg.local_attention < 0:
            raise ValueError(f"local_attention {cfg.local_attention} is negative")
        return cfg

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_tokens(self) -> int:
        """The longest row the model was trained for (rotary embeddings have no position table)."""
        return self.max_position_embeddings


def rotary(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [*positions.shape, head_dim] of the rotary embedding (computed in FP32, stored in DTYPE)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta**exponent)
    angles = positions[..., None].to(torch.float32) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """X (..., head_dim) rotated by position: x·cos + (−x₂, x₁)·sin, in FP32, back in X's dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + turned * sin).to(x.dtype)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        # `_weight` skips the random init (slow on the meta device; every table is loaded anyway)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, h, _weight=torch.empty(cfg.vocab_size, h))
        self.norm = nn.LayerNorm(h, eps=cfg.norm_eps, bias=cfg.norm_bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertLayer(nn.Module):
    """One pre-norm block: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x))."""

    glu = True  # ffn_in gives [a, g]; the unit is act(a) * g

    def __init__(self, cfg: ModernBertConfig, index: int) -> None:
        super().__init__()
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.is_global = cfg.layer_types[index] == GLOBAL
        self.theta = cfg.global_rope_theta if self.is_global else cfg.local_rope_theta
        # sliding layers: a token attends to keys at most `window` positions away; None = everywhere
        self.window: int | None = None if self.is_global else cfg.local_attention // 2
        self.attn_norm: nn.Module = (
            nn.Identity() if index == 0 else nn.LayerNorm(h, eps=cfg.norm_eps, bias=cfg.norm_bias)
        )
        self.qkv = nn.Linear(h, 3 * h, bias=bias)
        self.attn_out = nn.Linear(h, h, bias=bias)
        self.mlp_norm = nn.LayerNorm(h, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.ffn_in = nn.Linear(h, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h, bias=cfg.mlp_bias)
        self.hidden_act = cfg.hidden_act
        self.act = ACTIVATIONS[cfg.hidden_act]

    def activate(self, y: torch.Tensor) -> torch.Tensor:
        a, g = y.chunk(2, dim=-1)
        return self.act(a) * g

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None
    ) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope
        a = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, attn_mask=mask)
        x = x + self.attn_out(a.transpose(1, 2).reshape(b, t, h))
        return x + self.ffn_out(self.activate(self.ffn_in(self.mlp_norm(x))))


class ModernBertEncoder(EncoderModuleDefaults, nn.Module):
    """Embeddings + the blocks + the final norm; `forward` returns the last hidden state [B, T, H]."""

    one_call_stack = "modernbert"  # `ForwardOps.stack` (engines/cpu_stacks.py) runs every layer at once

    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)

    @property
    def blocks(self) -> list[ModernBertLayer]:
        """The transformer blocks, typed (an `nn.ModuleList` yields plain modules)."""
        return cast("list[ModernBertLayer]", list(self.layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Right-padded rows (ATTENTION_MASK True/1 = real token; token types are ignored). No
        branch depends on the row length, so a traced graph (ONNX) keeps every mask."""
        x = self.embeddings(input_ids)
        pos = torch.arange(input_ids.shape[1], device=x.device)
        keys = attention_mask.to(torch.bool)[:, None, None, :] if attention_mask is not None else None
        distance = (pos[:, None] - pos[None, :]).abs()
        masks: dict[int | None, torch.Tensor | None] = {None: keys}
        ropes: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in self.blocks:
            if layer.window is not None and layer.window not in masks:
                near = (distance <= layer.window)[None, None]
                # a padded query far from every real key keeps itself, so no row of scores is all -inf
                masks[layer.window] = near if keys is None else (near & keys) | (distance == 0)
            if layer.theta not in ropes:
                ropes[layer.theta] = rotary(pos, layer.head_dim, layer.theta, x.dtype)
            x = layer(x, ropes[layer.theta], masks[layer.window])
        return self.final_norm(x)

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor:
        """The last hidden state of every real token, [N, H], rows in PACKED's sorted order. Every
        layer runs OPS.attention on the rotated Q, K, V; a sliding layer whose window does not cover
        the longest row gives it its window as a bias of the distance (0 within, −inf past it)."""
        x = self.embeddings(packed.ids)
        n, h = x.shape
        ropes: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}

        def rope(theta: float) -> tuple[torch.Tensor, torch.Tensor]:
            if theta not in ropes:
                cos, sin = rotary(packed.positions, self.config.head_dim, theta, x.dtype)
                ropes[theta] = cos[:, None, :], sin[:, None, :]
            return ropes[theta]

        # the sliding layers' window (every one has the same), where the longest row passes it
        cfg, reach = self.config, self.config.local_attention // 2
        window = (
            RelativeBias.window(packed.longest, reach, cfg.num_attention_heads, x)
            if packed.longest - 1 > reach
            else None
        )
        # every layer in one call where the ops have it: the global and local rotary tables, the window
        inputs = (*rope(cfg.global_rope_theta), *rope(cfg.local_rope_theta), window)
        stacked = ops.stack(self, linears, x, packed, inputs)
        if stacked is not None:
            return stacked
        for layer, lin in zip(self.blocks, linears):
            cos, sin = rope(layer.theta)
            qkv = lin.qkv(layer.attn_norm(x)).view(n, 3, layer.heads, layer.head_dim)
            q, k, v = rotate(qkv[:, 0], cos, sin), rotate(qkv[:, 1], cos, sin), qkv[:, 2]
            sliding = window if layer.window is not None else None
            attended = ops.attention(torch.stack((q, k, v), dim=1).view(n, 3 * h), packed, layer.heads, sliding)
            x = x + lin.attn_out(attended)
            x = x + lin.ffn_out(lin.ffn_in_act(layer.mlp_norm(x)))
        return self.final_norm(x)


class ModernBertHead(nn.Module):
    """`ModernBertForSequenceClassification`'s head: the row pooled (first token, or the mean of its
    real tokens), then dense → activation → norm → classifier."""

    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.pooling = cfg.classifier_pooling
        # cls pooling reads token 0 only: the unpadded forward may hand it each row's first token alone
        self.reads_first_token = cfg.classifier_pooling == "cls"
        self.dense = nn.Linear(h, h, bias=cfg.classifier_bias)
        self.act = ACTIVATIONS[cfg.classifier_activation]
        self.norm = nn.LayerNorm(h, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.classifier = nn.Linear(h, cfg.num_labels)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = mask.to(hidden.dtype)[:, :, None]
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        return self.classifier(self.norm(self.act(self.dense(pooled))))


def _encoder_state(w: Weights, cfg: ModernBertConfig) -> dict[str, torch.Tensor]:
    nb = cfg.norm_bias
    state = {"embeddings.tok_embeddings.weight": w.take("embeddings.tok_embeddings.weight")}
    state |= take_linear(w, "embeddings.norm", "embeddings.norm", nb)
    state |= take_linear(w, "final_norm", "final_norm", nb)
    for i in range(cfg.num_hidden_layers):
        src, dst = f"layers.{i}.", f"layers.{i}."
        if i > 0:  # block 0's attention norm is the identity
            state |= take_linear(w, dst + "attn_norm", src + "attn_norm", nb)
        state |= take_linear(w, dst + "qkv", src + "attn.Wqkv", cfg.attention_bias)
        state |= take_linear(w, dst + "attn_out", src + "attn.Wo", cfg.attention_bias)
        state |= take_linear(w, dst + "mlp_norm", src + "mlp_norm", nb)
        state |= take_linear(w, dst + "ffn_in", src + "mlp.Wi", cfg.mlp_bias)
        state |= take_linear(w, dst + "ffn_out", src + "mlp.Wo", cfg.mlp_bias)
    return state


def _head_state(w: Weights, cfg: ModernBertConfig) -> dict[str, torch.Tensor] | None:
    if "classifier.weight" not in w:  # a bare encoder, or a masked-LM checkpoint (head.* + decoder.*)
        return None
    state = take_linear(w, "dense", "head.dense", cfg.classifier_bias)
    state |= take_linear(w, "norm", "head.norm", cfg.norm_bias)
    return state | take_linear(w, "classifier", "classifier")


def load_modernbert(
    folder: Path, dtype: torch.dtype = torch.float32
) -> tuple[ModernBertEncoder, ModernBertHead | None]:
    """Read config.json and the safetensors of FOLDER: the encoder, and the head when there is one."""
    return load_parts(
        folder,
        dtype,
        config=ModernBertConfig.from_folder,
        encoder=ModernBertEncoder,
        head=ModernBertHead,
        encoder_state=_encoder_state,
        head_state=_head_state,
    )
