"""Export our torch encoder (+ pooling, + classification head) to ONNX for the ONNX Runtime engine.

The graph takes `input_ids`, `attention_mask`, `token_type_ids` (int64 [batch, tokens], both axes
dynamic) and returns `embeddings` (pooled, normalized when the model is) and, for a model with a
head, `logits`. It is the same maths as the native engine's eager forward (the architecture's
padded forward with a mask, `pooling.pool`), traced by torch's TorchScript-based exporter (needs the `onnx` package).

`cached_export(reference, cache_dir, key)` keeps the file under CACHE_DIR named by KEY (the package's
sha256) and the export's own version, written atomically, so replicas of one package and later
starts reuse it. Without a key or a writable cache it exports into a temporary folder.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from vllm_srun.adapters.models.encoder_arch import EncoderHead, EncoderModule
from vllm_srun.adapters.models.pooling import PoolingConfig, pool
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder

EXPORT_VERSION = 2  # bump when the graph's inputs, outputs or maths change
# architectures whose graph the TorchScript exporter cannot trace faithfully (refused in one line)
NOT_EXPORTABLE: dict[str, str] = {}
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
Progress = Callable[[str], None]


class ServingGraph(nn.Module):
    """What the encoder family serves, as one module: pooled embeddings (and logits)."""

    def __init__(self, encoder: EncoderModule, head: EncoderHead | None, pooling: PoolingConfig) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.pooling = pooling

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        embeddings = pool(hidden, attention_mask, self.pooling)
        if self.head is None:
            return embeddings
        return embeddings, self.head(hidden, attention_mask.to(torch.bool))


def output_names(reference: ReferenceEncoder) -> list[str]:
    return ["embeddings", "logits"] if reference.head is not None else ["embeddings"]


def export_encoder(reference: ReferenceEncoder, path: Path) -> Path:
    """Write REFERENCE's serving graph to PATH (FP32, CPU)."""
    if reference.device.type != "cpu" or next(reference.encoder.parameters()).dtype != torch.float32:
        raise ValueError("the ONNX export runs from the FP32 CPU model (dtype auto)")
    graph = ServingGraph(reference.encoder, reference.head, reference.pooling).eval()
    t = min(8, reference.config.max_tokens)
    ids = torch.full((2, t), min(5, reference.config.vocab_size - 1), dtype=torch.long)
    mask = torch.ones(2, t, dtype=torch.long)
    mask[1, t // 2 :] = 0  # a padded row, so the mask is live in the traced graph
    types = torch.zeros(2, t, dtype=torch.long)
    outputs = output_names(reference)
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS} | {name: {0: "batch"} for name in outputs}
    kind = reference.config.model_type
    if kind in NOT_EXPORTABLE:
        raise ValueError(
            f"the onnxruntime engine cannot serve a {kind} model: {NOT_EXPORTABLE[kind]}; use --engine native"
        )
    try:
        _export(graph, ids, mask, types, path, outputs, axes)
    except Exception as exc:  # the exporter's own errors: one line, not its traceback
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ValueError(
            f"the onnxruntime engine cannot export this {kind} model ({first}); use --engine native"
        ) from exc
    return path


def _export(graph: nn.Module, ids, mask, types, path: Path, outputs: list[str], axes: dict) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer notes on Python-side shape checks
        torch.onnx.export(
            graph,
            (ids, mask, types),
            str(path),
            dynamo=False,
            input_names=list(INPUTS),
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
        )


def _tag(reference: ReferenceEncoder) -> str:
    head = "head" if reference.head is not None else "nohead"
    return f"v{EXPORT_VERSION}-opset{OPSET}-torch{torch.__version__.split('+')[0]}-{head}-{reference.pooling.mode}"


def cached_export(
    reference: ReferenceEncoder, cache_dir: Path | None, key: str | None, progress: Progress
) -> tuple[Path, str]:
    """(path of REFERENCE's exported graph, where it came from: `cached`, `exported` (now in the
    cache) or `temporary` (the caller may delete it once loaded)); exports when missing."""
    if key and cache_dir is not None:
        path = Path(cache_dir) / "onnx" / f"{key[:40]}-{_tag(reference)}.onnx"
        if path.is_file():
            return path, "cached"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            progress(f"load: exporting the encoder to ONNX ({path})")
            export_encoder(reference, tmp)
            os.replace(tmp, path)  # atomic: replicas exporting at once each write their own tmp
            return path, "exported"
        except OSError as exc:
            progress(f"load: cannot cache the ONNX export under {cache_dir} ({exc}); exporting to a temporary folder")
        finally:
            tmp.unlink(missing_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="vllm-srun-onnx-"))
    progress("load: exporting the encoder to ONNX (not cached)")
    return export_encoder(reference, folder / "model.onnx"), "temporary"
