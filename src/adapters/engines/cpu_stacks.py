"""Every layer of an encoder that is not BERT-shaped, and its final norm, in one C++ call on a CPU
(`csrc/cpu_stacks.cpp`): decoder backbones served as encoders (Qwen3 / Qwen2 / Llama embedders and
rerankers, `srun_cpu::decoder_layers`), ModernBERT (`srun_cpu::modernbert_layers`) and DeBERTa with
relative attention (`srun_cpu::deberta_layers`).

Their layer loops ran in Python: 20-30 torch ops a layer, and every one gives up the GIL and takes
it back, which beside a busy event loop waits up to a switch interval each time
(`bench/forward_beside_loop.py --arch qwen3`). Each stack runs the same ATen ops in the same
order as its loop, so a row gets the loop's bits, and takes the GIL nowhere inside. Its weights
are held by C++ (`DecoderWeights`, `ModernBertWeights`, `DebertaWeights`, built once per encoder
and linears, DeBERTa's again when its position tables grow: a tensor passed from Python costs a
GIL take when the op drops it); a forward passes only its embedded tokens, its rows' bounds and
its rotary tables and mask.

An encoder names its stack (`one_call_stack`) and hands `ForwardOps.stack` the inputs its loop
would compute first (module docs of `decoder_encoder.py` and `modernbert.py`). `STACKS[name].build`
says None where the stack does not run a model: linears that are not the oneDNN packed copies
(`cpu_onednn.PackedLinear`, no fused activation; the gated unit's input linear followed by the
block's own `activate`), norms it does not know, a dtype other than FP32, or a head size the
one-call attention has no kernel for (SUPPORTS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vllm_srun.adapters.engines.cpu_layer_params import layer_params, packed_linears
from vllm_srun.adapters.engines.cpu_onednn import PackedLinear
from vllm_srun.adapters.models.decoder import RMSNorm
from vllm_srun.adapters.models.unpadded import DisentangledTables, LayerLinears, PackedRows, RelativeBias

NO_TENSOR = torch.empty(0)  # what the ops read as "none" (a bias, a norm or a table the model lacks)
Supports = Callable[[int], bool]
# the gated units' activations the C++ stacks run, by `encoder_parts.ACTIVATIONS` name
GATED_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
GATED_ACTIVATIONS |= {"silu": "silu", "swish": "silu"}


def _fp32(t: torch.Tensor | None) -> bool:
    return t is None or (t.dtype == torch.float32 and t.device.type == "cpu")


def _plain(linear: Any) -> bool:
    return isinstance(linear, PackedLinear) and linear.attr == "none" and linear.after is None and _fp32(linear.bias)


def _gated(linear: Any, block: Any) -> bool:
    """The gated unit's input linear: packed, with the block's own `activate` after it."""
    return (
        isinstance(linear, PackedLinear)
        and linear.attr == "none"
        and linear.after == block.activate
        and _fp32(linear.bias)
    )


def _or_none(t: torch.Tensor | None) -> torch.Tensor:
    return t if t is not None else NO_TENSOR


def _linears(block: Any, lin: LayerLinears) -> list[torch.Tensor] | None:
    """qkv, output, gate/up and down linears' packed weights and biases (8 tensors, the order the
    C++ stacks read them in) where they are what the stacks run, else None."""
    four = packed_linears(lin)
    if four is None:
        return None
    q, o, inner, out = four
    if not (_plain(q) and _plain(o) and _plain(out) and _gated(inner, block)):
        return None
    if any(p.weight.dtype != torch.float32 for p in (q, o, inner, out)):
        return None
    return [t for p in (q, o, inner, out) for t in (p.weight, _or_none(p.bias))]


class DecoderStack:
    """`srun_cpu::decoder_layers`. Inputs: (cos, sin, keep), the rotary tables [N, 1, head_dim]
    and the tokens whose hidden states the caller reads (int64 [K], K a row bucket), or None for
    every token (`DecoderEncoder.packed_forward`)."""

    @staticmethod
    def _norm(norm: Any) -> bool:
        return isinstance(norm, RMSNorm) and _fp32(norm.weight)

    def build(self, encoder: Any, linears: Sequence[LayerLinears], supports: Supports) -> tuple[Any, int] | None:
        """ENCODER's `DecoderWeights` on these LINEARS and its query head count, or None."""
        blocks = list(encoder.blocks)
        final = encoder.lm.model.norm
        if not blocks or len(blocks) != len(linears) or not self._norm(final):
            return None
        shapes = {(b.heads, b.kv_heads, b.head_dim, b.intermediate) for b in blocks}
        if len(shapes) != 1:
            return None
        ((heads, kv_heads, head_dim, intermediate),) = shapes
        if not supports(head_dim) or heads % kv_heads or head_dim % 2:
            return None
        tensors: list[torch.Tensor] = []
        eps: list[float] = []
        for block, lin in zip(blocks, linears, strict=True):
            packed = _linears(block, lin)
            per_head = block.q_norm is not None and block.k_norm is not None
            norms = (block.input_norm, block.post_norm, *((block.q_norm, block.k_norm) if per_head else ()))
            if packed is None or block.hidden_act != "silu" or not all(self._norm(n) for n in norms):
                return None
            if per_head:
                head_norms, head_eps = [block.q_norm.weight, block.k_norm.weight], [block.q_norm.eps, block.k_norm.eps]
            else:
                head_norms, head_eps = [NO_TENSOR, NO_TENSOR], [0.0, 0.0]
            tensors += [block.input_norm.weight, *packed[:2], *head_norms, *packed[2:4], block.post_norm.weight]
            tensors += packed[4:]
            eps += [block.input_norm.eps, *head_eps, block.post_norm.eps]
        weights = torch.classes.srun_cpu.DecoderWeights(
            [t.detach() for t in tensors],
            [float(e) for e in eps],
            heads,
            kv_heads,
            head_dim,
            intermediate,
            final.weight.detach(),
            float(final.eps),
        )
        return weights, heads

    def run(self, held: tuple[Any, int], x: torch.Tensor, packed: PackedRows, inputs: tuple[Any, ...]) -> torch.Tensor:
        weights, heads = held
        cos, sin, keep = inputs
        causal = RelativeBias.causal(packed.longest, heads, x)
        return torch.ops.srun_cpu.decoder_layers(
            weights, x, packed.starts, packed.lengths, cos, sin, causal.table, causal.centre, keep
        )


class ModernBertStack:
    """`srun_cpu::modernbert_layers`. Inputs: (global cos, global sin, local cos, local sin, window),
    the rotary tables [N, 1, head_dim] of the global and the sliding layers' thetas and the sliding
    layers' window as a `RelativeBias`, or None where the forward's longest row fits in it."""

    @staticmethod
    def _norm(norm: Any) -> bool:
        return (
            isinstance(norm, torch.nn.LayerNorm)
            and norm.weight is not None
            and _fp32(norm.weight)
            and _fp32(norm.bias)
            and len(norm.normalized_shape) == 1
        )

    def build(self, encoder: Any, linears: Sequence[LayerLinears], supports: Supports) -> Any | None:
        """ENCODER's `ModernBertWeights` on these LINEARS (the head count is in them), or None."""
        blocks = list(encoder.blocks)
        final = encoder.final_norm
        if not blocks or len(blocks) != len(linears) or not self._norm(final):
            return None
        shapes = {(b.heads, b.head_dim, b.hidden_act) for b in blocks}
        if len(shapes) != 1:
            return None
        ((heads, head_dim, act),) = shapes
        if not supports(head_dim) or head_dim % 2 or act not in GATED_ACTIVATIONS:
            return None
        tensors: list[torch.Tensor] = []
        eps: list[float] = []
        global_layers: list[int] = []
        for index, (block, lin) in enumerate(zip(blocks, linears, strict=True)):
            packed = _linears(block, lin)
            first = block.attn_norm
            plain_first = index == 0 and isinstance(first, torch.nn.Identity)
            if packed is None or not (plain_first or self._norm(first)) or not self._norm(block.mlp_norm):
                return None
            first_norm = [NO_TENSOR, NO_TENSOR] if plain_first else [first.weight, _or_none(first.bias)]
            tensors += [*first_norm, *packed[:4], block.mlp_norm.weight, _or_none(block.mlp_norm.bias), *packed[4:]]
            eps += [0.0 if plain_first else first.eps, block.mlp_norm.eps]
            global_layers.append(int(block.window is None))
        return torch.classes.srun_cpu.ModernBertWeights(
            [t.detach() for t in tensors],
            [float(e) for e in eps],
            global_layers,
            heads,
            GATED_ACTIVATIONS[act],
            final.weight.detach(),
            _or_none(final.bias).detach(),
            float(final.eps),
        )

    def run(self, weights: Any, x: torch.Tensor, packed: PackedRows, inputs: tuple[Any, ...]) -> torch.Tensor:
        global_cos, global_sin, local_cos, local_sin, window = inputs
        table, centre = (window.table, window.centre) if window is not None else (NO_TENSOR, 0)
        return torch.ops.srun_cpu.modernbert_layers(
            weights, x, packed.starts, packed.lengths, global_cos, global_sin, local_cos, local_sin, table, centre
        )


class DebertaLayers:
    """DeBERTa's layer weights for `deberta_layers`, and the C++ holder built with the position tables
    of the last forward (a new holder only when the encoder's tables grow: `distance_tables` keeps
    them until a longer row needs more; two forwards at once may both build one, each uses its own)."""

    def __init__(
        self, tensors: list[torch.Tensor], eps: list[float], scales: list[float], heads: int, attr: str, algorithm: str
    ) -> None:
        self.tensors, self.eps, self.scales = tensors, eps, scales
        self.heads, self.attr, self.algorithm = heads, attr, algorithm
        self._with: tuple[Sequence[DisentangledTables] | None, Any] = (None, None)

    def weights(self, tables: Sequence[DisentangledTables]) -> Any:
        seen, weights = self._with
        if seen is not tables:
            weights = torch.classes.srun_cpu.DebertaWeights(
                self.tensors,
                self.eps,
                self.scales,
                [t.keys for t in tables],
                [t.queries for t in tables],
                self.heads,
                tables[0].centre,
                self.attr,
                self.algorithm,
            )
            self._with = (tables, weights)
        return weights


class DebertaStack:
    """`srun_cpu::deberta_layers`. Inputs: (tables,), every layer's `DisentangledTables` reaching the
    forward's longest row (`DebertaV2Encoder.distance_tables`). Only for relative attention without
    the convolution after the first layer (DeBERTa-v2's xlarge models keep the loop)."""

    def build(self, encoder: Any, linears: Sequence[LayerLinears], supports: Supports) -> DebertaLayers | None:
        blocks = list(encoder.blocks)
        if not encoder.relative or encoder.conv is not None or not blocks:
            return None
        if any(b.head_dim * b.heads != encoder.config.hidden_size for b in blocks):
            return None  # `layer_params` reads the head size off the hidden size
        params = layer_params(blocks, linears, encoder.config.hidden_size, supports)
        if params is None:
            return None
        tensors, eps, attr, algorithm, heads, _ = params
        return DebertaLayers(
            [t.detach() for t in tensors], eps, [float(b.scale) for b in blocks], heads, attr, algorithm
        )

    def run(self, held: DebertaLayers, x: torch.Tensor, packed: PackedRows, inputs: tuple[Any, ...]) -> torch.Tensor:
        (tables,) = inputs
        return torch.ops.srun_cpu.deberta_layers(held.weights(tables), x, packed.starts, packed.lengths)


STACKS: dict[str, DecoderStack | ModernBertStack | DebertaStack] = {
    "decoder": DecoderStack(),
    "modernbert": ModernBertStack(),
    "deberta": DebertaStack(),
}
