"""Int8 packages (`vllm-srun quantize MODEL OUT --int8`, R-DT-4): the weight format and the package marker.

A quantized package is its own model, with its own answers (and its own golden file). Its encoder
blocks' linear weights (Q, K, V, attention output, feed-forward in and out) are stored as int8
under their usual names, one symmetric scale per output channel beside each as `<name>_scale`
(float32, one value per row): the weight is `q × scale` row by row. Everything else — embeddings,
norms, biases, the pooler and classification head, sentence-transformers Dense modules — stays as
published (FP32). `config.json` says so under `quantization_config` (`QUANT_METHOD`, bits,
granularity).

Scales are *canonical*: `(127 × s) / 127 == s` in float32. So the weights the loader rebuilds
(`q × scale`, `weights.py`) give back exactly the same `q` and `scale` when quantized again
(`quantize_rows`): the int8 engine (`engines/cpu_int8.py`) takes its int8 copies from the
dequantized weights and checks the round trip bit for bit (`int8_grid`), so it runs the package's
own int8 values, and an engine never reads a package file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vllm_srun.adapters.models.manifest import read_config

QUANT_METHOD = "vllm-srun-int8"
QUANT_KEY = "quantization_config"  # config.json's entry, where Hugging Face packages name their quantization
SCALE_SUFFIX = "_scale"  # `<weight name>_scale`: the per-row scales of an int8 weight
QMAX = 127  # symmetric int8: -127..127 (-128 unused, so negating a weight never overflows)
BLOCK_LINEARS = ("qkv", "attn_out", "ffn_in", "ffn_out")  # the linears of an encoder block that are int8
# The golden check's tolerance for an int8 package's references (`golden.json` `tolerance`). Activations
# are rounded to int8 at every linear, so a last-bit change in an FP32 kernel around them (another CPU's
# vector width, the attention op or SDPA) moves a code by one step now and then: MiniLM's embeddings
# then move by up to 8e-3 (1.6e-2 cut to 64 dimensions) over 388 bench texts, where FP32 answers stay
# within 1e-5. The GPU class's tolerance covers that; a wrong weight moves them by far more.
GOLDEN_TOLERANCE = 2e-2


def quantization_marker() -> dict[str, Any]:
    """What `config.json` carries under `quantization_config` in a package we wrote."""
    return {
        "quant_method": QUANT_METHOD,
        "bits": 8,
        "weights": "int8, symmetric, one float32 scale per output channel (<name>_scale)",
        "activations": "dynamic, asymmetric per token (uint8), computed at run time",
        "modules": "the linears of every encoder block (Q/K/V, attention output, feed-forward in and out)",
        "kept_fp32": "embeddings, norms, biases, pooler, classification head, sentence-transformers Dense modules",
    }


def read_quantization(folder: Path) -> dict[str, Any] | None:
    """FOLDER's int8 marker (config.json `quantization_config`), None for a package without one; a
    one-line ValueError for a quantization we do not serve."""
    raw = read_config(folder).get(QUANT_KEY)
    if raw is None:
        return None
    method = raw.get("quant_method") if isinstance(raw, dict) else None
    if method != QUANT_METHOD:
        raise ValueError(
            f"config.json quantization_config {method!r}: only {QUANT_METHOD!r} packages (written by "
            "`vllm-srun quantize`) are served quantized"
        )
    if raw.get("bits") != 8:
        raise ValueError(f"config.json quantization_config bits {raw.get('bits')!r}: {QUANT_METHOD} packages are 8-bit")
    return dict(raw)


def canonical_scales(scale: torch.Tensor) -> torch.Tensor:
    """SCALE moved (by an ulp at most, here) to the nearest value with `(127 × s) / 127 == s` in float32."""
    scale = scale.to(torch.float32)
    for _ in range(8):
        again = (scale * QMAX) / QMAX
        if torch.equal(again, scale):
            return scale
        scale = again
    raise ValueError("int8 scales did not settle (a weight row with a subnormal peak?)")


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, in], float32 scales [out]): each row symmetric, its largest |value| at ±127. An
    all-zero row gets scale 1."""
    w = weight.detach().to(torch.float32)
    if w.dim() != 2:
        raise ValueError(f"a linear weight is 2-D (got shape {tuple(w.shape)})")
    peak = w.abs().amax(dim=1)
    scale = canonical_scales(torch.where(peak > 0, peak / QMAX, torch.ones_like(peak)))
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`q × scale` row by row, float32."""
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


def int8_grid(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """WEIGHT's (int8, scales) when it is exactly `q × scale` for canonical per-row scales (what the
    loader rebuilds from an int8 package), else None."""
    q, scale = quantize_rows(weight)
    if not torch.equal(dequantize_rows(q, scale), weight.detach().to(torch.float32)):
        return None
    return q, scale
