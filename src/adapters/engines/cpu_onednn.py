"""oneDNN fast path for encoders on x86 CPUs (R-DT-3 b): pre-packed FP32 copies of the linear layers.

`PackedEncoder(encoder, head)` keeps, next to the eager weights, a copy of every linear layer's
weight reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`),
and runs it with `torch.ops.mkldnn._linear_pointwise`, the block's activation fused where oneDNN
has it (exact GELU → `gelu`/`none`, tanh GELU → `gelu`/`tanh`, ReLU, SiLU).

The serving forward (`models/unpadded.py`: rows back to back, attention per run of equal-length
rows, no mask) runs on these copies through `PackedEncoder.layers` (and `logits` for the head).
The packed linears give every row of their input the same bits whatever the row count (measured
here, oneDNN 3.x: eager `F.linear` does not), so such forwards are batch-invariant; whether a
model ends up `exact` is still decided by the load-time probe. `PackedLinear` pads its rows with
zero rows up to a bucket (`domain.worker.kernels.bucket_rows`, at least 2: a lone row is the one case
where oneDNN picks another kernel): oneDNN builds a primitive per input shape (each build costs
time: docs/performance.md), so serving sees a bounded set of shapes, built for short forwards at
load (`warm`).

The copies are FP32, or BF16 on a CPU with native BF16 (AVX512-BF16 or AMX; `--dtype bfloat16`):
oneDNN's BF16 kernels then do the linears (BF16 inputs and weights, FP32 accumulation), as torch's
own BF16 `F.linear` does on such a CPU, but on pre-packed weights. A CPU without native BF16
keeps eager BF16 (R-DT-2's warning).

`onednn_unsupported(device, dtype)` says why the path cannot run here (None when it can).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.bert import SequenceClassificationHead
from vllm_srun.adapters.models.encoder_arch import EncoderBlock, EncoderHead, EncoderModule
from vllm_srun.adapters.models.unpadded import LayerLinears
from vllm_srun.domain.worker.kernels import bucket_rows

# the batch-size hint the weights are reordered for; any value >= 2 gave the same blocked kernel
# for every row count >= 2 here (bench/onednn.py times the forwards)
PACK_HINT = 64
# hidden_act → (attr, algorithm) of `_linear_pointwise`; others run unfused after a packed linear
FUSED_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
}
ENV = "VLLM_SRUN_ONEDNN"  # the packed copies' switch: 0/off, 1/on/force, else auto (the measured plan)


def onednn_mode(env: Mapping[str, str]) -> str:
    """`off`, `force` or `auto`: what VLLM_SRUN_ONEDNN in ENV asks of the packed copies."""
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes", "force"):
        return "force"
    return "auto"


X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def onednn_unsupported(device: str, dtype: torch.dtype, native_bf16: bool | None = None) -> str | None:
    """Why the packed path cannot run for a model on DEVICE in DTYPE; None when it can.
    NATIVE_BF16: whether the CPU computes BF16 natively (None: read /proc/cpuinfo)."""
    if device.split(":")[0] != "cpu":
        return f"device {device} is not a CPU"
    if platform.machine().lower() not in X86:
        return f"{platform.machine()} is not an x86 CPU"
    if dtype == torch.bfloat16:
        if native_bf16 is None:
            from vllm_srun.adapters.devices.cpu_features import cpu_has_native_bf16

            native_bf16 = cpu_has_native_bf16()
        if not native_bf16:
            return "dtype bfloat16 on a CPU without native BF16 (no avx512_bf16/amx_bf16): the packed copies need it"
    elif dtype != torch.float32:
        return f"dtype {str(dtype).removeprefix('torch.')}: the packed copies are FP32 or BF16 only"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:  # feature gate: the ops exist and give F.linear's numbers on a small layer
        w, b, x = torch.randn(8, 16), torch.randn(8), torch.randn(3, 16)
        w, b, x = w.to(dtype), b.to(dtype), x.to(dtype)
        y = torch.ops.mkldnn._linear_pointwise(
            x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT), b, "none", [], ""
        )
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        if not torch.allclose(y.float(), F.linear(x, w, b).float(), atol=tol, rtol=tol):
            return "oneDNN's packed linear disagrees with F.linear on a test layer"
    except (RuntimeError, AttributeError) as exc:
        return f"oneDNN packed linears are unavailable: {exc}"[:200]
    return None


class PackedLinear:
    """One linear layer (+ an optional fused activation) on a pre-packed weight copy."""

    __slots__ = ("after", "algorithm", "attr", "bias", "in_features", "out_features", "weight")

    def __init__(
        self,
        linear: nn.Linear,
        activation: str | None = None,
        after: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_HINT)
        self.bias = linear.bias.detach() if linear.bias is not None else None
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.attr, self.algorithm, self.after = "none", "", after
        if after is None and activation is not None:
            if activation in FUSED_ACTIVATIONS:
                self.attr, self.algorithm = FUSED_ACTIVATIONS[activation]
            else:
                from vllm_srun.adapters.models.bert import ACTIVATIONS

                self.after = ACTIVATIONS[activation]

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """[M, in] → [M, out] for M already a bucket size (`bucket_rows`), at least 2."""
        y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.attr, [], self.algorithm)
        return y if self.after is None else self.after(y)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Any [..., in]: the rows are padded to their bucket here (the head's few rows)."""
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        padded = bucket_rows(rows)
        if padded != rows:
            flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
        out = self.rows(flat)[:rows]  # a gated unit's activation halves the width
        return out.view(*x.shape[:-1], out.shape[-1])


class PackedLayer:
    __slots__ = ("attn_out", "ffn_in", "ffn_out", "qkv")

    def __init__(self, layer: EncoderBlock) -> None:
        self.qkv = PackedLinear(layer.qkv)
        self.attn_out = PackedLinear(layer.attn_out)
        # a gated unit's activation runs after the packed linear; a plain one is fused where oneDNN can
        self.ffn_in = PackedLinear(layer.ffn_in, layer.hidden_act, layer.activate if layer.glu else None)
        self.ffn_out = PackedLinear(layer.ffn_out)


class PackedEncoder:
    """Pre-packed copies of an encoder's (and its head's) linear layers; every other tensor (embeddings,
    norms) is the eager model's own."""

    def __init__(self, encoder: EncoderModule, head: EncoderHead | None) -> None:
        self.encoder = encoder
        self.dtype = next(encoder.parameters()).dtype
        self.layers = [PackedLayer(layer) for layer in encoder.blocks]
        # the block linears as the forwards take them: one list, so ops that keep per-linears state
        # (`cpu_op_library.VarlenOps`) find it again on every forward
        self.layer_linears = [LayerLinears(x.qkv, x.attn_out, x.ffn_in, x.ffn_out) for x in self.layers]
        # BERT's head (dense + tanh on the first token, then the classifier) is packed too; other
        # architectures' heads run eagerly on their few rows
        bert_head = head if isinstance(head, SequenceClassificationHead) else None
        self.pooler = PackedLinear(bert_head.pooler.dense) if bert_head is not None else None
        self.classifier = PackedLinear(bert_head.classifier) if bert_head is not None else None
        self.fused_activation = all(b.hidden_act in FUSED_ACTIVATIONS and not b.glu for b in encoder.blocks)

    def warm(self, up_to_rows: int) -> None:
        """Build oneDNN's primitives for every bucket of token rows up to UP_TO_ROWS (and the
        head's few rows), so short forwards never pay that (about 1 ms per linear shape) in serving."""
        sizes = sorted({bucket_rows(n) for n in range(1, max(2, up_to_rows) + 1)})
        layer = self.layers[0]
        hidden = self.encoder.config.hidden_size
        dtype = self.dtype
        with torch.inference_mode():
            for rows in sizes:
                x = torch.zeros(rows, hidden, dtype=dtype)
                # the attention output reads heads x head size, which a decoder's config may set
                # apart from the hidden size (Qwen3-0.6B: 16 x 128 on 1024)
                heads_out = torch.zeros(rows, layer.attn_out.in_features, dtype=dtype)
                layer.qkv.rows(x), layer.attn_out.rows(heads_out), layer.ffn_out.rows(layer.ffn_in.rows(x))
            if self.pooler is not None and self.classifier is not None:
                for rows in sizes[:8]:
                    self.classifier.rows(torch.tanh(self.pooler.rows(torch.zeros(rows, hidden, dtype=dtype))))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.pooler is not None and self.classifier is not None
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))
