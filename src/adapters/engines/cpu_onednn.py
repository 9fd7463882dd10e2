"""oneDNN fast path for encoders on x86 CPUs (R-DT-3 b): pre-packed FP32 copies of the linear layers.

`PackedEncoder(encoder, head)` keeps, next to the eager weights, a copy of every linear layer's
weight reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`),
and runs it with `torch.ops.mkldnn._linear_pointwise`, the block's activation fused where oneDNN
has it (exact GELU → `gelu`/`none`, tanh GELU → `gelu`/`tanh`, ReLU, SiLU).

`PackedEncoder.hidden(ids, lengths, types)` is the encoder forward on those copies. Attention runs
on each run of equal-length rows without padding or a mask, and `pooled` pools each run on its
own tokens, so a row's numbers do not depend on the rows it shares a forward with: the packed
linears give every row of their input the same bits whatever the row count (measured on this
CPU, oneDNN 3.x; a lone row is padded to two rows, the one case where oneDNN picks another
kernel). The token rows of a forward are padded once with zero rows up to a bucket
(`domain.kernels.bucket_rows`): oneDNN builds a primitive per input shape (about 1 ms each,
measured here), so serving sees a bounded set of shapes. Whether a model ends up batch-invariant is still decided by the load-time probe.

`onednn_unsupported(device, dtype)` says why the path cannot run here (None when it can).
"""

from __future__ import annotations

import platform
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.bert import BertEncoder, SequenceClassificationHead
from vllm_srun.adapters.models.pooling import PoolingConfig, pool
from vllm_srun.domain.kernels import bucket_rows

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
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def onednn_unsupported(device: str, dtype: torch.dtype) -> str | None:
    """Why the packed path cannot run for a model on DEVICE in DTYPE; None when it can."""
    if device.split(":")[0] != "cpu":
        return f"device {device} is not a CPU"
    if platform.machine().lower() not in X86:
        return f"{platform.machine()} is not an x86 CPU"
    if dtype != torch.float32:
        return f"dtype {str(dtype).removeprefix('torch.')}: the packed copies are FP32 only"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:  # feature gate: the ops exist and give F.linear's numbers on a small layer
        w, b, x = torch.randn(8, 16), torch.randn(8), torch.randn(3, 16)
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT), b, "none", [], "")
        if not torch.allclose(y, F.linear(x, w, b), atol=1e-4):
            return "oneDNN's packed linear disagrees with F.linear on a test layer"
    except (RuntimeError, AttributeError) as exc:
        return f"oneDNN packed linears are unavailable: {exc}"[:200]
    return None


class PackedLinear:
    """One linear layer (+ an optional fused activation) on a pre-packed weight copy."""

    __slots__ = ("weight", "bias", "attr", "algorithm", "after", "out_features")

    def __init__(self, linear: nn.Linear, activation: str | None = None) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_HINT)
        self.bias = linear.bias.detach() if linear.bias is not None else None
        self.out_features = linear.out_features
        self.attr, self.algorithm, self.after = "none", "", None
        if activation is not None:
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
        return self.rows(flat)[:rows].view(*x.shape[:-1], self.out_features)


class PackedLayer:
    __slots__ = ("qkv", "attn_out", "ffn_in", "ffn_out")

    def __init__(self, layer: nn.Module, activation: str) -> None:
        self.qkv = PackedLinear(layer.qkv)
        self.attn_out = PackedLinear(layer.attn_out)
        self.ffn_in = PackedLinear(layer.ffn_in, activation)
        self.ffn_out = PackedLinear(layer.ffn_out)


Runs = list[tuple[int, int, int]]  # (first row, end row, length) of consecutive equal-length rows


def length_runs(lengths: Sequence[int]) -> Runs:
    """Consecutive rows of equal length, in order (the planner sends padded rows longest first)."""
    runs: Runs = []
    start = 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or lengths[i] != lengths[start]:
            runs.append((start, i, int(lengths[start])))
            start = i
    return runs


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, runs: Runs) -> torch.Tensor:
    """Each run of equal-length rows attends over its own tokens only: no mask, no padding."""
    t = q.shape[2]
    if len(runs) == 1 and runs[0][2] == t:
        return F.scaled_dot_product_attention(q, k, v)
    out = q.new_zeros(q.shape)
    for start, end, n in runs:
        out[start:end, :, :n] = F.scaled_dot_product_attention(q[start:end, :, :n], k[start:end, :, :n],
                                                               v[start:end, :, :n])
    return out


class PackedEncoder:
    """The encoder (and head) forward on pre-packed copies; shares every other tensor with the eager model."""

    def __init__(self, encoder: BertEncoder, head: SequenceClassificationHead | None) -> None:
        act = encoder.config.hidden_act
        self.encoder = encoder
        self.layers = [PackedLayer(layer, act) for layer in encoder.layers]
        self.pooler = PackedLinear(head.pooler.dense) if head is not None else None
        self.classifier = PackedLinear(head.classifier) if head is not None else None
        self.fused_activation = act in FUSED_ACTIVATIONS

    def hidden(self, ids: torch.Tensor, lengths: Sequence[int], types: torch.Tensor | None) -> torch.Tensor:
        """Last hidden state [B, T, H]; positions past a row's length hold no meaningful values.

        The B·T token rows run as one flat [M, H] buffer padded once with zero rows to M =
        `bucket_rows(B·T)`; the padding rows go through the linears and norms (row by row, so
        they touch no real row) and are never attended to."""
        runs = length_runs(lengths)
        b, t = ids.shape
        h = self.encoder.config.hidden_size
        real, padded = b * t, bucket_rows(b * t)
        x = self.encoder.embeddings(ids, types).reshape(real, h)
        if padded != real:
            x = torch.cat([x, x.new_zeros(padded - real, h)])
        for layer, packed in zip(self.encoder.layers, self.layers):
            q, k, v = packed.qkv.rows(x)[:real].view(b, t, 3, layer.heads, h // layer.heads).permute(2, 0, 3, 1, 4)
            a = x.new_zeros(padded, h) if padded != real else x.new_empty(padded, h)
            a[:real].view(b, t, layer.heads, h // layer.heads).copy_(_attention(q, k, v, runs).transpose(1, 2))
            x = layer.attn_norm(packed.attn_out.rows(a) + x)
            x = layer.ffn_norm(packed.ffn_out.rows(packed.ffn_in.rows(x)) + x)
        return x[:real].view(b, t, h)

    def warm(self, up_to_rows: int) -> None:
        """Build oneDNN's primitives for every bucket of token rows up to UP_TO_ROWS (and the
        head's few rows), so short forwards never pay that (about 1 ms per linear shape) in serving."""
        sizes = sorted({bucket_rows(n) for n in range(1, max(2, up_to_rows) + 1)})
        layer = self.layers[0]
        hidden = self.encoder.config.hidden_size
        with torch.inference_mode():
            for rows in sizes:
                x = torch.zeros(rows, hidden)
                layer.qkv.rows(x), layer.attn_out.rows(x), layer.ffn_out.rows(layer.ffn_in.rows(x))
            if self.pooler is not None and self.classifier is not None:
                for rows in sizes[:8]:
                    self.classifier.rows(torch.tanh(self.pooler.rows(torch.zeros(rows, hidden))))

    @staticmethod
    def pooled(hidden: torch.Tensor, lengths: Sequence[int], cfg: PoolingConfig) -> torch.Tensor:
        runs = length_runs(lengths)
        if len(runs) == 1:
            return pool(hidden[:, : runs[0][2]], None, cfg)
        return torch.cat([pool(hidden[start:end, :n], None, cfg) for start, end, n in runs])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.pooler is not None and self.classifier is not None
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


