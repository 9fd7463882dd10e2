"""Write an int8 package from an FP32 encoder package (`vllm-srun quantize MODEL OUT --int8`).

`write_int8_package(source, out, progress)`:
1. loads SOURCE with our own loader (any encoder architecture we serve: `models/encoders.py`);
2. finds, for every encoder block's four linears (`encoder_arch.EncoderBlock`: `qkv`, `attn_out`,
   `ffn_in`, `ffn_out`), the checkpoint tensors its rows were loaded from, by value: each is a run
   of whole rows of the block's weight (Q, K and V are three runs of `qkv`; a gated unit's gate and
   up are two runs of `ffn_in`). Per-output-channel quantization treats every row alone, so
   quantizing the checkpoint tensors is quantizing the block's linears. A linear whose rows are
   not the checkpoint's own (a loader that transforms them) is refused in one line;
3. writes OUT: every file and folder of SOURCE except the checkpoint's weight files (rewritten:
   those tensors int8 with `<name>_scale` beside them, `models/quantize.py`; every other tensor as
   it was), the golden file (the caller records the package's own) and other weight formats of
   the same model (an ONNX graph, `pytorch_model.bin`, …, which would be FP32 copies); config.json
   gains `quantization_config`;
4. reads OUT back with the same loader and checks it: every block linear equals `q × scale` of
   the source's weight exactly, every other tensor equals the source's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vllm_srun.adapters.models.encoders import load_encoder
from vllm_srun.adapters.models.manifest import read_config
from vllm_srun.adapters.models.quantize import (
    BLOCK_LINEARS,
    QUANT_KEY,
    SCALE_SUFFIX,
    dequantize_rows,
    quantization_marker,
    quantize_rows,
    read_quantization,
)
from vllm_srun.adapters.models.weights import safetensors_files

Progress = Callable[[str], None]
SAFETENSORS_INDEX = "model.safetensors.index.json"
# top-level entries never copied: weights in other formats (FP32 copies of the model) and the golden file
NOT_COPIED = frozenset(
    {
        "golden.json",
        "model.onnx",
        "onnx",
        "openvino",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
        "tf_model.h5",
        "flax_model.msgpack",
        "rust_model.ot",
        "model.safetensors.index.json",
    }
)


@dataclass(frozen=True)
class QuantizedPackage:
    out: Path
    tensors: int  # checkpoint tensors written as int8
    linears: int  # block linears they make up
    bytes_before: int  # the checkpoint files' sizes
    bytes_after: int
    max_weight_error: float  # largest |q × scale − w| / max|w| of a row, over every int8 row


def _raw_tensors(files: list[Path]) -> dict[Path, tuple[dict[str, torch.Tensor], dict[str, str] | None]]:
    out = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            out[file] = ({k: f.get_tensor(k) for k in f.keys()}, f.metadata())  # noqa: SIM118 - not iterable
    return out


def _row_key(row: torch.Tensor) -> bytes:
    return row.to(torch.float32).contiguous().numpy().tobytes()


def checkpoint_sources(
    encoder: Any, raw: dict[Path, tuple[dict[str, torch.Tensor], dict[str, str] | None]]
) -> dict[tuple[Path, str], tuple[int, str]]:
    """(file, tensor name) → (block, linear) for every checkpoint tensor that makes up block linears."""
    by_first_row: dict[tuple[int, bytes], list[tuple[Path, str]]] = {}
    for file, (tensors, _) in raw.items():
        for name, t in tensors.items():
            if t.dim() == 2 and t.is_floating_point() and t.shape[0] > 0:
                by_first_row.setdefault((int(t.shape[1]), _row_key(t[0])), []).append((file, name))
    found: dict[tuple[Path, str], tuple[int, str]] = {}
    for i, block in enumerate(encoder.blocks):
        for linear in BLOCK_LINEARS:
            w = getattr(block, linear).weight.detach()
            row = 0
            while row < w.shape[0]:
                match = None
                for key in by_first_row.get((int(w.shape[1]), _row_key(w[row])), []):
                    t = raw[key[0]][0][key[1]]
                    end = row + t.shape[0]
                    if key not in found and end <= w.shape[0] and torch.equal(t.to(torch.float32), w[row:end]):
                        match = key
                        break
                if match is None:
                    raise ValueError(
                        f"block {i}'s {linear} (rows {row}..) is not a run of a checkpoint tensor as stored: "
                        "this package's weights are transformed at load, and cannot be quantized here"
                    )
                found[match] = (i, linear)
                row += raw[match[0]][0][match[1]].shape[0]
    return found


def _row_error(weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest |q × scale − w| of a row relative to the row's largest |w| (half a step: 1/254)."""
    w = weight.to(torch.float32)
    err = (dequantize_rows(q, scale) - w).abs().amax(1) / w.abs().amax(1).clamp_min(1e-30)
    return float(err.max())


def _copy_package(source: Path, out: Path, weight_files: set[str]) -> None:
    for entry in sorted(source.iterdir()):
        if entry.name in NOT_COPIED or entry.name in weight_files or entry.name.startswith("pytorch_model-"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, out / entry.name)
        else:
            shutil.copy2(entry, out / entry.name)


def _state(module: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in module.state_dict().items()} if module is not None else {}


def _check(source_encoder: Any, source_head: Any, out: Path) -> None:
    """OUT read back: block linears exactly `q × scale` of the source's, every other tensor (not a view
    of a block linear's weight) the source's."""
    encoder, head = load_encoder(out, torch.float32)
    int8_storage = set()
    for i, (was, now) in enumerate(zip(source_encoder.blocks, encoder.blocks, strict=True)):
        for linear in BLOCK_LINEARS:
            weight = getattr(was, linear).weight
            int8_storage.add(weight.untyped_storage().data_ptr())
            if not torch.equal(getattr(now, linear).weight, dequantize_rows(*quantize_rows(weight))):
                raise ValueError(f"the written package reads back with block {i}'s {linear} changed")
    for label, was_module, now_module in (("", source_encoder, encoder), ("the head's ", source_head, head)):
        now_state = _state(now_module)
        for name, want in _state(was_module).items():
            if want.untyped_storage().data_ptr() in int8_storage:
                continue  # a view of a block linear's weight (e.g. q_proj of a fused qkv)
            if name not in now_state or not torch.equal(now_state[name], want):
                raise ValueError(f"the written package reads back with {label}{name} changed")


def write_int8_package(source: Path, out: Path, progress: Progress) -> QuantizedPackage:
    """Write the int8 package of the FP32 encoder package SOURCE into OUT (new or empty): module doc."""
    source, out = Path(source), Path(out)
    if read_quantization(source) is not None:
        raise ValueError(f"{source.name} is already an int8 package (config.json quantization_config)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder")
    config = read_config(source)
    progress(f"quantize: reading {source.name} ({config.get('model_type')}, FP32 reference weights)")
    encoder, head = load_encoder(source, torch.float32)
    files = safetensors_files(source)
    raw = _raw_tensors(files)
    sources = checkpoint_sources(encoder, raw)
    blocks = len(encoder.blocks)
    progress(f"quantize: {blocks} blocks × {len(BLOCK_LINEARS)} linears come from {len(sources)} checkpoint tensors")
    out.mkdir(parents=True, exist_ok=True)
    _copy_package(source, out, {f.name for f in files})
    worst = 0.0
    index: dict[str, str] = {}
    for file, (tensors, metadata) in raw.items():
        written: dict[str, torch.Tensor] = {}
        for name, t in tensors.items():
            index[name] = file.name
            if (file, name) not in sources:
                written[name] = t.contiguous()
                continue
            if name + SCALE_SUFFIX in tensors:
                raise ValueError(f"{file.name} already holds a tensor named {name + SCALE_SUFFIX!r}")
            q, scale = quantize_rows(t)
            worst = max(worst, _row_error(t, q, scale))
            written[name], written[name + SCALE_SUFFIX] = q, scale
            index[name + SCALE_SUFFIX] = file.name
        save_file(written, str(out / file.name), metadata=metadata or {"format": "pt"})
        shutil.copymode(file, out / file.name)  # safetensors writes owner-only files
        progress(
            f"quantize: wrote {file.name} ({(out / file.name).stat().st_size / 2**20:.1f} MiB, "
            f"was {file.stat().st_size / 2**20:.1f} MiB)"
        )
    if (source / SAFETENSORS_INDEX).is_file():  # a sharded checkpoint: the index names the scales too
        doc = json.loads((source / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
        doc["weight_map"] = dict(sorted(index.items()))
        (out / SAFETENSORS_INDEX).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    config[QUANT_KEY] = quantization_marker()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    _check(encoder, head, out)
    progress(
        f"quantize: read back: every block linear is int8 × scale, every other tensor as published (worst row error {worst:.2%})"
    )
    return QuantizedPackage(
        out,
        tensors=len(sources),
        linears=blocks * len(BLOCK_LINEARS),
        bytes_before=sum(f.stat().st_size for f in files),
        bytes_after=sum((out / f.name).stat().st_size for f in files),
        max_weight_error=worst,
    )
