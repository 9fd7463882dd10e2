"""Token-level embedding heads of the encoder family (issue 24): SPLADE sparse vectors and
ColBERT multi-vectors, our own torch code over the encoder's last hidden states.

- `MlmHead`: a masked-LM head as transformers stores it — BERT `cls.predictions.*`
  (`transform.dense` → the config's activation → `transform.LayerNorm` → `decoder` + `bias`),
  RoBERTa `lm_head.*` (`dense` → GELU → `layer_norm` → `decoder` + `bias`), DistilBERT
  `vocab_transform` / `vocab_layer_norm` / `vocab_projector`. A decoder weight missing from the
  checkpoint is tied to the word embeddings, as transformers ties it.
- `SpladeSettings`: the package's SpladePooling (`pooling_strategy` max|sum, `activation_function`
  relu|log1p_relu). `sparse_vector` = pool over tokens of log(1 + ReLU(logits)) (log1p_relu: log1p
  once more), attention-masked; special-token positions ([CLS], [SEP] …: the tokenizer's special
  ids) are left out unless asked to keep them (sentence-transformers' SparseEncoder keeps them).
- `ColbertHead`: a `colbert_linear` layer (BGE-M3 ships `colbert_linear.pt`; our fixtures store
  `colbert_linear.weight` / `.bias` in model.safetensors). `token_vectors` = the head over every
  token after the first ([CLS] / <s>, as BGE-M3 drops it), each L2-normalised; without a head the
  last hidden states themselves.

Heads compute in float32 whatever the encoder's dtype. Each row runs alone through the encoder's
padded reference forward, so a row's answer never depends on the rows it shares a forward with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ACTIVATIONS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}
SPLADE_POOLING = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
COLBERT_PT = "colbert_linear.pt"


@dataclass(frozen=True)
class SpladeSettings:
    pooling: str = "max"
    activation: str = "relu"

    def __post_init__(self) -> None:
        if self.pooling not in SPLADE_POOLING:
            raise ValueError(f"SpladePooling: pooling_strategy {self.pooling!r} is not one of {SPLADE_POOLING}")
        if self.activation not in SPLADE_ACTIVATIONS:
            raise ValueError(
                f"SpladePooling: activation_function {self.activation!r} is not one of {SPLADE_ACTIVATIONS}"
            )

    def describe(self) -> str:
        act = "log(1 + log(1 + ReLU(logits)))" if self.activation == "log1p_relu" else "log(1 + ReLU(logits))"
        return f"{self.pooling} over tokens of {act}"


class MlmHead:
    """hidden [T, H] → vocabulary logits [T, V] (float32)."""

    def __init__(self, t: dict[str, torch.Tensor], act: str, eps: float) -> None:
        if act not in ACTIVATIONS:
            raise ValueError(f"masked-LM head: activation {act!r} is not one we run ({', '.join(ACTIVATIONS)})")
        self._act = ACTIVATIONS[act]
        self.eps = eps
        self.t = {k: v.float() for k, v in t.items()}
        self.vocab_size = int(self.t["decoder"].shape[0])

    def to(self, device: torch.device) -> MlmHead:
        self.t = {k: v.to(device) for k, v in self.t.items()}
        return self

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        t = self.t
        x = self._act(F.linear(hidden.float(), t["dense_w"], t["dense_b"]))
        x = F.layer_norm(x, (x.shape[-1],), t["ln_w"], t["ln_b"], self.eps)
        return F.linear(x, t["decoder"], t["bias"])


class ColbertHead:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.float()
        self.bias = bias.float() if bias is not None else None
        self.dimensions = int(weight.shape[0])

    def to(self, device: torch.device) -> ColbertHead:
        self.weight = self.weight.to(device)
        self.bias = self.bias.to(device) if self.bias is not None else None
        return self

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.float(), self.weight, self.bias)


# the masked-LM head's tensors under each architecture's names: ours → theirs
MLM_NAMES: dict[str, dict[str, str]] = {
    "bert": {
        "dense_w": "cls.predictions.transform.dense.weight",
        "dense_b": "cls.predictions.transform.dense.bias",
        "ln_w": "cls.predictions.transform.LayerNorm.weight",
        "ln_b": "cls.predictions.transform.LayerNorm.bias",
        "decoder": "cls.predictions.decoder.weight",
        "bias": "cls.predictions.bias",
    },
    "roberta": {
        "dense_w": "lm_head.dense.weight",
        "dense_b": "lm_head.dense.bias",
        "ln_w": "lm_head.layer_norm.weight",
        "ln_b": "lm_head.layer_norm.bias",
        "decoder": "lm_head.decoder.weight",
        "bias": "lm_head.bias",
    },
    "distilbert": {
        "dense_w": "vocab_transform.weight",
        "dense_b": "vocab_transform.bias",
        "ln_w": "vocab_layer_norm.weight",
        "ln_b": "vocab_layer_norm.bias",
        "decoder": "vocab_projector.weight",
        "bias": "vocab_projector.bias",
    },
}
LEGACY = {  # old TF-converted BERT names
    "cls.predictions.transform.LayerNorm.weight": "cls.predictions.transform.LayerNorm.gamma",
    "cls.predictions.transform.LayerNorm.bias": "cls.predictions.transform.LayerNorm.beta",
}
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


def _checkpoint_keys(folder: Path) -> dict[str, Path]:
    """Every tensor name of the package's safetensors files → its file."""
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                found[key] = path
    return found


def _take(keys: dict[str, Path], wanted: list[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for name in wanted:
        with safe_open(str(keys[name]), framework="pt") as f:
            out[name] = f.get_tensor(name)
    return out


def _family(config: dict[str, Any]) -> str:
    kind = str(config.get("model_type", "")).lower()
    return {"roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta", "distilbert": "distilbert"}.get(
        kind, "bert"
    )


def read_mlm_head(folder: Path, config: dict[str, Any]) -> MlmHead:
    """The package's masked-LM head; ValueError naming the first tensor it lacks."""
    family = _family(config)
    names = MLM_NAMES[family]
    keys = _checkpoint_keys(folder)
    wanted: dict[str, str] = {}
    for ours, theirs in names.items():
        if theirs not in keys and theirs in LEGACY and LEGACY[theirs] in keys:
            theirs = LEGACY[theirs]
        if theirs not in keys and ours == "bias" and names["decoder"].replace("weight", "bias") in keys:
            theirs = names["decoder"].replace("weight", "bias")
        if theirs not in keys and ours == "decoder":  # tied to the word embeddings
            theirs = next((k for k in keys if k.endswith(WORD_EMBEDDINGS)), theirs)
        if theirs not in keys:
            raise ValueError(f"the masked-LM head needs {theirs!r}, which the checkpoint lacks")
        wanted[ours] = theirs
    tensors = _take(keys, list(wanted.values()))
    act = "gelu" if family == "roberta" else str(config.get("hidden_act") or config.get("activation") or "gelu")
    eps = float(config.get("layer_norm_eps", 1e-12))
    return MlmHead({ours: tensors[theirs] for ours, theirs in wanted.items()}, act, eps)


def read_colbert_head(folder: Path) -> ColbertHead | None:
    """The package's `colbert_linear` (BGE-M3's colbert_linear.pt, or `colbert_linear.*` tensors in
    its safetensors); None when it has none."""
    folder = Path(folder)
    keys = _checkpoint_keys(folder)
    if "colbert_linear.weight" in keys:
        names = ["colbert_linear.weight"] + (["colbert_linear.bias"] if "colbert_linear.bias" in keys else [])
        t = _take(keys, names)
        return ColbertHead(t["colbert_linear.weight"], t.get("colbert_linear.bias"))
    pt = folder / COLBERT_PT
    if not pt.is_file():
        return None
    try:
        state = torch.load(str(pt), map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle we refuse to run, or a broken file
        raise ValueError(f"cannot read {COLBERT_PT}: {exc}") from exc
    if not isinstance(state, dict) or not isinstance(state.get("weight"), torch.Tensor):
        raise ValueError(f"{COLBERT_PT} must hold a state dict with a 'weight' tensor")
    bias = state.get("bias")
    return ColbertHead(state["weight"], bias if isinstance(bias, torch.Tensor) else None)


def sparse_vector(logits: torch.Tensor, keep: torch.Tensor, splade: SpladeSettings) -> tuple[np.ndarray, np.ndarray]:
    """[T, V] logits and a [T] bool of the positions that count → (indices ascending, values > 0)."""
    x = torch.log1p(torch.relu(logits[keep]))
    if splade.activation == "log1p_relu":
        x = torch.log1p(x)
    if x.shape[0] == 0:
        pooled = torch.zeros(logits.shape[1], dtype=torch.float32, device=logits.device)
    else:
        pooled = x.amax(dim=0) if splade.pooling == "max" else x.sum(dim=0)
    values = pooled.to("cpu", torch.float32).numpy()
    indices = np.flatnonzero(values > 0)
    return indices.astype(np.int64), values[indices].astype(np.float32)


def token_vectors(hidden: torch.Tensor, head: ColbertHead | None) -> np.ndarray:
    """[T, H] hidden states → float32 [T - 1, D]: every token after the first, through HEAD, L2-normalised."""
    x = hidden[1:].float()
    if head is not None:
        x = head(x)
    x = F.normalize(x, p=2.0, dim=-1)
    return np.ascontiguousarray(x.to("cpu", torch.float32).numpy())
