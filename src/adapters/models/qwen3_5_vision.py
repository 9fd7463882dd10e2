"""Qwen3.5's vision tower in our own torch (`model.visual.*` of a `Qwen3_5ForConditionalGeneration`
checkpoint), read from `vision_config`. Module names are the checkpoint's.

A medium (an image, or a video) arrives as the media module's arrays (`media/qwen_vision.py`):
float32 [3, H, W] or [T, 3, H, W], H and W multiples of patch × merge, T a multiple of the
temporal patch. `patchify` cuts it into rows of C × temporal × patch × patch values, ordered so
that every merge × merge block of patches is consecutive (an image is its one frame repeated over
the temporal patch), as transformers' processors lay them out. Then:

- `patch_embed.proj`: a Conv3d whose kernel is its stride (one patch, all its frames), i.e. one
  linear map of each row;
- `pos_embed`: a learned square grid of position vectors, resampled bilinearly (corners aligned)
  to each medium's patch grid and added; every frame of a video gets the same;
- `blocks.N`: LayerNorm → attention (qkv, 2-D rotary positions over the patch grid: a quarter of
  each head turns with the row, a quarter with the column, each twice) → proj, then LayerNorm →
  MLP, each added to the residual. Attention runs within one frame group of one medium (all
  patches of an image; each temporal group of a video on its own), never across media;
- `merger`: LayerNorm, every merge × merge block of patches side by side, Linear → GELU → Linear
  to the language model's width: one embedding per image or video token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.lane_yield import yield_point

ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    merge: int  # spatial_merge_size
    out_hidden_size: int
    num_position_embeddings: int
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid_side(self) -> int:
        return int(self.num_position_embeddings**0.5)

    @property
    def patch_values(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> VisionConfig:
        def num(key: str, default: int) -> int:
            value = raw.get(key, default)
            if isinstance(value, (list, tuple)):  # transformers accepts [n, n] for square patches
                if len(set(value)) != 1:
                    raise ValueError(f"vision_config {key} {value} is not square")
                value = value[0]
            return int(value)

        act = str(raw.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in ACTIVATIONS:
            raise ValueError(f"vision_config hidden_act {act!r} is not supported (known: {sorted(ACTIVATIONS)})")
        rope = raw.get("rope_parameters") or {}
        kind = rope.get("rope_type", "axial")
        if kind != "axial":
            raise ValueError(f"vision_config rope_type {kind!r} is not supported (only axial)")
        c = cls(
            depth=num("depth", 27),
            hidden_size=num("hidden_size", 1152),
            num_heads=num("num_heads", 16),
            intermediate_size=num("intermediate_size", 4304),
            hidden_act=act,
            in_channels=num("in_channels", 3),
            patch_size=num("patch_size", 16),
            temporal_patch_size=num("temporal_patch_size", 2),
            merge=num("spatial_merge_size", 2),
            out_hidden_size=num("out_hidden_size", 3584),
            num_position_embeddings=num("num_position_embeddings", 2304),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )
        if c.hidden_size % c.num_heads or c.head_dim % 4:
            raise ValueError(
                f"vision heads of {c.hidden_size}/{c.num_heads} dims do not split into 2-D rotary quarters"
            )
        if c.grid_side**2 != c.num_position_embeddings:
            raise ValueError(f"vision_config num_position_embeddings {c.num_position_embeddings} is not a square")
        return c


def grid_of(shape: Sequence[int], c: VisionConfig) -> tuple[int, int, int]:
    """(t, h, w) patch grid of a [3, H, W] image or [T, 3, H, W] video; ValueError when the sizes do
    not divide into patches and merge blocks."""
    if len(shape) == 3:
        frames, (channels, height, width) = 1, shape
        groups = 1
    elif len(shape) == 4:
        frames, channels, height, width = shape
        if frames % c.temporal_patch_size:
            raise ValueError(f"a video of {frames} frames is not whole groups of {c.temporal_patch_size}")
        groups = frames // c.temporal_patch_size
    else:
        raise ValueError(f"pixels of shape {tuple(shape)} are neither an image nor a video")
    unit = c.patch_size * c.merge
    if channels != c.in_channels or height % unit or width % unit or height < unit or width < unit:
        raise ValueError(
            f"pixels of shape {tuple(shape)} are not {c.in_channels} channels of whole {unit}x{unit} blocks"
        )
    return groups, height // c.patch_size, width // c.patch_size


def patchify(pixels: torch.Tensor, c: VisionConfig) -> torch.Tensor:
    """[3, H, W] or [T, 3, H, W] → [t·h·w, C·temporal·p·p], merge blocks consecutive (module doc)."""
    t, h, w = grid_of(tuple(pixels.shape), c)
    p, m, tp = c.patch_size, c.merge, c.temporal_patch_size
    if pixels.dim() == 3:
        pixels = pixels.unsqueeze(0).expand(tp, -1, -1, -1)
    ch = pixels.shape[1]
    x = pixels.reshape(t, tp, ch, h // m, m, p, w // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # t, block row, block col, in-row, in-col, C, frame, py, px
    return x.reshape(t * h * w, ch * tp * p * p)


def block_positions(h: int, w: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch of an h × w grid, in merge-block order."""
    rows = torch.arange(h).reshape(h // m, m, 1, 1).expand(h // m, m, w // m, m)
    cols = torch.arange(w).reshape(1, 1, w // m, m).expand(h // m, m, w // m, m)
    return rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)


def _taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps (corners aligned) of SIZE target positions into SIDE table rows, and their weights."""
    src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def _inv_freq(c: VisionConfig) -> torch.Tensor:
    """Frequencies of one axis: a quarter of each head's dims turn with it (each twice)."""
    quarter = c.head_dim // 2
    return 1.0 / (c.rope_theta ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))


class VisionMLP(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.linear_fc2 = nn.Linear(c.intermediate_size, c.hidden_size)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionAttention(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = c.num_heads, c.head_dim
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.proj = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, segments: list[tuple[int, int, int]], cos: torch.Tensor, sin: torch.Tensor):
        """SEGMENTS: (start, length, count): COUNT attention groups of LENGTH tokens from START."""
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = _turn(q, cos, sin), _turn(k, cos, sin)
        out = torch.empty_like(q)
        for start, length, count in segments:
            end = start + length * count
            shape = (count, length, self.heads, self.head_dim)
            o = F.scaled_dot_product_attention(
                q[start:end].reshape(shape).transpose(1, 2),
                k[start:end].reshape(shape).transpose(1, 2),
                v[start:end].reshape(shape).transpose(1, 2),
            )
            out[start:end] = o.transpose(1, 2).reshape(length * count, self.heads, self.head_dim)
        return self.proj(out.reshape(n, -1))


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary turn of X [N, heads, d] over the whole head, in FP32 (as the reference), back to X's dtype."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.attn = VisionAttention(c)
        self.mlp = VisionMLP(c)

    def forward(self, x, segments, cos, sin):
        x = x + self.attn(self.norm1(x), segments, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        kernel = (c.temporal_patch_size, c.patch_size, c.patch_size)
        self.proj = nn.Conv3d(c.in_channels, c.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """[P, C·t·p·p] → [P, hidden]: the kernel covers the whole patch, so one matrix product."""
        weight = self.proj.weight.reshape(self.proj.weight.shape[0], -1)
        return F.linear(rows.to(weight.dtype), weight, self.proj.bias)


class PatchMerger(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.width = c.hidden_size * c.merge**2
        self.norm = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, c.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen35Vision(nn.Module):
    """The tower (module doc): media in, one embedding per language-model token out."""

    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.config = c
        self.patch_embed = PatchEmbed(c)
        self.pos_embed = nn.Embedding(c.num_position_embeddings, c.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(c) for _ in range(c.depth))
        self.merger = PatchMerger(c)
        self.register_buffer("inv_freq", _inv_freq(c), persistent=False)

    def reset_rotary(self, device: str | torch.device) -> None:
        """Recompute the rotary frequencies on DEVICE (after a build on the meta device)."""
        self.inv_freq = _inv_freq(self.config).to(device)

    @property
    def dtype(self) -> torch.dtype:
        return self.pos_embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.pos_embed.weight.device

    def _positions(self, grids: Sequence[tuple[int, int, int]]):
        """Learned position vectors [P, hidden] and rotary cos/sin [P, 1, head_dim] of every patch."""
        c = self.config
        side, dev = c.grid_side, self.device
        pos_rows, rot_rows, rot_cols = [], [], []
        for t, h, w in grids:
            r, k = block_positions(h, w, c.merge)
            h_taps, h_weights = _taps(r, h, side)
            w_taps, w_weights = _taps(k, w, side)
            index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4).to(dev)
            weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4).to(dev)
            vectors = (self.pos_embed(index) * weight[:, :, None].to(self.dtype)).sum(1)
            pos_rows.append(vectors.repeat(t, 1))
            rot_rows.append(r.repeat(t))
            rot_cols.append(k.repeat(t))
        inv = self.inv_freq.to(dev)
        freqs = torch.cat(
            (torch.cat(rot_rows).to(dev).float()[:, None] * inv, torch.cat(rot_cols).to(dev).float()[:, None] * inv),
            dim=-1,
        )
        angles = torch.cat((freqs, freqs), dim=-1)[:, None]
        return torch.cat(pos_rows), angles.cos(), angles.sin()

    def forward(self, media: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each medium's pixels ([3, H, W] image, [T, 3, H, W] video) → its token embeddings
        [tokens, out_hidden], all media in one pass (attention within each frame group)."""
        if not media:
            return []
        c = self.config
        grids = [grid_of(tuple(m.shape), c) for m in media]
        rows = torch.cat([patchify(m.to(self.device, torch.float32), c) for m in media])
        x = self.patch_embed(rows)
        vectors, cos, sin = self._positions(grids)
        x = x + vectors.to(x.dtype)
        segments, start = [], 0
        for t, h, w in grids:
            segments.append((start, h * w, t))
            start += t * h * w
        for block in self.blocks:
            yield_point()  # a lane express forward may run first (R-BAT-6, adapters/lane_yield.py)
            x = block(x, segments, cos, sin)
        merged = self.merger(x)
        return list(torch.split(merged, [t * h * w // c.merge**2 for t, h, w in grids]))


def as_tensor(pixels: Any) -> torch.Tensor:
    """Pixels from the media module (numpy, possibly read-only) or a tensor, as a float32 tensor."""
    if isinstance(pixels, torch.Tensor):
        return pixels
    return torch.from_numpy(np.array(pixels, dtype=np.float32, copy=True))


def tokens_of(shape: Sequence[int], c: VisionConfig) -> tuple[int, int]:
    """(groups, tokens per group) of a medium of SHAPE: an image is one group, a video one per
    temporal patch of frames."""
    t, h, w = grid_of(shape, c)
    return t, h * w // c.merge**2
