"""The Qwen3.5 backbone's C++ kernels on a CPU (`HybridKernels`, models/qwen3_5_kernels.py): the
Gated DeltaNet's convolution and delta rule (`csrc/gated_delta.cpp`) and every layer in one call
(`csrc/qwen3_5_layers.cpp`), built into the `srun_cpu` library with the other CPU ops
(engines/cpu_op_library.py).

torch's chunked delta rule spends most of its time outside its products on a CPU: the UT
transform's batched triangular solves, the gathers into and out of the chunk layout, a dozen
elementwise passes (on Qwen3.5-0.8B's shape, 16 rows of ~128 tokens, the solves alone were a fifth
of a forward). `srun_cpu::gated_delta_rule` runs the rule token by token instead, one task per
(row, value head, block of state columns) keeping its block in L1 (module doc of the C++ file):
3·Dk·Dv multiply-adds a token, a row's numbers its own whatever the forward holds.
`srun_cpu::causal_conv` runs the convolution in one pass over the rows, each tap's weights for every
channel side by side. The layer loop calls them both (`conv`, `rule`); `srun_cpu::qwen3_5_layers`
runs every layer and the final norm in one call on the same kernels and the loop's own ATen ops in
its order, so a forward keeps the loop's bits and gives up the GIL once instead of at every op.
Its weights are held by C++ (`Qwen35Weights`, built at the first forward of a model); a forward
passes its embedded tokens, its rows' lengths, its rotary tables and, continuing a shared state
(R-SC), what each layer of the state left (conv tails and recurrent states, keys and values).

The kernels run FP32 on the CPU; anything else (another dtype, a GPU tensor) goes to torch's
(`HybridKernels`). The stack declines a branch forward whose full-attention layers do not attend
the state in the split form (`Qwen35LM.split_attention` off): the loop runs it.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_srun.adapters.models.gated_delta import Segments
from vllm_srun.adapters.models.qwen3_5_kernels import HybridKernels, LayerState, MixerShape

NO_TENSOR = torch.empty(0)  # what the ops read as "none" (a bias, a tail or a state)
LINEAR, FULL = 0, 1  # `Qwen35Weights` layer kinds


def _fp32_cpu(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu") for t in tensors)


def _or_none(t: torch.Tensor | None) -> torch.Tensor:
    return t.detach() if t is not None else NO_TENSOR


class CppHybridKernels(HybridKernels):
    """The C++ convolution and delta rule and, with STACK, the layers in one call (module doc)."""

    name = "cpp"

    def __init__(self, stack: bool = True) -> None:
        self.stack = stack
        self._held: dict[int, tuple[Any, Any]] = {}  # id(lm) → (lm, its `Qwen35Weights` or None)

    def card(self) -> dict[str, str]:
        return {
            "delta_rule": "C++ token by token, one task per row, value head and block of state columns",
            "conv": "C++ one pass over the rows",
            "layers": "every layer and the final norm in one C++ call (no GIL taken in it)"
            if self.stack
            else "a Python loop over the layers",
        }

    def conv(
        self, x: torch.Tensor, weight: torch.Tensor, seg: Segments, tail: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not _fp32_cpu(x, weight, tail):
            return super().conv(x, weight, seg, tail)
        given = tail.contiguous() if tail is not None else NO_TENSOR
        out, tails = torch.ops.srun_cpu.causal_conv(x.contiguous(), weight, list(seg.lengths), given)
        return out, tails

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
        if not _fp32_cpu(mixed, g, beta, initial):
            return super().rule(mixed, g, beta, seg, initial, shape, final)
        out, state = torch.ops.srun_cpu.gated_delta_rule(
            mixed.contiguous(),
            g.contiguous(),
            beta.contiguous(),
            list(seg.lengths),
            initial.contiguous() if initial is not None else NO_TENSOR,
            shape.key_heads,
            shape.value_heads,
            shape.key_dim,
            shape.value_dim,
            final,
        )
        return out, state if final else None

    def layers(
        self,
        lm: Any,
        x: torch.Tensor,
        seg: Segments,
        rope: tuple[torch.Tensor, torch.Tensor],
        prefix: list[LayerState] | None,
        keep: bool,
    ) -> tuple[torch.Tensor, list[LayerState]] | None:
        if not self.stack or not _fp32_cpu(x, *rope) or (prefix is not None and not lm.split_attention):
            return None
        weights = self.weights(lm)
        if weights is None:
            return None
        flat: list[torch.Tensor] = []
        for state in prefix or ():
            pair = (state.tail, state.recurrent) if state.keys is None else (state.keys, state.values)
            if any(t is None or not _fp32_cpu(t) for t in pair):
                return None
            flat += [t for t in pair if t is not None]
        cos, sin = rope
        out = torch.ops.srun_cpu.qwen3_5_layers(weights, x, list(seg.lengths), cos, sin, flat, keep)
        kept: list[LayerState] = []
        if keep:
            for i, block in enumerate(lm.model.blocks):
                first, second = out[1 + 2 * i], out[2 + 2 * i]
                linear = block.kind == "linear_attention"
                kept.append(
                    LayerState(tail=first, recurrent=second) if linear else LayerState(keys=first, values=second)
                )
        return out[0], kept

    def weights(self, lm: Any) -> Any | None:
        """LM's `Qwen35Weights`, built at the first call and kept (None: weights the stack does not
        run, not FP32 on the CPU)."""
        entry = self._held.get(id(lm))
        if entry is None:
            entry = (lm, _build_weights(lm))
            self._held[id(lm)] = entry
        return entry[1]


def _build_weights(lm: Any) -> Any | None:
    """The 16 tensors a layer `Qwen35Weights` holds (its C++ doc), or None where a tensor is not FP32 on the CPU."""
    c = lm.config
    tensors: list[torch.Tensor | None] = []
    kinds: list[int] = []
    for block in lm.model.blocks:
        mlp = block.mlp
        common = [block.input_layernorm.weight, block.post_attention_layernorm.weight]
        common += [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
        if block.kind == "linear_attention":
            a = block.linear_attn
            own = [a.in_proj_qkv.weight, a.in_proj_z.weight, a.in_proj_b.weight, a.in_proj_a.weight]
            own += [a.conv1d.weight[:, 0], a.dt_bias, a.A_log, a.norm.weight, a.out_proj.weight, None, None]
            kinds.append(LINEAR)
        else:
            s = block.self_attn
            own = [t for p in (s.q_proj, s.k_proj, s.v_proj, s.o_proj) for t in (p.weight, p.bias)]
            own += [s.q_norm.weight, s.k_norm.weight, None]
            kinds.append(FULL)
        tensors += common + own
    final = lm.model.norm.weight
    if not _fp32_cpu(final, *tensors):
        return None
    shape = [c.num_heads, c.num_kv_heads, c.head_dim]
    shape += [c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, c.linear_value_dim]
    return torch.classes.srun_cpu.Qwen35Weights(
        [_or_none(t) for t in tensors], kinds, shape, float(c.rms_norm_eps), final.detach()
    )
