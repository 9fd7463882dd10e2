"""DeBERTa-v2's config.json (DeBERTa-v2, DeBERTa-v3, mDeBERTa) and its relative-position geometry:
which relative-embedding row a query-minus-key distance reads (`relative_positions`, DeBERTa's
log buckets past `position_buckets` / 2). Read by `deberta_v2.py` (the model) and
`families/fixtures/deberta_v2_fixture.py` (tiny packages)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_srun.adapters.models.encoder_parts import (
    ACTIVATIONS,
    SIZE_FIELDS,
    ConfigBase,
    check_heads,
    config_labels,
    read_activation,
    read_model_type,
)

MODEL_TYPE = "deberta-v2"
# the pooler's and the ConvLayer's activation may also be tanh (the ConvLayer's default)
EXTRA_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {**ACTIVATIONS, "tanh": torch.tanh}
POS_ATT_TYPES = ("c2p", "p2c")
REL_NORMS = ("none", "layer_norm")


def _value(raw: dict[str, Any], key: str, default: Any) -> Any:
    """RAW[KEY], or DEFAULT when the field is missing or null (a version that does not write it)."""
    value = raw.get(key)
    return default if value is None else value


def _names(raw: dict[str, Any], key: str, allowed: tuple[str, ...], default: str) -> tuple[str, ...]:
    """A list field that old configs write as one "a|b" string (`pos_att_type`, `norm_rel_ebd`)."""
    value = _value(raw, key, default)
    items = value.split("|") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{key} {value!r} is neither a list nor a '|'-separated string")
    names = tuple(dict.fromkeys(str(x).strip().lower() for x in items if str(x).strip()))
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"{key} {bad} is not supported (only {list(allowed)})")
    return names


@dataclass(frozen=True)
class DebertaV2Config(ConfigBase):
    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    position_biased_input: bool = True
    pos_att_type: tuple[str, ...] = ()
    share_att_key: bool = False
    norm_rel_ebd: tuple[str, ...] = ("none",)
    embedding_size: int = 1536
    attention_head_size: int = 64
    pooler_hidden_act: str = "gelu"
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    pad_token_id: int = 0
    model_type: str = MODEL_TYPE

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DebertaV2Config:
        """A config.json as transformers 4.x or 5.x writes it (fields a version drops take their default)."""
        model_type = read_model_type(raw, MODEL_TYPE)
        ints = {
            k: int(_value(raw, k, getattr(cls, k)))
            for k in (
                *SIZE_FIELDS,
                "type_vocab_size",
                "max_relative_positions",
                "position_buckets",
                "conv_kernel_size",
                "conv_groups",
                "pad_token_id",
            )
        }
        hidden, heads = ints["hidden_size"], ints["num_attention_heads"]
        check_heads(hidden, heads)
        pooler_size = int(_value(raw, "pooler_hidden_size", hidden))
        if pooler_size != hidden:
            raise ValueError(f"pooler_hidden_size {pooler_size} differs from hidden_size {hidden} (not supported)")
        kernel = ints["conv_kernel_size"]
        if kernel > 0 and kernel % 2 == 0:
            raise ValueError(f"conv_kernel_size {kernel} is even (only odd kernels keep the row length)")
        if kernel > 0 and (ints["conv_groups"] < 1 or hidden % ints["conv_groups"]):
            raise ValueError(f"conv_groups {ints['conv_groups']} does not divide hidden_size {hidden}")
        num_labels, id2label = config_labels(raw)
        problem = raw.get("problem_type")
        return cls(
            **ints,
            hidden_act=read_activation(raw, "hidden_act"),
            layer_norm_eps=float(_value(raw, "layer_norm_eps", cls.layer_norm_eps)),
            relative_attention=bool(_value(raw, "relative_attention", False)),
            position_biased_input=bool(_value(raw, "position_biased_input", True)),
            pos_att_type=_names(raw, "pos_att_type", POS_ATT_TYPES, ""),
            share_att_key=bool(_value(raw, "share_att_key", False)),
            norm_rel_ebd=_names(raw, "norm_rel_ebd", REL_NORMS, "none"),
            embedding_size=int(_value(raw, "embedding_size", hidden)),
            attention_head_size=int(_value(raw, "attention_head_size", hidden // heads)),
            pooler_hidden_act=read_activation(raw, "pooler_hidden_act", "gelu", EXTRA_ACTIVATIONS),
            conv_act=read_activation(raw, "conv_act", "tanh", EXTRA_ACTIVATIONS),
            num_labels=num_labels,
            id2label=id2label,
            problem_type=str(problem) if problem is not None else None,
            model_type=model_type,
        )

    @property
    def relative_max(self) -> int:
        """The farthest relative position (`max_relative_positions`, -1 → `max_position_embeddings`)."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def relative_span(self) -> int:
        """Half the relative-embedding table: `position_buckets` when set, else `relative_max`."""
        return self.position_buckets if self.position_buckets > 0 else self.relative_max

    @property
    def uses_relative(self) -> bool:
        """Whether attention has position terms at all."""
        return self.relative_attention and bool(self.pos_att_type)

    @property
    def max_tokens(self) -> int:
        """The longest row (special tokens included) the model was built for."""
        return self.max_position_embeddings


def log_bucket(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa's bucketed relative positions: |δ| ≤ buckets/2 kept, longer distances compressed on a log
    scale so that max_position − 1 lands on bucket `buckets` − 1 (with δ's sign). Computed in float32 as
    the reference does, so bucket edges agree to the bit."""
    mid = buckets // 2
    sign = torch.sign(relative)
    inside = (relative < mid) & (relative > -mid)
    # inside the window the log below is not used; mid − 1 keeps it finite there
    magnitude = torch.where(inside, torch.full_like(relative, mid - 1), relative.abs())
    ratio = torch.log(magnitude / mid) / torch.log(torch.tensor((max_position - 1) / mid))
    far = torch.ceil(ratio * (mid - 1)) + mid
    return torch.where(magnitude <= mid, relative.to(far.dtype), far * sign).to(torch.long)


def relative_positions(distance: torch.Tensor, cfg: DebertaV2Config) -> torch.Tensor:
    """Query-minus-key distances (long) → relative position ids (bucketed when `position_buckets` > 0)."""
    if cfg.position_buckets > 0:
        return log_bucket(distance, cfg.position_buckets, cfg.relative_max)
    return distance
