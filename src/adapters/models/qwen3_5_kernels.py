"""What runs the Qwen3.5 backbone's Gated DeltaNet steps and its layer loop (`HybridKernels`).

The layers (`qwen3_5_layers.py`) ask their kernels for two steps, and the model (`Qwen35LM._run`)
for the whole stack first:
- `conv`: the causal depthwise convolution + SiLU over rows laid back to back (`Segments`), each
  continuing its tail (zeros, or a shared state's);
- `rule`: the gated delta rule over those rows from the convolution's output (queries, keys and
  values side by side), each from its initial state (zeros, or a shared state's);
- `layers`: every layer and the final norm in one call, or None (the Python layer loop runs).

`TORCH_KERNELS` are torch's own ops on any device and dtype (`gated_delta.py`: the chunked form of
the rule); they are the reference the tests compare with transformers. A CPU serving FP32 runs the
C++ ones (engines/cpu_hybrid.py): the rule token by token, the convolution in one pass, and the
layers in one call that runs the loop's own ops in its order, so a forward's bits are the loop's
on the same kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_srun.adapters.models.gated_delta import Segments, causal_conv, chunk_gated_delta, l2norm, wide


@dataclass
class LayerState:
    """What one layer of a shared state leaves for the rows that continue it (one row: batch 1).
    Linear layers: `tail` [1, K-1, conv channels] and `recurrent` [1, value heads, Dk, Dv] (FP32);
    full layers: `keys` / `values` [1, kv heads, S, head_dim] after norm and rotary."""

    tail: torch.Tensor | None = None
    recurrent: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


@dataclass(frozen=True)
class MixerShape:
    """A Gated DeltaNet layer's heads: queries and keys have `key_heads` of `key_dim`, values
    `value_heads` of `value_dim`; each key head serves value_heads / key_heads consecutive value heads."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int


class HybridKernels:
    """torch's own ops (module doc); a subclass runs some of them its own way."""

    name = "torch"

    def card(self) -> dict[str, str]:
        """What the model card says of these kernels."""
        return {
            "delta_rule": "chunked torch (chunks of 16-64 tokens)",
            "conv": "torch",
            "layers": "a Python loop over the layers",
        }

    def conv(
        self, x: torch.Tensor, weight: torch.Tensor, seg: Segments, tail: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SiLU(causal conv) of X [N, C] under WEIGHT [C, K]; every row's new tail [R, K-1, C]."""
        return causal_conv(x, weight, seg, tail)

    def rule(
        self,
        mixed: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        seg: Segments,
        initial: torch.Tensor | None,
        shape: MixerShape,
        final: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rule's output [N, value heads, value_dim] from MIXED [N, conv channels], G and BETA
        [N, value heads], and each row's last state [R, value heads, key_dim, value_dim] (None
        allowed where not FINAL: nothing continues from it)."""
        n = mixed.shape[0]
        hk, hv, dk, dv = shape.key_heads, shape.value_heads, shape.key_dim, shape.value_dim
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.reshape(n, hk, dk), k.reshape(n, hk, dk), v.reshape(n, hv, dv)
        rep = hv // hk
        if rep > 1:  # each query/key head serves `rep` consecutive value heads
            q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
        q = l2norm(wide(q)) * dk**-0.5
        k = l2norm(wide(k))
        return chunk_gated_delta(q, k, v, g, beta, seg, initial)

    def layers(
        self,
        lm: Any,
        x: torch.Tensor,
        seg: Segments,
        rope: tuple[torch.Tensor, torch.Tensor],
        prefix: list[LayerState] | None,
        keep: bool,
    ) -> tuple[torch.Tensor, list[LayerState]] | None:
        """LM's final-normed hidden states of the embedded tokens X and, where KEEP, what every layer
        leaves for continuations, in one call; None: the caller runs its layer loop (torch has no
        such call)."""
        return None


TORCH_KERNELS = HybridKernels()
