"""Our own torch CLIP and SigLIP dual encoders (inference only, no `transformers` at run time).

`load_dual_encoder(folder)` reads `config.json` (`dual_encoder_config.py`) and the safetensors of a
Hugging Face `CLIPModel` / `SiglipModel` folder into a `DualEncoder`:

- `embed_text(rows)` — token id rows → [B, D] float32, L2-normalized. CLIP rows are right-padded
  to the longest (attention is causal, so padding never reaches a real token); SigLIP rows are
  padded to the text tower's positions, as the model was trained.
- `embed_images(pixels)` — [B, C, H, W] float32 pixels (already resized and normalized) →
  [B, D] float32, L2-normalized.

Text and image embeddings share one space: CLIP projects both towers' pooled states to
`projection_dim` (no bias); SigLIP's text head maps into the vision tower's width.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from vllm_srun.adapters.models.dual_encoder_config import DualEncoderConfig, TowerConfig
from vllm_srun.adapters.models.vit import AttentionPoolingHead, BlockStack
from vllm_srun.adapters.models.weights import Weights, WeightsError, load_weights


def _table(rows: int, width: int) -> nn.Embedding:
    # `_weight` skips the random init; every table is assigned from the checkpoint
    return nn.Embedding(rows, width, _weight=torch.empty(rows, width))


class VisionTower(nn.Module):
    def __init__(self, cfg: DualEncoderConfig) -> None:
        super().__init__()
        v = cfg.vision
        h = v.hidden_size
        self.clip = cfg.kind == "clip"
        self.patch = nn.Conv2d(v.num_channels, h, v.patch_size, stride=v.patch_size, bias=not self.clip)
        self.position = _table(cfg.image_tokens, h)
        self.blocks = BlockStack(v)
        self.post_norm = nn.LayerNorm(h, eps=v.layer_norm_eps)
        if self.clip:
            self.class_embedding = nn.Parameter(torch.empty(h))
            self.pre_norm = nn.LayerNorm(h, eps=v.layer_norm_eps)
            self.projection = nn.Linear(h, cfg.dimensions, bias=False)
        else:
            self.head = AttentionPoolingHead(v)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixels.to(self.patch.weight.dtype)).flatten(2).transpose(1, 2)
        if self.clip:
            cls = self.class_embedding.expand(x.shape[0], 1, -1)
            x = self.pre_norm(torch.cat([cls, x], dim=1) + self.position.weight)
            return self.projection(self.post_norm(self.blocks(x)[:, 0]))
        x = self.blocks(x + self.position.weight)
        return self.head(self.post_norm(x))


class TextTower(nn.Module):
    def __init__(self, cfg: DualEncoderConfig) -> None:
        super().__init__()
        t = cfg.text
        self.config = t
        self.clip = cfg.kind == "clip"
        self.token = _table(t.vocab_size, t.hidden_size)
        self.position = _table(t.max_position_embeddings, t.hidden_size)
        self.blocks = BlockStack(t)
        self.final_norm = nn.LayerNorm(t.hidden_size, eps=t.layer_norm_eps)
        out = cfg.dimensions if self.clip else t.projection_size
        self.projection = nn.Linear(t.hidden_size, out, bias=not self.clip)

    def pool_positions(self, rows: Sequence[Sequence[int]]) -> list[int]:
        """Where each row is pooled: CLIP's end-of-text token (the first one; the largest id under
        the legacy `eos_token_id` 2), SigLIP's last position."""
        if not self.clip:
            return [self.config.max_position_embeddings - 1] * len(rows)
        eos = self.config.eos_token_id
        if eos == 2:
            return [max(range(len(r)), key=r.__getitem__) for r in rows]  # the first largest id
        return [next((i for i, tok in enumerate(r) if tok == eos), 0) for r in rows]

    def forward(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        limit = self.config.max_position_embeddings
        longest = max(len(r) for r in rows)
        if longest > limit:
            raise ValueError(f"a text row of {longest} tokens exceeds the {limit} positions of this model")
        width = longest if self.clip else limit
        pad = self.config.pad_token_id
        ids = torch.tensor([[*r, *[pad] * (width - len(r))] for r in rows], dtype=torch.long)
        ids = ids.to(self.token.weight.device)
        x = self.token(ids) + self.position.weight[:width]
        x = self.final_norm(self.blocks(x, causal=self.clip))
        at = torch.tensor(self.pool_positions(rows), device=x.device)
        return self.projection(x[torch.arange(len(rows), device=x.device), at])


def normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(p=2, dim=-1, keepdim=True).clamp_min(1e-12)


class DualEncoder(nn.Module):
    def __init__(self, cfg: DualEncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.text = TextTower(cfg)
        self.vision = VisionTower(cfg)

    @property
    def dimensions(self) -> int:
        return self.config.dimensions

    def embed_text(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        return normalize(self.text(rows))

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        size = self.config.vision.image_size
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (self.config.vision.num_channels, size, size):
            raise ValueError(f"pixels of shape {tuple(pixels.shape)}; this model reads [B, 3, {size}, {size}]")
        return normalize(self.vision(pixels))


# ---- loading ------------------------------------------------------------------------------------
_BLOCK_PARTS = (
    ("norm1", "layer_norm1"),
    ("attn_out", "self_attn.out_proj"),
    ("norm2", "layer_norm2"),
    ("mlp.fc1", "mlp.fc1"),
    ("mlp.fc2", "mlp.fc2"),
)


def _blocks(w: Weights, cfg: TowerConfig, src: str, dst: str) -> dict[str, torch.Tensor]:
    state = {}
    for i in range(cfg.num_hidden_layers):
        s, d = f"{src}.encoder.layers.{i}.", f"{dst}.blocks.layers.{i}."
        for kind in ("weight", "bias"):
            state[f"{d}qkv.{kind}"] = torch.cat(w.take_all(f"{s}self_attn.{p}_proj.{kind}" for p in "qkv"))
            for ours, theirs in _BLOCK_PARTS:
                state[f"{d}{ours}.{kind}"] = w.take(f"{s}{theirs}.{kind}")
    return state


def _pairs(w: Weights, pairs: Sequence[tuple[str, str]]) -> dict[str, torch.Tensor]:
    return {f"{ours}.{kind}": w.take(f"{theirs}.{kind}") for ours, theirs in pairs for kind in ("weight", "bias")}


def _state(w: Weights, cfg: DualEncoderConfig) -> dict[str, torch.Tensor]:
    v, t = "vision_model", "text_model"
    state = {
        **_blocks(w, cfg.vision, v, "vision"),
        **_blocks(w, cfg.text, t, "text"),
        "vision.patch.weight": w.take(f"{v}.embeddings.patch_embedding.weight"),
        "vision.position.weight": w.take(f"{v}.embeddings.position_embedding.weight"),
        "text.token.weight": w.take(f"{t}.embeddings.token_embedding.weight"),
        "text.position.weight": w.take(f"{t}.embeddings.position_embedding.weight"),
        **_pairs(w, [("vision.post_norm", f"{v}.post_layernorm"), ("text.final_norm", f"{t}.final_layer_norm")]),
    }
    if cfg.kind == "clip":
        state["vision.class_embedding"] = w.take(f"{v}.embeddings.class_embedding")
        state["vision.projection.weight"] = w.take("visual_projection.weight")
        state["text.projection.weight"] = w.take("text_projection.weight")
        state.update(_pairs(w, [("vision.pre_norm", f"{v}.pre_layrnorm")]))
        return state
    head = f"{v}.head"
    h = cfg.vision.hidden_size
    in_w, in_b = w.take(f"{head}.attention.in_proj_weight"), w.take(f"{head}.attention.in_proj_bias")
    state.update(
        {
            "vision.patch.bias": w.take(f"{v}.embeddings.patch_embedding.bias"),
            "vision.head.probe": w.take(f"{head}.probe"),
            "vision.head.q.weight": in_w[:h],
            "vision.head.q.bias": in_b[:h],
            "vision.head.kv.weight": in_w[h:],
            "vision.head.kv.bias": in_b[h:],
            **_pairs(
                w,
                [
                    ("vision.head.out", f"{head}.attention.out_proj"),
                    ("vision.head.norm", f"{head}.layernorm"),
                    ("vision.head.mlp.fc1", f"{head}.mlp.fc1"),
                    ("vision.head.mlp.fc2", f"{head}.mlp.fc2"),
                    ("text.projection", f"{t}.head"),
                ],
            ),
        }
    )
    return state


def load_dual_encoder(
    folder: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> DualEncoder:
    """Read config.json and the safetensors of FOLDER into a DualEncoder on DEVICE."""
    folder = Path(folder)
    cfg = DualEncoderConfig.from_folder(folder)
    w = load_weights(folder, dtype)
    with torch.device("meta"):  # no random init: every tensor is assigned from the checkpoint
        model = DualEncoder(cfg)
    try:
        model.load_state_dict(_state(w, cfg), strict=True, assign=True)
    except RuntimeError as exc:  # shape mismatches between config.json and the tensors
        raise WeightsError(f"{folder} does not fit its config.json: {exc}") from exc
    model = model.requires_grad_(False).eval()
    return model.to(device) if torch.device(device).type != "cpu" else model
