"""The tensors the C++ layer ops take for a BERT-shaped post-norm block (`csrc/cpu_forward.cpp`
`encoder_layers` / `int8_layers`, and DeBERTa's `deberta_layers` in `csrc/cpu_stacks.cpp`): each
layer's linears (the oneDNN packed copies, or an int8 package's), its two LayerNorms' weights,
biases and eps, the first feed-forward linear's fused activation and the head count; None where a
layer is not the plain shape those ops run (the caller keeps its Python layer loop)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vllm_srun.adapters.engines.cpu_onednn import FUSED_ACTIVATIONS, PackedLinear
from vllm_srun.adapters.models.unpadded import LayerLinears


def packed_linears(lin: LayerLinears) -> tuple[PackedLinear, PackedLinear, PackedLinear, PackedLinear] | None:
    """LIN's qkv, output, first and second feed-forward linears where all four are the oneDNN packed
    copies (`cpu_onednn.PackedLinear`), else None."""
    q, o, f_in, f_out = lin.qkv, lin.attn_out, lin.ffn_in_act, lin.ffn_out
    if (
        isinstance(q, PackedLinear)
        and isinstance(o, PackedLinear)
        and isinstance(f_in, PackedLinear)
        and isinstance(f_out, PackedLinear)
    ):
        return q, o, f_in, f_out
    return None


def _layer_norms(block: Any) -> tuple[torch.nn.LayerNorm, torch.nn.LayerNorm] | None:
    """BLOCK's two norms where both are LayerNorms with a weight and a bias (what the C++ layers run)."""
    first, second = block.attn_norm, block.ffn_norm
    if all(isinstance(n, torch.nn.LayerNorm) and n.weight is not None and n.bias is not None for n in (first, second)):
        return first, second
    return None


def layer_params(
    blocks: Sequence[Any], linears: Sequence[LayerLinears], hidden: int, supports: Callable[[int], bool]
) -> tuple[list[torch.Tensor], list[float], str, str, int, int] | None:
    """The 12 tensors a layer `encoder_layers` takes, the norms' eps, the first feed-forward linear's
    fused activation, the head count and size; None where a layer is not the plain packed BERT shape."""
    if not blocks:
        return None
    tensors: list[torch.Tensor] = []
    eps: list[float] = []
    ffn = {
        (lin.ffn_in_act.attr, lin.ffn_in_act.algorithm) for lin in linears if isinstance(lin.ffn_in_act, PackedLinear)
    }
    heads = {block.heads for block in blocks}
    if len(ffn) != 1 or len(heads) != 1 or len(blocks) != len(linears):
        return None
    (attr, algorithm), (head_count,) = ffn.pop(), heads
    dim = hidden // head_count
    if not supports(dim):
        return None
    for block, lin in zip(blocks, linears):
        four = packed_linears(lin)
        if four is None:
            return None
        q, o, f_in, f_out = four
        if any(p.after is not None or p.bias is None for p in (q, o, f_in, f_out)):
            return None
        if any(p.attr != "none" for p in (q, o, f_out)):
            return None
        norms = _layer_norms(block)
        if norms is None:
            return None
        first, second = norms
        tensors += [q.weight, q.bias, o.weight, o.bias, first.weight, first.bias]
        tensors += [f_in.weight, f_in.bias, f_out.weight, f_out.bias, second.weight, second.bias]
        eps += [float(first.eps), float(second.eps)]
    return tensors, eps, attr, algorithm, head_count, dim


def int8_layer_params(
    blocks: Sequence[Any], linears: Sequence[LayerLinears], hidden: int, supports: Callable[[int], bool]
) -> tuple[list[torch.Tensor], list[float], str, str, int, int] | None:
    """`layer_params` for an int8 package's linears (`cpu_int8.Int8Linear`, with the C++ row steps):
    24 tensors a layer for `int8_layers`, the first feed-forward linear's activation named as
    `_linear_pointwise` names it; None where a layer is not the plain BERT shape."""
    from vllm_srun.adapters.engines.cpu_int8 import Int8Linear

    heads = {block.heads for block in blocks}
    acts = {(block.hidden_act, block.glu) for block in blocks}
    if not blocks or len(blocks) != len(linears) or len(heads) != 1 or len(acts) != 1:
        return None
    (head_count,), ((act_name, glu),) = heads, acts
    if glu or act_name not in FUSED_ACTIVATIONS:
        return None
    attr, algorithm = FUSED_ACTIVATIONS[act_name]
    dim = hidden // head_count
    if not supports(dim):
        return None
    tensors: list[torch.Tensor] = []
    eps: list[float] = []
    for block, lin in zip(blocks, linears):
        parts = [p for p in (lin.qkv, lin.attn_out, lin.ffn_in_act, lin.ffn_out) if isinstance(p, Int8Linear)]
        if len(parts) != 4 or not all(p.steps.native for p in parts):
            return None
        q, o, f_in, f_out = parts
        if q.act is not None or o.act is not None or f_out.act is not None or f_in.act != block.activate:
            return None
        norms = _layer_norms(block)
        if norms is None:
            return None
        first, second = norms
        held = [[p.weight, p.scale, p.zeros, p.column_sums, p.bias] for p in parts]
        tensors += [*held[0], *held[1], first.weight, first.bias, *held[2], *held[3], second.weight, second.bias]
        eps += [float(first.eps), float(second.eps)]
    return tensors, eps, attr, algorithm, head_count, dim
