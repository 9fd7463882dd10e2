"""The Gated DeltaNet token mixer's two sequence steps, over rows laid back to back (no padding).

Rows of different lengths share one [N, …] matrix of tokens (`Segments`: each row's start and
length). Both steps restart at every row's start, so no state passes from one row to the next:

- `causal_conv`: the causal depthwise convolution (kernel K) with SiLU. Each token reads itself and
  the K-1 tokens before it in its own row; before a row's first token it reads the row's *tail*
  (zeros, or the last K-1 inputs of a shared state the row continues). Computed as K shifted
  products summed in FP32, element by element, so a token's output never depends on its
  neighbours' rows.
- `chunk_gated_delta`: the gated delta rule in its chunked form (chunks of 64 tokens, as
  transformers' torch fallback; a row of 32 tokens or fewer is one chunk of 32 or 16, the same
  arithmetic on less padding): each row is cut into its own chunks (the last one zero-padded,
  which leaves the state untouched: β = 0, decay 1), the within-chunk work (the UT transform's
  triangular solves, the chunk's own attention) runs for every chunk of every row at once, and
  the scan over chunks carries each row's recurrent state [value heads, key dim, value dim] from
  its initial state (zeros, or a shared state's). Rows are ordered longest first so that step j
  works on a leading slice of the rows. FP32 throughout, whatever the model's dtype (FP64 stays
FP64: tests run an exact reference that way).

`recurrent_gated_delta` is the token-by-token form of the same rule (tests compare the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 64


@dataclass(frozen=True)
class Segments:
    """Rows laid back to back: host lengths and the per-token index tensors (on the model's device)."""

    lengths: tuple[int, ...]
    starts: torch.Tensor  # [R] first token of each row
    row: torch.Tensor  # [N] the row of each token
    offset: torch.Tensor  # [N] each token's place in its row

    @classmethod
    def of(cls, lengths: Sequence[int], device: torch.device | str = "cpu") -> Segments:
        sizes = [int(n) for n in lengths]
        if not sizes or min(sizes) < 1:
            raise ValueError("every row needs at least one token")
        counts = torch.tensor(sizes, dtype=torch.long)
        starts = torch.cumsum(counts, 0) - counts
        row = torch.repeat_interleave(torch.arange(len(sizes)), counts)
        offset = torch.arange(int(counts.sum())) - starts[row]
        return cls(tuple(sizes), starts.to(device), row.to(device), offset.to(device))

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def ends(self) -> torch.Tensor:
        """[R] one past each row's last token."""
        return self.starts + torch.tensor(self.lengths, dtype=torch.long, device=self.starts.device)


def causal_conv(
    x: torch.Tensor, weight: torch.Tensor, seg: Segments, tail: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(causal depthwise conv1d) of X [N, C] under WEIGHT [C, K], each row on its own.

    TAIL [R or 1, K-1, C]: what each row continues (None: zeros). Returns the output [N, C] in X's
    dtype and every row's new tail [R, K-1, C] (its last K-1 inputs, reaching into TAIL when the
    row is shorter than K-1)."""
    n, c = x.shape
    k = weight.shape[-1]
    r = seg.rows
    dev = x.device
    # each row gets K-1 slots in front of it: its tail
    place = seg.offset + seg.row * (k - 1) + seg.starts[seg.row] + (k - 1)  # [N] → extended buffer
    ext = torch.zeros(n + r * (k - 1), c, dtype=x.dtype, device=dev)
    if tail is not None:
        front = (seg.starts + torch.arange(r, device=dev) * (k - 1))[:, None] + torch.arange(k - 1, device=dev)
        ext[front.reshape(-1)] = tail.to(x.dtype).expand(r, -1, -1).reshape(-1, c)
    ext[place] = x
    w = wide(weight)
    out = wide(ext[place - (k - 1)]) * w[:, 0]
    for j in range(1, k):
        out = out + wide(ext[place - (k - 1) + j]) * w[:, j]
    last = (
        (seg.ends + torch.arange(1, r + 1, device=dev) * (k - 1))[:, None] - (k - 1) + torch.arange(k - 1, device=dev)
    )
    return F.silu(out).to(x.dtype), ext[last.reshape(-1)].reshape(r, k - 1, c)


def wide(x: torch.Tensor) -> torch.Tensor:
    """X in FP32, or left in FP64 (a test's exact reference runs the whole model in FP64)."""
    return x if x.dtype == torch.float64 else x.float()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


@dataclass(frozen=True)
class _ChunkLayout:
    """Where each token sits in the [chunks, chunk] layout, rows ordered longest first."""

    slot: torch.Tensor  # [N] flat slot (chunk × size + place) of each token
    active: list[int]  # rows still running at scan step j (a leading slice of the sorted rows)
    first: list[int]  # first chunk of step j
    order: torch.Tensor  # [R] sorted place → row
    chunks: int

    @classmethod
    def of(cls, seg: Segments, chunk: int) -> _ChunkLayout:
        counts = [(n + chunk - 1) // chunk for n in seg.lengths]
        order = sorted(range(seg.rows), key=lambda i: -counts[i])
        rank = [0] * seg.rows
        for place, i in enumerate(order):
            rank[i] = place
        steps = max(counts)
        active = [sum(1 for n in counts if n > j) for j in range(steps)]
        first = [sum(active[:j]) for j in range(steps)]
        dev = seg.row.device
        step = torch.div(seg.offset, chunk, rounding_mode="floor")
        base = torch.tensor(first, dtype=torch.long, device=dev)[step]
        ranks = torch.tensor(rank, dtype=torch.long, device=dev)[seg.row]
        slot = (base + ranks) * chunk + seg.offset - step * chunk
        return cls(slot, active, first, torch.tensor(order, dtype=torch.long, device=dev), sum(active))


def chunk_size(length: int) -> int:
    """A row's chunk: 64 tokens (transformers' chunk) for a row past 32 tokens; a shorter row is
    one chunk of 32 or 16, the same arithmetic on less padding (a question branching from a
    shared state is typically 10 to 30 tokens)."""
    return CHUNK if length > CHUNK // 2 else 32 if length > 16 else 16


def chunk_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    seg: Segments,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over each row (module doc), chunked (`chunk_size` per row).

    Q, K [N, H, Dk] (already L2-normed; Q scaled by Dk^-0.5), V [N, H, Dv], G (log decay) and
    BETA [N, H]; INITIAL_STATE [R or 1, H, Dk, Dv] or None (zeros). Returns the output [N, H, Dv]
    and each row's final state [R, H, Dk, Dv], FP32 (FP64 inputs: FP64). A row's arithmetic
    depends on its own tokens and length only, never on the rows beside it."""
    sizes = [chunk_size(n) for n in seg.lengths]
    if len(set(sizes)) == 1:
        return _chunked(q, k, v, g, beta, seg, initial_state, sizes[0])
    n, h, dk = k.shape
    compute = wide(q).dtype
    out = torch.empty(n, h, v.shape[-1], dtype=compute, device=q.device)
    final = torch.empty(seg.rows, h, dk, v.shape[-1], dtype=compute, device=q.device)
    starts = [0]
    for length in seg.lengths:
        starts.append(starts[-1] + length)
    for size in sorted(set(sizes)):
        rows = [i for i, c in enumerate(sizes) if c == size]
        at = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in rows]).to(q.device)
        init = initial_state
        if init is not None and init.shape[0] > 1:
            init = init[torch.tensor(rows, device=init.device)]
        sub = Segments.of([seg.lengths[i] for i in rows], q.device)
        o, f = _chunked(q[at], k[at], v[at], g[at], beta[at], sub, init, size)
        out[at] = o
        final[torch.tensor(rows, device=q.device)] = f
    return out, final


def _chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    seg: Segments,
    initial_state: torch.Tensor | None,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_gated_delta` for rows that all take chunks of CHUNK tokens."""
    h, dk, dv = k.shape[1], k.shape[2], v.shape[-1]
    lay = _ChunkLayout.of(seg, chunk)
    total = lay.chunks * chunk
    compute = wide(q).dtype

    def laid(x: torch.Tensor) -> torch.Tensor:  # [N, H, …] → [chunks, H, chunk, …], zero-padded
        out = torch.zeros((total, *x.shape[1:]), dtype=compute, device=x.device)
        out[lay.slot] = x.to(compute)
        return out.reshape(lay.chunks, chunk, *x.shape[1:]).transpose(1, 2).contiguous()

    query, key, value = laid(q), laid(k), laid(v)
    b, decay = laid(beta), laid(g)  # [chunks, H, chunk]
    v_beta = value * b.unsqueeze(-1)
    k_beta = key * b.unsqueeze(-1)
    cum = decay.cumsum(dim=-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    pair = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ key.transpose(-1, -2)) * pair
    intra = (query @ key.transpose(-1, -2)) * pair
    decayed_k_beta = k_beta * cum.exp().unsqueeze(-1)
    # the UT transform: (I + strictly-lower part of UT)⁻¹, once, for both right-hand sides (one
    # triangular solve against the identity and two batched products: several times faster on a
    # CPU than two solves against the wide right-hand sides)
    eye = torch.eye(chunk, dtype=compute, device=q.device).expand_as(ut)
    transform = torch.linalg.solve_triangular(ut, eye, upper=False, unitriangular=True)
    new_values = transform @ v_beta
    k_cumdecay = transform @ decayed_k_beta
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]

    r = seg.rows
    if initial_state is None:
        state = torch.zeros(r, h, dk, dv, dtype=compute, device=q.device)
    else:
        state = initial_state.to(compute).expand(r, -1, -1, -1)[lay.order].contiguous()
    out = torch.empty_like(new_values)
    for active, first in zip(lay.active, lay.first, strict=True):
        at = slice(first, first + active)
        s = state[:active]
        v_new = new_values[at] - k_cumdecay[at] @ s
        out[at] = query[at] @ s + intra[at] @ v_new
        state[:active] = s * chunk_decay[at] + key[at].transpose(-1, -2) @ v_new
    tokens = out.transpose(1, 2).reshape(total, h, dv)[lay.slot]
    final = torch.empty_like(state)
    final[lay.order] = state
    return tokens, final


def recurrent_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's gated delta rule token by token (shapes as `chunk_gated_delta` without rows):
    S ← S·exp(g); S ← S + k ⊗ β(v − Sᵀk); o = Sᵀq. FP32 (FP64 inputs: FP64)."""
    t, h, dk = k.shape
    compute = wide(q).dtype
    zeros = torch.zeros(h, dk, v.shape[-1], dtype=compute, device=q.device)
    state = zeros if initial_state is None else initial_state.to(compute).clone()
    out = torch.empty(t, h, v.shape[-1], dtype=compute, device=q.device)
    for i in range(t):
        state = state * wide(g[i]).exp()[:, None, None]
        remembered = (state * wide(k[i])[:, :, None]).sum(dim=-2)
        delta = (wide(v[i]) - remembered) * wide(beta[i])[:, None]
        state = state + wide(k[i])[:, :, None] * delta[:, None, :]
        out[i] = (state * wide(q[i])[:, :, None]).sum(dim=-2)
    return out, state
