"""The encoder family's embedding outputs beyond the dense vector (issue 24): which kinds a
package has, and the rows that ask for them (`contracts/outputs.py`).

- `dense`: every package except a SparseEncoder (SPLADE) one, which has no dense pooling.
- `sparse`: a sentence-transformers SparseEncoder package (masked-LM head + SpladePooling,
  `models/st_modules.py`); its vector is `models/token_heads.sparse_vector`.
- `multi_vector`: every encoder architecture (not the decoder backbones): one L2-normalised vector
  per token after the first, through the package's `colbert_linear` when it has one.
- rerank by MaxSim (`rerank_scoring`): a package without a classification head that lists
  `rerank` — by default one with a ColBERT head lists it (srun.json may list it for any encoder).
- `embedding_ranges.json` (optional, at the package root): `{"min": [...], "max": [...]}`, one
  number per dimension, the int8/uint8 calibration ranges (sentence-transformers' `ranges`).

Token-level rows run alone through the reference forward (`token_heads.py` says why): the engine
gives their token states (`Ask.TOKENS`), `TokenOutputs.finish` applies the heads.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts.outputs import SparseVector, TokenOutputRow

RANGES_FILE = "embedding_ranges.json"
COLBERT_TENSOR = "colbert_linear.weight"


def checkpoint_names(folder: Path) -> set[str]:
    """The tensor names in FOLDER's safetensors files, read from their headers (no torch)."""
    names: set[str] = set()
    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with path.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            continue  # the weight loader reports an unreadable checkpoint
        names.update(k for k in header if k != "__metadata__")
    return names


def has_colbert_head(folder: Path) -> bool:
    from vllm_srun.adapters.models.token_heads import COLBERT_PT

    return (Path(folder) / COLBERT_PT).is_file() or COLBERT_TENSOR in checkpoint_names(folder)


def read_ranges(folder: Path, dimensions: int) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The package's calibration ranges (module doc), None without the file; ValueError when malformed."""
    path = Path(folder) / RANGES_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {RANGES_FILE}: {exc}") from exc
    lows, highs = (raw.get(k) if isinstance(raw, dict) else None for k in ("min", "max"))
    ok = all(
        isinstance(v, list) and len(v) == dimensions and all(isinstance(x, (int, float)) for x in v)
        for v in (lows, highs)
    )
    if not ok:
        raise ValueError(f'{RANGES_FILE} must be {{"min": [...], "max": [...]}} with {dimensions} numbers each')
    assert isinstance(lows, list) and isinstance(highs, list)
    if any(lo > hi for lo, hi in zip(lows, highs)):
        raise ValueError(f"{RANGES_FILE}: a min is larger than its max")
    return tuple(float(x) for x in lows), tuple(float(x) for x in highs)


class TokenOutputs:
    """A loaded model's sparse and multi-vector heads, and the rows that ask for them."""

    def __init__(self, folder: Path, reference: Any, tokenizer: Any, splade: Any, multi_vector: bool) -> None:
        from vllm_srun.adapters.models.token_heads import read_colbert_head, read_mlm_head

        self.reference = reference
        device = reference.device
        self.splade = splade
        self.mlm = read_mlm_head(folder, _config(folder)).to(device) if splade is not None else None
        self.colbert = read_colbert_head(folder) if multi_vector else None
        if self.colbert is not None:
            self.colbert.to(device)
            if self.colbert.weight.shape[1] != reference.config.hidden_size:
                raise ValueError(
                    f"colbert_linear takes {self.colbert.weight.shape[1]} features, the encoder gives "
                    f"{reference.config.hidden_size}"
                )
        self.multi_vector = multi_vector
        self.special_ids: frozenset[int] = frozenset()  # the positions a sparse row leaves out
        if splade is not None:
            added = tokenizer.tokenizer.get_added_tokens_decoder()
            self.special_ids = frozenset(i for i, t in added.items() if t.special)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(
            k for k, has in (("sparse", self.splade is not None), ("multi_vector", self.multi_vector)) if has
        )

    @property
    def multi_vector_dimensions(self) -> int:
        if not self.multi_vector:
            return 0
        return self.colbert.dimensions if self.colbert is not None else int(self.reference.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return self.mlm.vocab_size if self.mlm is not None else 0

    def finish(self, rows: Sequence[TokenOutputRow], states: Sequence[Any]) -> list[Any]:
        """Each row's answer from its token states (its last hidden states [tokens, hidden], the
        row alone through the padded forward: `ReferenceEncoder.token_states`): a `SparseVector`
        (special tokens left out unless the row keeps them) or a float32 [tokens - 1, D] array."""
        import torch

        from vllm_srun.adapters.models.token_heads import sparse_vector, token_vectors

        out: list[Any] = []
        with torch.inference_mode():
            for row, hidden in zip(rows, states, strict=True):
                if row.kind == "multi_vector":
                    out.append(token_vectors(hidden, self.colbert))
                    continue
                assert self.mlm is not None and self.splade is not None, "a sparse row for a model without SPLADE"
                keep = torch.ones(len(row.encoded.ids), dtype=torch.bool, device=hidden.device)
                if not row.keep_special:
                    specials = [i for i, t in enumerate(row.encoded.ids) if t in self.special_ids]
                    keep[specials] = False
                indices, values = sparse_vector(self.mlm(hidden), keep, self.splade)
                out.append(SparseVector(indices.tolist(), values.tolist()))
        return out

    def card(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.splade is not None:
            out["sparse"] = {
                "vocab_size": self.vocab_size,
                "weights": self.splade.describe(),
                "special_tokens": "included, as SparseEncoder.encode (options.special_tokens: exclude leaves them out)",
            }
        if self.multi_vector:
            out["multi_vector"] = {
                "dimensions": self.multi_vector_dimensions,
                "head": "colbert_linear" if self.colbert is not None else "last hidden states",
                "tokens": "every token after the first, L2-normalised",
            }
        return out


def _config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}
