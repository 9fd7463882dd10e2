"""Our own torch HTSAT audio tower (CLAP's, fusion off; inference only, no `transformers`).

`HtsatTower(cfg)(features)`: log-mel features [B, 1, frames, n_mels] (dB, `ClapFeatureExtractor`'s
`rand_trunc` layout) → the latent vector [B, hidden_size], as `ClapAudioModel` computes its
pooled output:

1. BatchNorm over the mel bins (running statistics);
2. the spectrogram stretched to `spec_size × freq_ratio` frames (bicubic, corners aligned) when
   shorter, then folded into a square image: `freq_ratio` consecutive time slices stacked along
   the frequency axis;
3. patch embedding (a strided convolution, then LayerNorm);
4. Swin stages: pre-norm blocks of window attention (a learned relative-position bias per head)
   alternating with shifted windows (a cyclic roll by half a window and a mask of −100 between
   regions that the roll brought together), a GELU MLP, and a patch merge (2×2 neighbours
   concatenated, LayerNorm, linear to twice the width) between stages; a stage whose grid is no
   larger than the window attends over the whole grid without a shift;
5. LayerNorm, then the mean over every position (the frame-wise regrouping `ClapAudioModel` does
   before its average pool reorders the positions, it keeps them all).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.clap_config import HtsatConfig
from vllm_srun.adapters.models.encoder_parts import ACTIVATIONS

SHIFT_MASK = -100.0  # what HTSAT adds between positions of different regions of a shifted window


def _windows(x: torch.Tensor, size: int) -> torch.Tensor:
    """[B, H, W, C] → [B × windows, size², C], windows in row-major order per image."""
    b, h, w, c = x.shape
    x = x.view(b, h // size, size, w // size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, size * size, c)


def _unwindow(x: torch.Tensor, size: int, h: int, w: int) -> torch.Tensor:
    """`_windows`' inverse: [B × windows, size², C] → [B, H, W, C]."""
    c = x.shape[-1]
    x = x.view(-1, h // size, w // size, size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


def relative_position_index(size: int) -> torch.Tensor:
    """[size², size²]: the row of the bias table for each (query, key) pair of a window."""
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()])  # [2, size²]
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (size - 1)
    return rel[..., 0] * (2 * size - 1) + rel[..., 1]


def shift_mask(h: int, w: int, size: int, shift: int) -> torch.Tensor:
    """[windows, size², size²]: 0 within a region, SHIFT_MASK across regions (a shifted window
    holds up to 3 × 3 regions of the rolled grid)."""

    def region(n: int) -> torch.Tensor:
        i = torch.arange(n)
        return (i >= n - size).long() + (i >= n - shift).long()

    label = (region(h)[:, None] * 3 + region(w)[None, :]).float()[None, :, :, None]
    label = _windows(label, size).squeeze(-1)  # [windows, size²]
    same = label[:, None, :] == label[:, :, None]
    return torch.where(same, 0.0, SHIFT_MASK)


class WindowBlock(nn.Module):
    """One Swin block at a fixed grid (SIDE × SIDE positions)."""

    def __init__(self, cfg: HtsatConfig, dim: int, heads: int, side: int, shifted: bool) -> None:
        super().__init__()
        window = cfg.window_size
        if side <= window:  # the whole grid is one window, nothing to shift
            window, shifted = side, False
        self.side, self.window, self.heads = side, window, heads
        self.shift = window // 2 if shifted else 0
        self.norm1 = nn.LayerNorm(dim, eps=cfg.layer_norm_eps)
        self.qkv = nn.Linear(dim, 3 * dim, bias=cfg.qkv_bias)
        self.bias_table = nn.Parameter(torch.empty((2 * cfg.window_size - 1) ** 2, heads))
        self.table_window = cfg.window_size
        self.attn_out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=cfg.layer_norm_eps)
        inner = int(cfg.mlp_ratio * dim)
        self.fc1 = nn.Linear(dim, inner)
        self.fc2 = nn.Linear(inner, dim)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.register_buffer("bias_index", None, persistent=False)
        self.register_buffer("mask", None, persistent=False)
        self.fill_buffers()

    def fill_buffers(self) -> None:
        """The fixed index and mask tensors, on the CPU (a model built on the meta device calls
        this again once its weights are assigned)."""
        with torch.device("cpu"):
            self.bias_index = relative_position_index(self.table_window)
            padded = -(-self.side // self.window) * self.window
            self.mask = shift_mask(padded, padded, self.window, self.shift) if self.shift else None

    def _bias(self, dtype: torch.dtype) -> torch.Tensor:
        """[windows or 1, heads, window², window²]: relative positions (plus the shift mask)."""
        n = self.window**2
        bias = self.bias_table[self.bias_index.view(-1)].view(n, n, -1).permute(2, 0, 1)[None]
        if self.mask is not None:
            bias = bias + self.mask[:, None].to(dtype)
        return bias.to(dtype)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """Window attention over X [B, side², C] (already normalized) → [B, side², C]."""
        b, _, c = x.shape
        side, size, shift = self.side, self.window, self.shift
        grid = x.view(b, side, side, c)
        pad = (size - side % size) % size
        grid = F.pad(grid, (0, 0, 0, pad, 0, pad))  # zeros past the right and bottom edges
        full = side + pad
        if shift:
            grid = torch.roll(grid, shifts=(-shift, -shift), dims=(1, 2))
        windows = _windows(grid, size)  # [B × nW, n, C]
        bw, n, _ = windows.shape
        q, k, v = self.qkv(windows).view(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        bias = self._bias(q.dtype)
        bias = bias.expand(b, -1, -1, -1, -1).reshape(-1, *bias.shape[1:]) if bias.shape[0] > 1 else bias
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        a = self.attn_out(a.transpose(1, 2).reshape(bw, n, c))
        grid = _unwindow(a, size, full, full)
        if shift:
            grid = torch.roll(grid, shifts=(shift, shift), dims=(1, 2))
        return grid[:, :side, :side].reshape(b, side * side, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class PatchMerge(nn.Module):
    """2 × 2 neighbours → one position of twice the width."""

    def __init__(self, dim: int, side: int) -> None:
        super().__init__()
        self.side = side
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        grid = x.view(b, self.side, self.side, c)
        # (row, col) = (0, 0), (1, 0), (0, 1), (1, 1): the order the checkpoints were trained with
        parts = [grid[:, row::2, col::2] for col in range(2) for row in range(2)]
        return self.reduction(self.norm(torch.cat(parts, dim=-1).view(b, -1, 4 * c)))


class Stage(nn.Module):
    def __init__(self, cfg: HtsatConfig, index: int) -> None:
        super().__init__()
        dim, side, heads = cfg.width(index), cfg.resolution(index), cfg.heads[index]
        self.blocks = nn.ModuleList(
            WindowBlock(cfg, dim, heads, side, shifted=i % 2 == 1) for i in range(cfg.depths[index])
        )
        self.merge = PatchMerge(dim, side) if index < cfg.stages - 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.merge(x) if self.merge is not None else x


class HtsatTower(nn.Module):
    def __init__(self, cfg: HtsatConfig) -> None:
        super().__init__()
        self.config = cfg
        self.mel_norm = nn.BatchNorm2d(cfg.num_mel_bins)
        pad = (cfg.patch_size - cfg.patch_stride) // 2
        self.patch = nn.Conv2d(cfg.in_channels, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_stride, padding=pad)
        self.patch_norm = nn.LayerNorm(cfg.embed_dim) if cfg.patch_norm else nn.Identity()
        self.stages = nn.ModuleList(Stage(cfg, i) for i in range(cfg.stages))
        self.final_norm = nn.LayerNorm(cfg.hidden_size)

    def image(self, features: torch.Tensor) -> torch.Tensor:
        """[B, C, frames, n_mels] → the normalized spectrogram folded into [B, C, spec, spec]."""
        cfg = self.config
        x = self.mel_norm(features.transpose(1, 3)).transpose(1, 3)
        if x.shape[2] < cfg.frames:
            x = F.interpolate(x, (cfg.frames, cfg.num_mel_bins), mode="bicubic", align_corners=True)
        b, c, t, f = x.shape
        r = cfg.freq_ratio
        x = x.reshape(b, c * r, t // r, f).permute(0, 1, 3, 2)
        return x.reshape(b, c, f * r, t // r)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        want = (cfg.in_channels, cfg.num_mel_bins)
        if features.dim() != 4 or (features.shape[1], features.shape[3]) != want or features.shape[2] > cfg.frames:
            raise ValueError(
                f"features of shape {tuple(features.shape)}; this tower reads "
                f"[B, {want[0]}, at most {cfg.frames} frames, {want[1]}]"
            )
        x = self.patch(self.image(features.to(self.patch.weight.dtype)))
        x = self.patch_norm(x.flatten(2).transpose(1, 2))
        for stage in self.stages:
            x = stage(x)
        return self.final_norm(x).mean(dim=1)
