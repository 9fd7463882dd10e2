"""Transformer pieces shared by the CLIP and SigLIP towers (our own torch code, inference only).

A pre-LayerNorm block (`PreNormBlock`: LayerNorm → attention → residual, LayerNorm → MLP →
residual) with Q, K and V merged into one linear layer and `scaled_dot_product_attention`; a
stack of them (`BlockStack`); and SigLIP's attention pooling head (`AttentionPoolingHead`: a
learned probe as the only query over the tower's states, then LayerNorm + MLP with a residual).
No dropout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.lane_yield import yield_point
from vllm_srun.adapters.models.dual_encoder_config import TowerConfig


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_fast": gelu_fast,
    "relu": F.relu,
    "silu": F.silu,
}


class Mlp(nn.Module):
    def __init__(self, cfg: TowerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PreNormBlock(nn.Module):
    def __init__(self, cfg: TowerConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.norm1 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.attn_out(a.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class BlockStack(nn.Module):
    def __init__(self, cfg: TowerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PreNormBlock(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        for layer in self.layers:
            yield_point()  # a lane express forward may run first (R-BAT-6, adapters/lane_yield.py)
            x = layer(x, causal)
        return x


class AttentionPoolingHead(nn.Module):
    """SigLIP's multi-head attention pooling: one learned query (the probe) over every position."""

    def __init__(self, cfg: TowerConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.probe = nn.Parameter(torch.empty(1, 1, h))
        self.q = nn.Linear(h, h)
        self.kv = nn.Linear(h, 2 * h)
        self.out = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        d = h // self.heads
        q = self.q(self.probe).view(1, 1, self.heads, d).transpose(1, 2).expand(b, -1, -1, -1)
        k, v = self.kv(x).view(b, t, 2, self.heads, d).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        pooled = self.out(a.transpose(1, 2).reshape(b, 1, h))
        return (pooled + self.mlp(self.norm(pooled)))[:, 0]
