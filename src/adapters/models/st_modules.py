"""A sentence-transformers package as published, read into what the encoder family runs (our own
torch code: sentence-transformers is never imported here).

`read_package(folder, default_mode)` → `StPackage` (the `PoolingConfig` and the `TextSettings`;
`load_pooling_config(folder, default_mode)` the first alone):
- `modules.json`: the modules in order. The first is the Transformer, at the package root (the
  encoder our architecture loaders read); then one Pooling; after it any of Dense, LayerNorm,
  Dropout (nothing at inference) and Normalize, in any order. A trailing Normalize is
  `PoolingConfig.normalize` (the card's `normalized`); every other one is a step of
  `PoolingConfig.steps`, applied after pooling by `pooling.finish` on the padded and the unpadded
  forward alike. Any other module (CNN, LSTM, WordEmbeddings, Router, a custom class…) is refused
  in one line naming it and its type. Types are matched by class name under `sentence_transformers.`
  (`sentence_transformers.models.Dense` as 2.x–4.x write it, `….base.modules.dense.Dense` as 5.x+ do).
- `<Pooling>/config.json`: the legacy `pooling_mode_*` flags (concatenated in the legacy order
  cls, max, mean, mean_sqrt_len, weightedmean, lasttoken; none set = mean) or `pooling_mode` (a name
  or a list, concatenated in its order); `include_prompt: false` is refused when the package has
  a non-empty prompt (pooling without the prompt's tokens is not implemented), unless the package
  pools the last token only (which no prompt before the text changes).
- `<Dense>/config.json` (`in_features`, `out_features`, `bias`, `activation_function` a `torch.nn`
  class path — Tanh when absent, as sentence-transformers defaults — `use_residual`) and
  `<Dense>/model.safetensors` (`linear.weight`, `linear.bias`, `residual.weight`); a Dense with
  only `pytorch_model.bin` is refused. `<LayerNorm>`: `dimension`, `norm.weight` / `norm.bias`.
- `sentence_bert_config.json`: `max_seq_length`, `do_lower_case` (texts lowercased before tokenizing).
- `config_sentence_transformers.json`: `prompts`, `default_prompt_name`, `similarity_fn_name`,
  `model_type` (a package of another archetype — CrossEncoder — has no pooling pipeline we read;
  a SparseEncoder is read by `_sparse_package`: a Transformer / MLMTransformer at the root, then a
  SpladePooling — `StPackage.splade`, `token_heads.py` — and nothing else; other archetypes are refused).

A folder without `modules.json` pools with DEFAULT_MODE (see `pooling.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vllm_srun.adapters.models.pooling import MODES, PoolingConfig
from vllm_srun.adapters.models.token_heads import SpladeSettings

LEGACY_FLAGS = {  # the legacy pooling_mode_* keys, in sentence-transformers' concatenation order
    "cls": ("pooling_mode_cls_token", "pooling_mode_cls_tokens", "pooling_mode_cls"),
    "max": ("pooling_mode_max_tokens", "pooling_mode_max_token", "pooling_mode_max"),
    "mean": ("pooling_mode_mean_tokens", "pooling_mode_mean_token", "pooling_mode_mean"),
    "mean_sqrt_len": ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_mean_sqrt_len_token"),
    "weightedmean": ("pooling_mode_weightedmean_tokens", "pooling_mode_weightedmean_token"),
    "lasttoken": ("pooling_mode_lasttoken", "pooling_mode_lasttoken_token", "pooling_mode_lasttoken_tokens"),
}
MODE_ALIASES = {
    "mean_tokens": "mean",
    "cls_token": "cls",
    "max_tokens": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean_tokens": "weightedmean",
    "last_token": "lasttoken",
}
# torch.nn activation classes a Dense may name, built with their default arguments as sentence-transformers does
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "ReLU": F.relu,
    "GELU": F.gelu,
    "Sigmoid": torch.sigmoid,
    "SiLU": F.silu,
    "Mish": F.mish,
    "LeakyReLU": F.leaky_relu,
    "ELU": F.elu,
    "SELU": F.selu,
    "CELU": F.celu,
    "Softplus": F.softplus,
    "ReLU6": F.relu6,
    "Hardtanh": F.hardtanh,
    "Softsign": F.softsign,
    "Tanhshrink": F.tanhshrink,
}
DENSE_ARCHETYPES = ("SentenceTransformer",)  # config_sentence_transformers.json model_type we pool
OTHER_ARCHETYPES = ("CrossEncoder",)  # read as a plain checkpoint (its head, no pooling pipeline)
SPARSE_ARCHETYPE = "SparseEncoder"  # a SPLADE package: masked-LM logits, SpladePooling
SENTENCE_EMBEDDING = "sentence_embedding"


@dataclass(frozen=True, eq=False)
class TextSettings:
    """What happens to a text before tokenizing, and how the package compares embeddings."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    do_lower_case: bool = False
    max_seq_length: int | None = None
    model_type: str = "SentenceTransformer"

    def fold_case(self, texts: list[str]) -> list[str]:
        """TEXTS as the tokenizer must see them (lowercased when the package says so)."""
        return [t.lower() for t in texts] if self.do_lower_case else texts


@dataclass(frozen=True, eq=False)
class StPackage:
    pooling: PoolingConfig
    text: TextSettings
    splade: SpladeSettings | None = None  # a SparseEncoder package's SpladePooling (it has no dense pooling)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc


def _object(path: Path) -> dict[str, Any]:
    raw = _read_json(path) if path.is_file() else {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path.name} must hold a JSON object")
    return raw


def read_text_settings(folder: Path) -> TextSettings:
    """`sentence_bert_config.json` and `config_sentence_transformers.json` of FOLDER (defaults when absent)."""
    folder = Path(folder)
    bert = _object(folder / "sentence_bert_config.json")
    st = _object(folder / "config_sentence_transformers.json")
    prompts = st.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError("config_sentence_transformers.json: prompts must map names to texts")
    default = st.get("default_prompt_name")
    if default is not None and default not in prompts:
        names = ", ".join(prompts) or "none"
        raise ValueError(
            f"config_sentence_transformers.json: default_prompt_name {default!r} is not a prompt ({names})"
        )
    max_len = bert.get("max_seq_length")
    return TextSettings(
        prompts=dict(prompts),
        default_prompt_name=default,
        similarity_fn_name=st.get("similarity_fn_name"),
        do_lower_case=bool(bert.get("do_lower_case", False)),
        max_seq_length=int(max_len) if max_len is not None else None,
        model_type=str(st.get("model_type") or "SentenceTransformer"),
    )


def _kind(module: dict[str, Any]) -> str:
    """The class name of a sentence-transformers module (`…Dense` → Dense); '' for anything else."""
    kind = str(module.get("type", ""))
    return kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers.") or "." not in kind else ""


def pooling_modes(raw: dict[str, Any], where: str) -> tuple[str, ...]:
    """The modes of a Pooling config.json (see the module doc)."""
    if "pooling_mode" in raw and raw["pooling_mode"] is not None:
        names = raw["pooling_mode"]
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}: pooling_mode must be a mode name or a list of them")
        modes = tuple(MODE_ALIASES.get(n, n) for n in names)
    else:
        modes = tuple(m for m in MODES if any(raw.get(key) for key in LEGACY_FLAGS[m])) or ("mean",)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"{where}: pooling modes {bad} are not among {MODES}")
    return modes


class _Cast:
    """A module's tensors, kept as stored and cast once per (device, dtype) they are used in."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self._cast: dict[tuple[torch.device, torch.dtype], dict[str, torch.Tensor]] = {}

    def on(self, like: torch.Tensor) -> dict[str, torch.Tensor]:
        key = (like.device, like.dtype)
        found = self._cast.get(key)
        if found is None:
            found = {k: v.to(device=like.device, dtype=like.dtype) for k, v in self.tensors.items()}
            self._cast[key] = found
        return found


def _weights(folder: Path, name: str, kind: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    path = folder / "model.safetensors"
    if not path.is_file():
        if (folder / "pytorch_model.bin").is_file():
            raise ValueError(
                f"{name} ({kind}): weights only in pytorch_model.bin; convert them to model.safetensors to serve it"
            )
        raise ValueError(f"{name} ({kind}): no model.safetensors")
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)


class DenseStep:
    """A Dense module: `act(x Wᵀ + b)` (+ the residual), row by row so that a row's answer never
    depends on the rows it shares a forward with (batch invariance, R-BAT-5); traced for an ONNX
    export, as one product over the batch."""

    def __init__(
        self, name: str, linear: torch.Tensor, bias: torch.Tensor | None, act: str, residual: torch.Tensor | None
    ) -> None:
        self.name = name
        self.out_features, self.in_features = (int(n) for n in linear.shape)
        self.activation = act
        self._act = ACTIVATIONS[act]
        self.use_residual = residual is not None
        tensors = {"w": linear, **({"b": bias} if bias is not None else {})}
        if residual is not None and residual.numel():
            tensors["r"] = residual
        self._tensors = _Cast(tensors)

    def width(self, d: int) -> int:
        return self.out_features

    def _one(self, x: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
        y = self._act(F.linear(x, t["w"], t.get("b")))
        if self.use_residual:
            y = y + (F.linear(x, t["r"]) if "r" in t else x)
        return y

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t = self._tensors.on(x)
        if x.shape[0] == 1 or torch.jit.is_tracing():
            return self._one(x, t)
        return torch.cat([self._one(x[i : i + 1], t) for i in range(x.shape[0])])

    def __repr__(self) -> str:
        return f"Dense({self.name}: {self.in_features}→{self.out_features}, {self.activation})"


class LayerNormStep:
    """A LayerNorm module over the pooled vector (eps 1e-5, torch's default)."""

    def __init__(self, name: str, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.name = name
        self.dimension = int(weight.shape[0])
        self._tensors = _Cast({"w": weight, "b": bias})

    def width(self, d: int) -> int:
        return self.dimension

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t = self._tensors.on(x)
        return F.layer_norm(x, (self.dimension,), t["w"], t["b"], 1e-5)

    def __repr__(self) -> str:
        return f"LayerNorm({self.name}: {self.dimension})"


class NormalizeStep:
    """A Normalize module followed by other modules (a trailing one is `PoolingConfig.normalize`)."""

    name = "Normalize"

    def width(self, d: int) -> int:
        return d

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2.0, dim=-1)

    def __repr__(self) -> str:
        return "Normalize"


def _activation(value: Any, name: str) -> str:
    if value is None:
        return "Identity"
    act = str(value)
    short = act.rsplit(".", 1)[-1]
    if not act.startswith("torch.nn.") or short not in ACTIVATIONS:
        raise ValueError(f"{name} (Dense): activation_function {act!r} is not one we run ({', '.join(ACTIVATIONS)})")
    return short


def _reads_sentence_embedding(cfg: dict[str, Any], name: str, kind: str) -> None:
    for key in ("module_input_name", "module_output_name"):
        value = cfg.get(key)
        if value is not None and value != SENTENCE_EMBEDDING:
            raise ValueError(f"{name} ({kind}): {key} {value!r} (only {SENTENCE_EMBEDDING!r} modules are served)")


def _dense(folder: Path, name: str, width: int | None) -> DenseStep:
    cfg = _object(folder / "config.json")
    _reads_sentence_embedding(cfg, name, "Dense")
    act = _activation(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"), name)
    tensors = _weights(folder, name, "Dense")
    w = tensors.get("linear.weight")
    if w is None:
        raise ValueError(f"{name} (Dense): model.safetensors has no linear.weight")
    shape = (int(cfg.get("out_features", w.shape[0])), int(cfg.get("in_features", w.shape[1])))
    if tuple(w.shape) != shape:
        raise ValueError(f"{name} (Dense): linear.weight is {tuple(w.shape)}, config.json says {shape}")
    if width is not None and shape[1] != width:
        raise ValueError(f"{name} (Dense): in_features {shape[1]} but the module before it gives {width}")
    bias = tensors.get("linear.bias") if cfg.get("bias", True) else None
    if cfg.get("bias", True) and bias is None:
        raise ValueError(f"{name} (Dense): bias is true but model.safetensors has no linear.bias")
    residual = None
    if cfg.get("use_residual", False):
        residual = tensors.get("residual.weight", torch.empty(0))
        if shape[0] != shape[1] and tuple(residual.shape) != shape:
            raise ValueError(f"{name} (Dense): use_residual needs residual.weight of shape {shape}")
    return DenseStep(name, w, bias, act, residual)


def _layer_norm(folder: Path, name: str, width: int | None) -> LayerNormStep:
    cfg = _object(folder / "config.json")
    tensors = _weights(folder, name, "LayerNorm")
    if "norm.weight" not in tensors or "norm.bias" not in tensors:
        raise ValueError(f"{name} (LayerNorm): model.safetensors needs norm.weight and norm.bias")
    dim = int(cfg.get("dimension", tensors["norm.weight"].shape[0]))
    if width is not None and dim != width:
        raise ValueError(f"{name} (LayerNorm): dimension {dim} but the module before it gives {width}")
    return LayerNormStep(name, tensors["norm.weight"], tensors["norm.bias"])


def _module_name(module: dict[str, Any], index: int) -> str:
    return str(module.get("path") or module.get("name") or f"module {index}")


def read_package(folder: Path, default_mode: str = "mean") -> StPackage:
    """The sentence-transformers pipeline of FOLDER (module doc); ValueError for one we cannot serve."""
    folder = Path(folder)
    text = read_text_settings(folder)
    modules_path = folder / "modules.json"
    if not modules_path.is_file() or text.model_type in OTHER_ARCHETYPES:
        # no pipeline: DEFAULT_MODE, or the modes of a lone 1_Pooling/config.json
        lone = folder / "1_Pooling" / "config.json"
        read = lone.is_file() and not modules_path.is_file()
        lone_modes = pooling_modes(_object(lone), "1_Pooling/config.json") if read else (default_mode,)
        found = any((folder / f).is_file() for f in ("modules.json", "sentence_bert_config.json")) or lone.is_file()
        pooling = PoolingConfig(modes=lone_modes, max_seq_length=text.max_seq_length, from_sentence_transformers=found)
        return StPackage(pooling, text)
    if text.model_type not in (*DENSE_ARCHETYPES, SPARSE_ARCHETYPE):
        raise ValueError(
            f"config_sentence_transformers.json: model_type {text.model_type!r} is not a dense or sparse embedder"
        )
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError("modules.json must list the package's modules")
    if text.model_type == SPARSE_ARCHETYPE:
        return _sparse_package(folder, modules, text)
    modes: tuple[str, ...] | None = None
    width: int | None = None  # the width of what the last module gives, when the package says
    steps: list[Any] = []
    for index, module in enumerate(modules):
        kind, name = _kind(module), _module_name(module, index)
        path = folder / str(module.get("path") or "")
        if index == 0:
            if kind != "Transformer":
                raise ValueError(f"modules.json: the first module must be a Transformer (got {module.get('type')!r})")
            if str(module.get("path") or "") not in ("", "."):
                raise ValueError(f"modules.json: the Transformer's files are in {name!r}, not at the package root")
            continue
        if kind == "Pooling" and modes is None:
            raw = _object(path / "config.json")
            modes = pooling_modes(raw, f"{name}/config.json")
            dim = raw.get("embedding_dimension", raw.get("word_embedding_dimension"))
            width = int(dim) * len(modes) if dim is not None else None
            excludes = raw.get("include_prompt", True) is False and modes != ("lasttoken",)  # last token: no change
            if excludes and any(text.prompts.values()):
                raise ValueError(
                    f"{name}/config.json: include_prompt false (pooling without the prompt's tokens) is not supported"
                )
            continue
        if modes is None:
            raise ValueError(f"modules.json: {name} ({module.get('type')}) comes before the Pooling module")
        if kind == "Dense":
            step = _dense(path, name, width)
            steps.append(step)
            width = step.out_features
        elif kind == "LayerNorm":
            steps.append(_layer_norm(path, name, width))
        elif kind == "Normalize":
            _reads_sentence_embedding(_object(path / "config.json"), name, kind)
            steps.append(NormalizeStep())
        elif kind != "Dropout":  # Dropout: nothing at inference
            raise ValueError(f"modules.json: module {name} of type {module.get('type')!r} is not one we can run")
    if modes is None:
        raise ValueError("modules.json lists no Pooling module")
    normalize = bool(steps) and isinstance(steps[-1], NormalizeStep)
    if normalize:
        steps.pop()
    pooling = PoolingConfig(
        modes=modes,
        normalize=normalize,
        max_seq_length=text.max_seq_length,
        from_sentence_transformers=True,
        steps=tuple(steps),
    )
    return StPackage(pooling, text)


def _sparse_package(folder: Path, modules: list[dict[str, Any]], text: TextSettings) -> StPackage:
    """A SparseEncoder's modules: the masked-LM Transformer at the root, then one SpladePooling."""
    kinds = [_kind(m) for m in modules]
    if len(modules) != 2 or kinds[0] not in ("Transformer", "MLMTransformer") or kinds[1] != "SpladePooling":
        listed = ", ".join(str(m.get("type")) for m in modules)
        raise ValueError(
            f"modules.json: a SparseEncoder is served as Transformer (or MLMTransformer) then SpladePooling (got {listed})"
        )
    if str(modules[0].get("path") or "") not in ("", "."):
        raise ValueError(
            f"modules.json: the Transformer's files are in {modules[0].get('path')!r}, not at the package root"
        )
    raw = _object(folder / str(modules[1].get("path") or "") / "config.json")
    splade = SpladeSettings(
        pooling=str(raw.get("pooling_strategy", "max")), activation=str(raw.get("activation_function", "relu"))
    )
    pooling = PoolingConfig(modes=("mean",), max_seq_length=text.max_seq_length, from_sentence_transformers=True)
    return StPackage(pooling, text, splade)


def load_pooling_config(folder: Path, default_mode: str = "mean") -> PoolingConfig:
    """The pooling of the model in FOLDER (`read_package`'s; DEFAULT_MODE without sentence-transformers files)."""
    return read_package(Path(folder), default_mode).pooling
