"""Tiny random decoder classifiers for `vllm-srun fixture --family encoder` (R-PKG-3): the
`<arch>-classify` and `<arch>-token` variants of the decoder backbones (`qwen3`, `qwen2`, `llama`),
saved as transformers saves `<Arch>ForSequenceClassification` / `<Arch>ForTokenClassification`
(config.json, model.safetensors) beside a tokenizer of the model type's real kind
(`models/fixture_tokenizers.py`). Nothing of ours routes them: the srun.json written beside them
only records the fixture's provenance (variant, seed), and the encoder family takes them by their
`architectures` (`decoder_packages.py`).

- `classify`: three labels (negative, neutral, positive); the tokenizer closes every text with
  `<|endoftext|>`, which is also config.json's `pad_token_id`, so transformers (and we) read each
  row at the token before it (`models/decoder_heads.py`).
- `token`: BIO labels of PER and LOC; the `score` layer is rescaled over our own forward of a few
  texts so that a tiny random model labels tokens differently (as the BERT `token` fixture's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.families.encoder_fixture_parts import LABELS, LONG_TEXT, TOKEN_TEXTS, WORDS, golden_requests
from vllm_srun.adapters.models.manifest import write_manifest

HEAD_KINDS = ("classify", "token")


def write_decoder_head_package(
    out: Path,
    arch: str,
    kind: str,
    seed: int,
    *,
    positions: int,
    words: Sequence[str] = (),
    labels: Sequence[str] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """A random `<Arch>For{Sequence,Token}Classification` package of ARCH in OUT (module doc), with
    the kind's labels or LABELS (one label: a reranker) and SIZES (`FixtureSizes`' fields); the
    requests its golden file records."""
    from safetensors.numpy import save_file

    from vllm_srun.adapters.models.decoder_encoder_fixture import fixture_config, fixture_weights
    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    if kind not in HEAD_KINDS:
        raise ValueError(f"decoder head fixtures come in kinds {', '.join(HEAD_KINDS)} (got {kind!r})")
    out = Path(out)
    info = write_fixture_tokenizer(out, arch, [*WORDS, *words], model_max_length=positions, add_eos=kind == "classify")
    labels = list(labels or LABELS[kind])
    size_fields: dict[str, Any] = {**(sizes or {}), "positions": positions}  # FixtureSizes' fields
    config = fixture_config(
        info.vocab_size, info.pad_token_id, len(labels), model_type=arch, token=kind == "token", **size_fields
    )
    config.update(id2label={str(i): n for i, n in enumerate(labels)}, label2id={n: i for i, n in enumerate(labels)})
    (out / "config.json").write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n", encoding="utf-8")
    save_file(fixture_weights(config, len(labels), seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    if kind == "token":
        spread_score_head(out)
    write_manifest(out, {"fixture": {"variant": f"{arch}-{kind}", "seed": seed}})
    return golden_requests(kind if len(labels) > 1 else "rerank")


def spread_score_head(out: Path) -> None:
    """Rescale the token head's `score` layer over our own forward of a few texts: logits centred on
    the tokens' mean, spread about 2.5 apart, `O` favoured by one."""
    import torch
    from safetensors.numpy import load_file, save_file

    from vllm_srun.adapters.models.encoders import load_encoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    encoder, _ = load_encoder(out)
    rows = TextTokenizer.from_folder(out).encode([*TOKEN_TEXTS, LONG_TEXT])
    with torch.inference_mode():
        hidden = np.concatenate([encoder(torch.tensor([list(row.ids)]))[0].numpy() for row in rows])
    hidden = hidden.astype(np.float64)
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    weight = tensors["score.weight"].astype(np.float64)
    centred = (hidden - hidden.mean(axis=0)) @ weight.T
    weight *= 2.5 / max(float(centred.std()), 1e-6)
    bias = -(weight @ hidden.mean(axis=0))
    bias[0] += 1.0
    tensors["score.weight"], tensors["score.bias"] = weight.astype(np.float32), bias.astype(np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})
