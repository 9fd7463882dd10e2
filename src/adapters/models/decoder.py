"""Our own decoder-only language model in torch (Llama / Qwen2 / Qwen3 / SmolLM layouts).

Read from a Hugging Face folder (`config.json` + `*.safetensors`); no `transformers` at run time.
Public calls never compute the full [B, T, V] output layer: logits come at one position per row.

Shared context (R-SC): `prefix_kv` runs a state once and keeps every layer's K/V; `branch_logits`
runs the questions as rows of one batch, each attending to [state K/V ; itself causally] and never
to another question. `packed_tree_logits` is the other layout (one row: state then every question,
under a tree mask). The branch layout is the default: both do the same linear-layer work, but the
packed tree's attention is dense over (S+N)² while the branch's is Q·L·(S+L), so the packed tree
falls behind as questions grow (bench/shared_context.py; its figures: docs/performance.md), and a
branch state's K/V can be kept and reused. On a CPU the state part is attended once for all rows
(`attend_split`, no per-row copy of the state's K/V; timed faster at a 2048-token state, ibid.).

The residual adds with their RMSNorms and the SwiGLU product go through a `DecoderOps` (eager
torch here; fused Triton kernels on GPUs, `engines/triton_decoder.py`), chosen per call. Weights and
every tensor a call creates live on the model's device (`from_pretrained(..., device=...)`);
token ids may come from the host and are moved once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

_FAMILIES = {"llama", "smollm", "smollm2", "qwen2", "qwen3"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# CPU flash attention that also returns the log-sum-exp (torch >= 2.3); the split branch layout needs it.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@dataclass(frozen=True)
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_dict(cls, raw: dict) -> DecoderConfig:
        model_type = str(raw.get("model_type", "")).lower()
        if model_type not in _FAMILIES:
            raise ValueError(f"decoder model_type {model_type!r} is not supported (known: {sorted(_FAMILIES)})")
        act = raw.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"decoder hidden_act {act!r} is not supported (only silu / SwiGLU)")
        layer_types = raw.get("layer_types") or []
        if "sliding_attention" in layer_types or (raw.get("use_sliding_window") and raw.get("sliding_window")):
            raise ValueError("sliding-window attention is not supported by this decoder")
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        bias = bool(raw.get("attention_bias", False))
        qwen2 = model_type == "qwen2"
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=True if qwen2 else bias,
            o_bias=False if qwen2 else bias,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> DecoderConfig:
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))


def _rope_theta(raw: dict) -> float:
    """rope_theta from a transformers 5 `rope_parameters` or a 4.x `rope_theta` + `rope_scaling`."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope parameters {params!r} are not understood")
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind != "default":
        raise ValueError(f"rope scaling type {kind!r} is not supported (only default rotary embeddings)")
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


@dataclass
class SharedState:
    """Every layer's keys and values of one state ([1, kv_heads, S, head_dim] each), after rotary."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """X ([..., head_dim]) turned by the rotary tables COS / SIN (from `DecoderLM.rotary`, broadcast to X)."""
    return _rotate(x, cos, sin)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        return _rotate(q.transpose(1, 2), cos, sin), _rotate(k.transpose(1, 2), cos, sin), v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """SDPA under MASK (True = attend), or causal when MASK is None; then the output projection."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.heads != self.kv_heads
        )
        return self._project(out)

    def attend_split(self, q, k, v, state_k, state_v) -> torch.Tensor:
        """Attention over [state ; own row causally] without copying the state's K/V into every row.

        The state part runs once for all rows' queries (one flash call, no mask, GQA groups as
        batch heads), the own part per row (causal); the two are merged by their log-sum-exps.
        """
        flash = _FLASH_CPU
        if flash is None:
            raise RuntimeError("split attention needs torch's CPU flash attention (torch >= 2.3)")
        rows, _, t, d = q.shape
        g, rep = self.kv_heads, self.heads // self.kv_heads
        grouped = q.reshape(1, rows, g, rep * t, d).transpose(1, 2).reshape(1, g, rows * rep * t, d)
        out_s, lse_s = flash(grouped, state_k, state_v)[:2]
        out_s = out_s.reshape(g, rows, rep, t, d).transpose(0, 1).reshape(rows, self.heads, t, d)
        lse_s = lse_s.reshape(g, rows, rep, t).transpose(0, 1).reshape(rows, self.heads, t)
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out_o, lse_o = flash(q, k, v, is_causal=True)[:2]
        weight = torch.sigmoid(lse_s.float() - lse_o.float()).unsqueeze(-1)
        return self._project((out_o.float() + (out_s.float() - out_o.float()) * weight).to(q.dtype))

    def _project(self, out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class DecoderOps:
    """The residual + RMSNorm steps and the MLP of a block, in eager torch (the reference)."""

    name = "eager"

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, norm(x + delta))."""
        x = x + delta
        return x, norm(x)

    def mlp(self, mlp: MLP, x: torch.Tensor) -> torch.Tensor:
        return mlp(x)


EAGER_OPS = DecoderOps()


class MLP(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One block (`model.layers.N`): attention then MLP, each after its norm. No forward of its
    own: `DecoderLM._layers` runs the pieces."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class DecoderBody(nn.Module):
    """`model.*` of the checkpoints: the embeddings, the blocks, the final norm."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    @property
    def blocks(self) -> list[DecoderLayer]:
        """The blocks, typed (an `nn.ModuleList` yields plain modules)."""
        return cast("list[DecoderLayer]", list(self.layers))


class DecoderLM(nn.Module):
    """Module names follow the Hugging Face checkpoints (`model.layers.N.self_attn.q_proj`, ...)."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderBody(config)
        self.lm_head: nn.Linear | None = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        # Branch layout on a CPU: attend the state once for all rows (`attend_split`) instead of
        # copying its K/V into every row; False (or another device) uses one SDPA over the copies.
        self.split_attention = True

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> DecoderLM:
        folder = Path(folder)
        config = DecoderConfig.from_folder(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {folder}")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file), device="cpu"))
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        # cast on the host (half the bytes to move when the model computes in 16 bits), then place
        state = {k: v.to(dtype).to(device) for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
        with torch.device("meta"):
            model = cls(config)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"weights in {folder} do not fit the {config.model_type} layout: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        return model.eval().requires_grad_(False)

    @classmethod
    def random(
        cls, config: DecoderConfig, seed: int = 0, std: float = 0.02, dtype: torch.dtype = torch.float32
    ) -> DecoderLM:
        """Random weights (normal(0, std); norms near 1) — for fixtures, tests and benches."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=gen)
                p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else std * noise)
        return model.to(dtype).eval().requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    # ---------------------------------------------------------------- pieces
    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables cos/sin [B, 1, T, head_dim] for POSITIONS [B, T] (see `apply_rotary`)."""
        return self._rope(positions)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, 1, T, head_dim] for positions [B, T], computed in FP32 like the reference."""
        dim = self.config.head_dim
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim
        freqs = positions[..., None].float() * (1.0 / (self.config.rope_theta**exponent))
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(self.dtype)[:, None], angles.sin().to(self.dtype)[:, None]

    def _layers(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        prefix: SharedState | None = None,
        keep: list | None = None,
        split: bool = False,
        ops: DecoderOps | None = None,
    ) -> torch.Tensor:
        """Hidden states before the final norm. MASK None means causal. With PREFIX, each row also
        sees the state's K/V (by `attend_split` with SPLIT, else by copies under MASK); KEEP collects K/V.
        Each block's MLP output is added to the residual together with the next block's input norm."""
        if split and prefix is None:
            raise ValueError("split attention needs the shared state (PREFIX)")
        ops = ops or EAGER_OPS
        x = self.model.embed_tokens(ids)
        cos, sin = self._rope(positions)
        pending: torch.Tensor | None = None  # the previous block's MLP output, not yet added
        for i, layer in enumerate(self.model.blocks):
            attn = layer.self_attn
            if pending is None:
                normed = layer.input_layernorm(x)
            else:
                x, normed = ops.add_rms_norm(x, pending, layer.input_layernorm)
            q, k, v = attn.qkv(normed, cos, sin)
            if keep is not None:
                keep.append((k.contiguous(), v.contiguous()))
            if split and prefix is not None:
                attended = attn.attend_split(q, k, v, prefix.keys[i], prefix.values[i])
            else:
                if prefix is not None:
                    k = torch.cat((prefix.keys[i].expand(q.shape[0], -1, -1, -1), k), dim=2)
                    v = torch.cat((prefix.values[i].expand(q.shape[0], -1, -1, -1), v), dim=2)
                attended = attn.attend(q, k, v, mask)
            x, normed = ops.add_rms_norm(x, attended, layer.post_attention_layernorm)
            pending = ops.mlp(layer.mlp, normed)
        return x if pending is None else x + pending

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] for hidden rows [N, H] taken before the final norm."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.model.norm(h), weight)

    def _ids(self, ids) -> torch.Tensor:
        return torch.as_tensor(ids).to(device=self.device, dtype=torch.long)

    # ---------------------------------------------------------------- plain rows
    # Rows are right-padded: causal attention alone keeps real tokens from seeing the padding
    # after them, so no padding mask is needed (outputs at padded positions are meaningless).
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final (normed) hidden states [B, T, H] of right-padded rows (`attention_mask` 1 on real tokens)."""
        ids = self._ids(input_ids)
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)
        return self.model.norm(self._layers(ids, positions, None))

    @torch.inference_mode()
    def logits_at(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        *,
        ops: DecoderOps | None = None,
    ) -> torch.Tensor:
        """Next-token logits [B, V] at one position per row (default: each row's last real token)."""
        ids = self._ids(input_ids)
        b, t = ids.shape
        if positions is None:
            positions = attention_mask.sum(1) - 1 if attention_mask is not None else torch.full((b,), t - 1)
        h = self._layers(ids, torch.arange(t, device=ids.device).expand(b, t), None, ops=ops)
        return self._head(h[torch.arange(b, device=h.device), positions.to(h.device).long()])

    # ---------------------------------------------------------------- shared context (R-SC)
    @torch.inference_mode()
    def prefix_kv(self, state_ids: torch.Tensor | Sequence[int], *, ops: DecoderOps | None = None) -> SharedState:
        """Run a state ([S] or [1, S]) once, causally, and keep every layer's keys and values."""
        ids = self._ids(state_ids).reshape(1, -1)
        if ids.shape[1] < 1:
            raise ValueError("a shared state needs at least one token")
        keep: list = []
        self._layers(ids, torch.arange(ids.shape[1], device=ids.device)[None], None, keep=keep, ops=ops)
        return SharedState([k for k, _ in keep], [v for _, v in keep], ids.shape[1])

    @torch.inference_mode()
    def branch_logits(
        self,
        state: SharedState,
        branch_ids: torch.Tensor | Sequence[Sequence[int]],
        lengths: torch.Tensor | Sequence[int] | None = None,
        *,
        chunk: int | None = None,
        ops: DecoderOps | None = None,
    ) -> torch.Tensor:
        """Logits [Q, V] after each question's last token; question q sees the state, then itself causally.

        `branch_ids`: token lists, or a right-padded [Q, L] tensor with `lengths`. Positions continue
        from the state's length. `chunk` bounds the rows run at once (memory).
        """
        ids, lengths = _pad(branch_ids, lengths, self.device)
        step = chunk or max(1, ids.shape[0])
        out = [
            self._branch_rows(state, ids[i : i + step], lengths[i : i + step], ops)
            for i in range(0, ids.shape[0], step)
        ]
        if not out:
            return torch.empty(0, self.config.vocab_size, dtype=self.dtype, device=self.device)
        return torch.cat(out)

    def _branch_rows(
        self, state: SharedState, ids: torch.Tensor, lengths: torch.Tensor, ops: DecoderOps | None = None
    ) -> torch.Tensor:
        rows, t = ids.shape
        split = self.split_attention and _FLASH_CPU is not None and ids.device.type == "cpu"
        mask = None
        if not split:
            causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
            mask = torch.cat((torch.ones(t, state.length, dtype=torch.bool, device=ids.device), causal), dim=1)
        positions = (state.length + torch.arange(t, device=ids.device)).expand(rows, t)
        h = self._layers(ids, positions, mask, prefix=state, split=split, ops=ops)
        return self._head(h[torch.arange(rows, device=ids.device), lengths - 1])

    @torch.inference_mode()
    def packed_tree_logits(
        self,
        state_ids: torch.Tensor | Sequence[int],
        branch_ids: torch.Tensor | Sequence[Sequence[int]],
        lengths: torch.Tensor | Sequence[int] | None = None,
    ) -> torch.Tensor:
        """The packed-tree layout: one row [state; q1; q2; ...] under a tree mask. Logits [Q, V]."""
        state = self._ids(state_ids).reshape(-1)
        ids, lengths = _pad(branch_ids, lengths, self.device)
        s, dev = state.shape[0], state.device
        sizes = [s] + lengths.tolist()
        row = torch.cat([state] + [ids[i, :n] for i, n in enumerate(sizes[1:])])[None]
        segment = torch.repeat_interleave(torch.arange(len(sizes), device=dev), torch.tensor(sizes, device=dev))
        positions = torch.cat([torch.arange(n, device=dev) + (s if i else 0) for i, n in enumerate(sizes)])
        idx = torch.arange(row.shape[1], device=dev)
        mask = (idx[None, :] <= idx[:, None]) & ((segment[None, :] == 0) | (segment[None, :] == segment[:, None]))
        h = self._layers(row, positions[None], mask[None, None])
        return self._head(h[0, s + torch.cumsum(lengths, 0) - 1])


def _pad(branch_ids, lengths, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists or a padded tensor → ([Q, L] long, lengths [Q] long) on DEVICE; every question
    needs ≥ 1 token (checked on the host, before anything moves)."""
    if isinstance(branch_ids, torch.Tensor):
        ids = branch_ids.to(device=device, dtype=torch.long)
        lens = torch.full((ids.shape[0],), ids.shape[1]) if lengths is None else torch.as_tensor(lengths).cpu()
    else:
        rows = [list(r) for r in branch_ids]
        width = max((len(r) for r in rows), default=0)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        ids = ids.to(device)
        lens = torch.tensor([len(r) for r in rows])
    if lens.numel() and (int(lens.min()) < 1 or int(lens.max()) > ids.shape[1]):
        raise ValueError("every question needs at least one token (and no more than its padded width)")
    return ids, lens.to(device=device, dtype=torch.long)


def restricted_probs(logits: torch.Tensor, token_id_sets: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """For each row, the softmax over only that row's answer tokens (FP32), in the order given."""
    out = []
    for row, ids in zip(logits, token_id_sets, strict=True):
        picked = row[torch.as_tensor(list(ids), dtype=torch.long, device=row.device)].float()
        out.append(torch.softmax(picked, dim=-1))
    return out
