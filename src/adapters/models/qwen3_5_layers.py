"""The Qwen3.5 text backbone's layers in our own torch (module names are the checkpoints').

- `ZeroCenteredRMSNorm`: RMSNorm scaled by (1 + weight) in FP32, then cast back (the block norms,
  the final norm and the attention's q/k norms; weights stored around 0).
- `GatedRMSNorm`: the Gated DeltaNet output norm: RMSNorm scaled by weight, times SiLU(z).
- `GatedDeltaNet` (`linear_attn`): in_proj_qkv → causal depthwise conv1d + SiLU → queries, keys,
  values; in_proj_b → β = sigmoid(b); in_proj_a with A_log and dt_bias → the per-head log decay
  g = −exp(A_log)·softplus(a + dt_bias); queries and keys L2-normed (and shared by groups of value
  heads); the gated delta rule; GatedRMSNorm with in_proj_z's gate; out_proj. The convolution and
  the rule run on the model's kernels (`qwen3_5_kernels.py`: torch's `gated_delta.py`, or C++ ones).
- `GatedAttention` (`self_attn`): q_proj gives each head's query and output gate side by side;
  per-head q/k norms; rotary embeddings on the first `rotary_dim` dims of each head; GQA;
  causal attention per row; the output times sigmoid(gate), then o_proj.

Every mixer takes rows laid back to back ([N, hidden] and `Segments`) and may continue a shared
state (`LayerState`): the conv tail and recurrent state of a linear layer, the keys and values of
a full one. Each returns what a later branch would continue from.

`Visibility` says what a full-attention query sees (the package's `attention_mode`, R-Q35-3):
`causal` (every token sees itself and the tokens before it: the checkpoints as published), or,
when a row is a decision prompt's state followed by its question, `prefix_bidir` (a state token
sees every state token, before and after it) or `prefix_causal` (a state token sees the state
tokens up to itself); in both a question token sees the whole state and every token of its own
question. No state token ever sees a question token. The Gated DeltaNet layers stay causal in
every mode: their convolution and recurrence read left to right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.gated_delta import Segments, wide
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config
from vllm_srun.adapters.models.qwen3_5_kernels import TORCH_KERNELS, HybridKernels, LayerState, MixerShape

# CPU flash attention that also returns the log-sum-exp (torch >= 2.3): a branch attends to a
# shared state's keys once for all rows and merges that with its own part by the two log-sum-exps.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


ATTENTION_MODES = ("causal", "prefix_bidir", "prefix_causal")


@dataclass(frozen=True)
class Visibility:
    """What the full-attention layers' queries see (module doc). STATE: per row, how many of its
    leading tokens are state tokens (None: every row is all state); rows that continue a shared
    state (branches) hold question tokens only and pass 0s."""

    mode: str = "causal"
    state: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ATTENTION_MODES:
            raise ValueError(f"attention_mode {self.mode!r} is not one of {', '.join(ATTENTION_MODES)}")

    def state_of(self, row: int, length: int) -> int:
        return length if self.state is None else min(self.state[row], length)


CAUSAL = Visibility()


def visibility_mask(length: int, state: int, mode: str, device: torch.device | None = None) -> torch.Tensor | None:
    """[L, L] bool (query, key) of one row whose first STATE tokens are its state; None: every key
    (no mask needed)."""
    if mode == "causal":
        return torch.ones(length, length, dtype=torch.bool, device=device).tril()
    if state <= 0 or (state >= length and mode == "prefix_bidir"):
        return None
    mask = torch.ones(length, length, dtype=torch.bool, device=device)
    s = min(state, length)
    mask[:s, s:] = False  # no state token sees a question token
    if mode == "prefix_causal":
        mask[:s, :s] = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    return mask


class ZeroCenteredRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = wide(x)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + wide(self.weight))).type_as(x)


class GatedRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = wide(x)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * x32.to(dtype)
        return (out * F.silu(wide(gate))).to(dtype)


class MLP(nn.Module):
    def __init__(self, c: Qwen35Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GatedDeltaNet(nn.Module):
    def __init__(self, c: Qwen35Config) -> None:
        super().__init__()
        self.key_heads, self.value_heads = c.linear_key_heads, c.linear_value_heads
        self.key_dim, self.value_dim = c.linear_key_dim, c.linear_value_dim
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.conv_kernel, groups=c.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(c.linear_value_heads))
        self.A_log = nn.Parameter(torch.zeros(c.linear_value_heads))
        self.norm = GatedRMSNorm(c.linear_value_dim, c.rms_norm_eps)
        self.out_proj = nn.Linear(c.value_dim, c.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(c.hidden_size, c.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, c.value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, c.linear_value_heads, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, c.linear_value_heads, bias=False)
        self.shape = MixerShape(self.key_heads, self.value_heads, self.key_dim, self.value_dim)

    def forward(
        self,
        x: torch.Tensor,
        seg: Segments,
        prefix: LayerState | None = None,
        kernels: HybridKernels = TORCH_KERNELS,
        keep: bool = True,
    ) -> tuple[torch.Tensor, LayerState]:
        """KEEP: the rows' last recurrent states are kept (else they may be None)."""
        n = x.shape[0]
        mixed, tail = kernels.conv(
            self.in_proj_qkv(x), self.conv1d.weight[:, 0], seg, prefix.tail if prefix is not None else None
        )
        beta = self.in_proj_b(x).sigmoid()
        g = -wide(self.A_log).exp() * F.softplus(wide(self.in_proj_a(x)) + self.dt_bias)
        initial = prefix.recurrent if prefix is not None else None
        out, state = kernels.rule(mixed, g, beta, seg, initial, self.shape, keep)
        z = self.in_proj_z(x).reshape(n, self.value_heads, self.value_dim)
        normed = self.norm(out.to(x.dtype), z).reshape(n, -1)
        return self.out_proj(normed), LayerState(tail=tail, recurrent=state)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """X [..., head_dim] with its first cos.shape[-1] dims turned (the rest pass through)."""
    dim = cos.shape[-1]
    turn, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat((-turn[..., half:], turn[..., :half]), dim=-1)
    return torch.cat((turn * cos + rotated * sin, rest), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, c: Qwen35Config) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim * 2, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        seg: Segments,
        cos: torch.Tensor,
        sin: torch.Tensor,
        prefix: LayerState | None = None,
        split: bool = True,
        vis: Visibility = CAUSAL,
    ) -> tuple[torch.Tensor, LayerState]:
        """COS / SIN [N, 1, rotary_dim]. With PREFIX every row also sees the state's keys first
        (SPLIT: the state attended once for all rows on a CPU; else its K/V copied per row). VIS:
        what each query sees within its row (module doc)."""
        n = x.shape[0]
        q, gate = self.q_proj(x).view(n, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = rotate(self.q_norm(q), cos, sin)
        k = rotate(self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        own_causal = vis.mode == "causal"  # a branch's own tokens: causal, or all of its question
        if prefix is None:
            out = self._own_rows(q, k, v, seg) if own_causal else self._masked_rows(q, k, v, seg, vis)
        elif split and _FLASH_CPU is not None and x.device.type == "cpu":
            out = self._split(q, k, v, seg, prefix, own_causal)
        else:
            out = self._copies(q, k, v, seg, prefix, own_causal)
        out = out.reshape(n, -1) * torch.sigmoid(gate.reshape(n, -1))
        return self.o_proj(out), LayerState(keys=k.transpose(0, 1)[None], values=v.transpose(0, 1)[None])

    def _groups(self, seg: Segments) -> list[tuple[int, list[int]]]:
        """Rows by length (longest first): each group runs as one batch."""
        by: dict[int, list[int]] = {}
        for i, length in enumerate(seg.lengths):
            by.setdefault(length, []).append(i)
        return sorted(by.items(), reverse=True)

    def _index(self, seg: Segments, rows: list[int], length: int) -> torch.Tensor:
        starts = seg.starts[torch.tensor(rows, device=seg.starts.device)]
        return starts[:, None] + torch.arange(length, device=starts.device)  # [g, L]

    def _own_rows(self, q, k, v, seg: Segments) -> torch.Tensor:
        out = torch.empty_like(q)
        if seg.rows == 1:  # one row: no gathers
            return self._causal(q[None], k[None], v[None])[0]
        for length, rows in self._groups(seg):
            idx = self._index(seg, rows, length)
            out[idx] = self._causal(q[idx], k[idx], v[idx])
        return out

    def _masked_rows(self, q, k, v, seg: Segments, vis: Visibility) -> torch.Tensor:
        """Each row under VIS (a prefix mode): rows grouped by (length, state length)."""
        out = torch.empty_like(q)
        by: dict[tuple[int, int], list[int]] = {}
        for i, length in enumerate(seg.lengths):
            by.setdefault((length, vis.state_of(i, length)), []).append(i)
        for (length, state), rows in sorted(by.items(), reverse=True):
            idx = self._index(seg, rows, length)
            mask = visibility_mask(length, state, vis.mode, q.device)
            o = F.scaled_dot_product_attention(
                q[idx].transpose(1, 2),
                k[idx].transpose(1, 2),
                v[idx].transpose(1, 2),
                attn_mask=mask,
                enable_gqa=self.heads != self.kv_heads,
            )
            out[idx] = o.transpose(1, 2)
        return out

    def _causal(self, q, k, v) -> torch.Tensor:
        """[g, L, heads, d] → causal attention within each of the g rows, [g, L, heads, d]."""
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            enable_gqa=self.heads != self.kv_heads,
        )
        return o.transpose(1, 2)

    def _split(self, q, k, v, seg: Segments, prefix: LayerState, causal: bool = True) -> torch.Tensor:
        """[state ; own row causally] without copying the state: the state part once for every
        token of every row (GQA groups as batch heads), the own part per row group, merged by
        their log-sum-exps."""
        flash = _FLASH_CPU
        assert flash is not None and prefix.keys is not None and prefix.values is not None
        n = q.shape[0]
        g, rep, d = self.kv_heads, self.heads // self.kv_heads, self.head_dim
        grouped = q.reshape(n, g, rep, d).permute(1, 0, 2, 3).reshape(1, g, n * rep, d)
        out_s, lse_s = flash(grouped, prefix.keys, prefix.values)[:2]
        out_s = out_s.reshape(g, n, rep, d).permute(1, 0, 2, 3).reshape(n, self.heads, d)
        lse_s = lse_s.reshape(g, n, rep).permute(1, 0, 2).reshape(n, self.heads)
        out_o = torch.empty_like(q)
        lse_o = torch.empty(n, self.heads, dtype=wide(q).dtype, device=q.device)
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        for length, rows in self._groups(seg):
            idx = self._index(seg, rows, length)
            o, lse = flash(q[idx].transpose(1, 2), k[idx].transpose(1, 2), v[idx].transpose(1, 2), is_causal=causal)[:2]
            out_o[idx] = o.transpose(1, 2)
            lse_o[idx] = wide(lse.transpose(1, 2))
        weight = torch.sigmoid(wide(lse_s) - lse_o).unsqueeze(-1)
        return (wide(out_o) + (wide(out_s) - wide(out_o)) * weight).to(q.dtype)

    def _copies(self, q, k, v, seg: Segments, prefix: LayerState, causal: bool = True) -> torch.Tensor:
        """[state ; own row (causally, or all of it)] with the state's K/V copied into each row of a
        group (off a CPU)."""
        assert prefix.keys is not None and prefix.values is not None
        state_k, state_v = prefix.keys[0].transpose(0, 1), prefix.values[0].transpose(0, 1)  # [S, kv, d]
        s = state_k.shape[0]
        out = torch.empty_like(q)
        for length, rows in self._groups(seg):
            idx = self._index(seg, rows, length)
            b = len(rows)
            keys = torch.cat((state_k.expand(b, -1, -1, -1), k[idx]), dim=1).transpose(1, 2)
            values = torch.cat((state_v.expand(b, -1, -1, -1), v[idx]), dim=1).transpose(1, 2)
            own = torch.ones(length, length, dtype=torch.bool, device=q.device)
            mask = torch.cat(
                (torch.ones(length, s, dtype=torch.bool, device=q.device), own.tril() if causal else own), 1
            )
            o = F.scaled_dot_product_attention(
                q[idx].transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads
            )
            out[idx] = o.transpose(1, 2)
        return out


class Qwen35Layer(nn.Module):
    """One block (`model.layers.N`): its token mixer (`linear_attn` or `self_attn`), then the MLP,
    each after its norm and added to the residual."""

    def __init__(self, c: Qwen35Config, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = GatedAttention(c)
        self.input_layernorm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(
        self,
        x: torch.Tensor,
        seg: Segments,
        rope: tuple[torch.Tensor, torch.Tensor],
        prefix: LayerState | None = None,
        split: bool = True,
        kernels: HybridKernels = TORCH_KERNELS,
        keep: bool = True,
        vis: Visibility = CAUSAL,
    ) -> tuple[torch.Tensor, LayerState]:
        normed = self.input_layernorm(x)
        if self.kind == "linear_attention":  # causal in every attention mode
            mixed, kept = self.linear_attn(normed, seg, prefix, kernels, keep)
        else:
            mixed, kept = self.self_attn(normed, seg, rope[0], rope[1], prefix, split, vis)
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x)), kept
