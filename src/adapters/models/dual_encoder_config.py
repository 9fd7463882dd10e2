"""What a CLIP-style dual encoder's `config.json` says (Hugging Face layout), read without
`transformers`: a text tower and a vision tower, and how each is pooled and projected.

Two layouts (`model_type`):
- `clip` — vision: class token, pre- and post-LayerNorm, class-token pooling, `visual_projection`;
  text: causal attention, final LayerNorm, pooled at the first end-of-text token (or at the
  largest id when `eos_token_id` is the legacy 2), `text_projection`. Both projections have no bias.
- `siglip` — vision: no class token, post-LayerNorm, a multi-head attention pooling head (a
  learned probe attends to the patches, then LayerNorm + MLP with a residual); text:
  bidirectional attention over rows padded to `max_position_embeddings`, final LayerNorm, the last
  position pooled, then a linear `head`.
Keys missing from the file take `transformers`' defaults for that layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("clip", "siglip")
ACTIVATION_NAMES = frozenset({"quick_gelu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu"})

_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip": dict(
        vocab_size=49408,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=8,
        max_position_embeddings=77,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
        pad_token_id=1,
        eos_token_id=49407,
        projection_size=None,
    ),
    "siglip": dict(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        max_position_embeddings=64,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        pad_token_id=1,
        eos_token_id=49407,
        projection_size=None,
    ),
}
_VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip": dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_channels=3,
        image_size=224,
        patch_size=32,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    ),
    "siglip": dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_channels=3,
        image_size=224,
        patch_size=16,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        vision_use_head=True,
    ),
}


@dataclass(frozen=True)
class TowerConfig:
    """One transformer tower (text or vision)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    hidden_act: str
    layer_norm_eps: float

    def check(self, name: str) -> None:
        if self.hidden_act not in ACTIVATION_NAMES:
            raise ValueError(f"{name}.hidden_act {self.hidden_act!r} is not supported ({sorted(ACTIVATION_NAMES)})")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}.hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads"
            )


@dataclass(frozen=True)
class TextConfig(TowerConfig):
    vocab_size: int
    max_position_embeddings: int
    pad_token_id: int
    eos_token_id: int
    projection_size: int  # siglip's text head output (its hidden size when unset)


@dataclass(frozen=True)
class VisionConfig(TowerConfig):
    num_channels: int
    image_size: int
    patch_size: int
    use_head: bool = False  # siglip's attention pooling head

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class DualEncoderConfig:
    kind: str  # clip | siglip
    text: TextConfig
    vision: VisionConfig
    projection_dim: int | None  # clip's shared projection width; None for siglip (no projection)

    @property
    def dimensions(self) -> int:
        """The width of an embedding (text and image alike)."""
        if self.projection_dim is not None:
            return self.projection_dim
        return self.vision.hidden_size

    @property
    def image_tokens(self) -> int:
        """Positions the vision tower runs per image: patches, plus the class token for CLIP."""
        return self.vision.grid**2 + (1 if self.kind == "clip" else 0)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DualEncoderConfig:
        kind = str(raw.get("model_type", ""))
        if kind not in KINDS:
            raise ValueError(f"model_type {kind!r} is not a dual encoder ({', '.join(KINDS)})")
        text_raw = {**_TEXT_DEFAULTS[kind], **_pick(raw.get("text_config") or {}, _TEXT_DEFAULTS[kind])}
        vision_raw = {**_VISION_DEFAULTS[kind], **_pick(raw.get("vision_config") or {}, _VISION_DEFAULTS[kind])}
        eos = text_raw["eos_token_id"]
        if isinstance(eos, list):
            eos = eos[0]
        text = TextConfig(
            **_tower(text_raw),
            vocab_size=int(text_raw["vocab_size"]),
            max_position_embeddings=int(text_raw["max_position_embeddings"]),
            pad_token_id=int(text_raw["pad_token_id"] if text_raw["pad_token_id"] is not None else 0),
            eos_token_id=int(eos if eos is not None else 2),
            projection_size=int(text_raw["projection_size"] or text_raw["hidden_size"]),
        )
        vision = VisionConfig(
            **_tower(vision_raw),
            num_channels=int(vision_raw["num_channels"]),
            image_size=_square(vision_raw["image_size"], "vision_config.image_size"),
            patch_size=_square(vision_raw["patch_size"], "vision_config.patch_size"),
            use_head=bool(vision_raw.get("vision_use_head", False)),
        )
        text.check("text_config")
        vision.check("vision_config")
        if vision.image_size % vision.patch_size:
            raise ValueError(f"image_size {vision.image_size} is not a multiple of patch_size {vision.patch_size}")
        if kind == "siglip" and not vision.use_head:
            raise ValueError("a siglip vision tower without its pooling head (vision_use_head false) has no embedding")
        projection = int(raw.get("projection_dim") or 512) if kind == "clip" else None
        cfg = cls(kind, text, vision, projection)
        if kind == "siglip" and text.projection_size != vision.hidden_size:
            raise ValueError(
                f"siglip text embeddings have {text.projection_size} dimensions and image embeddings "
                f"{vision.hidden_size}: they do not share one space"
            )
        return cfg

    @classmethod
    def from_folder(cls, folder: Path) -> DualEncoderConfig:
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(raw)


def _pick(raw: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k in known or k == "vision_use_head"}


def _tower(raw: dict[str, Any]) -> dict[str, Any]:
    return dict(
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=int(raw["num_attention_heads"]),
        hidden_act=str(raw["hidden_act"]),
        layer_norm_eps=float(raw["layer_norm_eps"]),
    )


def _square(value: Any, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"{name} {value!r}: only square sizes are supported")
        value = value[0]
    return int(value)
