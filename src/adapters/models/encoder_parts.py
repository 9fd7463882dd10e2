"""Pieces the encoder architecture modules share, whatever their maths.

`bert.py`, `distilbert.py`, `mpnet.py`, `deberta_v2.py`, `modernbert.py` and `decoder_encoder.py` each
keep their own maths; what they have in common lives here:

- configs: `ConfigBase` (the label fields every config has, their `labels`, and `from_folder`:
  config.json with a clear error), readers of a config.json's fields (`config_labels`,
  `read_model_type`, `read_activation`, `given_fields` with `SIZE_FIELDS`) and `check_heads`;
- weights: `load_parts` (the shape of every `load_<arch>`: config, safetensors, modules built on the
  meta device, each assigned its tensors, the head only when the checkpoint has one), `assign`,
  `take_linear`, `post_norm_block_state` (a BERT-shaped block's tensors under our names);
- `PostNormBlock`: the parameters of a BERT-shaped post-norm block (`qkv`, `attn_out`, `attn_norm`,
  `ffn_in`, `ffn_out`, `ffn_norm`) and its activation, as `encoder_arch.EncoderBlock` wants them.
The fixture writers' shared pieces (`FixtureSizes`, `FixtureTensors`, `label_fields`) live in
`families/fixtures/fixture_tensors.py`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.manifest import read_config
from vllm_srun.adapters.models.weights import Weights, WeightsError, load_weights

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
# the sizes transformers' encoder configs name alike (each architecture reads its own fields too)
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
# our names of a post-norm block's parts after `qkv`, in `post_norm_block_state`'s order
POST_NORM_PARTS = ("attn_out", "attn_norm", "ffn_in", "ffn_out", "ffn_norm")
# transformers' names of those parts in BERT's block (DeBERTa's too)
BERT_BLOCK_NAMES = (
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)

_M = TypeVar("_M", bound=nn.Module)
_C = TypeVar("_C")
_E = TypeVar("_E", bound=nn.Module)
_H = TypeVar("_H", bound=nn.Module)
State = dict[str, torch.Tensor]


def config_labels(raw: dict[str, Any]) -> tuple[int, dict[int, str]]:
    """(num_labels, id2label) of a config.json: from id2label when there is one, else num_labels
    (default 2) named LABEL_i as transformers names them."""
    id2label = {int(k): str(v) for k, v in (raw.get("id2label") or {}).items()}
    count = raw.get("num_labels")
    num_labels = len(id2label) if id2label else int(count) if count is not None else 2
    if not id2label:
        id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
    return num_labels, id2label


def decoder_pad_ids(own: Any, fallback: Any, vocab_size: int) -> tuple[int, int | None]:
    """(the id that pads a decoder's right-padded rows, the config's own pad_token_id or None):
    OWN (config.json's) when it is an int, else FALLBACK (the tokenizer's), else 0 when neither
    is an id of the vocabulary (any id pads right-padded causal rows)."""
    own = own if isinstance(own, int) and not isinstance(own, bool) else None
    pad = own if own is not None else fallback
    if not isinstance(pad, int) or not 0 <= pad < vocab_size:
        pad = 0
    return pad, own


def read_model_type(raw: dict[str, Any], expected: str) -> str:
    """RAW's model_type (EXPECTED when it has none); a ValueError naming the field when it is another."""
    model_type = str(raw.get("model_type", expected))
    if model_type != expected:
        raise ValueError(f"model_type {model_type!r} is not {expected!r}")
    return model_type


def read_activation(
    raw: dict[str, Any], key: str, default: str = "gelu", table: Mapping[str, Any] = ACTIVATIONS
) -> str:
    """RAW[KEY] (DEFAULT when missing or null); a ValueError naming KEY when TABLE has no such activation."""
    act = str(raw.get(key) or default)
    if act not in table:
        raise ValueError(f"{key} {act!r} is not supported ({sorted(table)})")
    return act


def given_fields(raw: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """RAW's values of NAMES where it has them, not null: a field one transformers version leaves out
    takes the config class's default."""
    return {k: raw[k] for k in names if raw.get(k) is not None}


def check_heads(
    hidden: int, heads: int, hidden_name: str = "hidden_size", heads_name: str = "num_attention_heads"
) -> None:
    """A ValueError naming both fields unless HEADS (at least one) divides HIDDEN."""
    if heads < 1 or hidden % heads:
        raise ValueError(f"{hidden_name} {hidden} is not a multiple of {heads_name} {heads}")


@dataclass(frozen=True, kw_only=True)
class ConfigBase(abc.ABC):
    """What every architecture's config (a frozen dataclass with its own `from_dict`) shares: the
    classification labels (keyword-only fields, after the architecture's own)."""

    num_labels: int = 2
    id2label: dict[int, str] = field(default_factory=dict)
    problem_type: str | None = None

    @classmethod
    @abc.abstractmethod
    def from_dict(cls, raw: dict[str, Any]) -> Self:
        """The config of config.json's RAW dict (a one-line ValueError for what we cannot serve)."""

    @classmethod
    def from_folder(cls, folder: Path) -> Self:
        """FOLDER's config.json (a ValueError naming the file when it is missing or not JSON)."""
        return cls.from_dict(read_config(folder))

    @property
    def labels(self) -> list[str]:
        return [self.id2label.get(i, f"LABEL_{i}") for i in range(self.num_labels)]


class PostNormSizes(Protocol):
    """The config fields a `PostNormBlock` reads."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def hidden_act(self) -> str: ...
    @property
    def layer_norm_eps(self) -> float: ...


class PostNormBlock(nn.Module):
    """The parameters of a post-norm block (BERT's layout): Q, K and V in one linear of 3 × INNER
    outputs (INNER: heads × head size, the hidden size unless given), `attn_out` back to the hidden
    size, `attn_norm`, then `ffn_in` → activation → `ffn_out` and `ffn_norm`. Subclasses add `forward`."""

    glu = False  # the feed-forward is act(ffn_in(x)), not a gated unit

    def __init__(self, cfg: PostNormSizes, inner: int | None = None) -> None:
        super().__init__()
        h = cfg.hidden_size
        inner = h if inner is None else inner
        self.heads = cfg.num_attention_heads
        self.qkv = nn.Linear(h, 3 * inner)
        self.attn_out = nn.Linear(inner, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(h, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.hidden_act = cfg.hidden_act
        self.act = ACTIVATIONS[cfg.hidden_act]

    def activate(self, y: torch.Tensor) -> torch.Tensor:
        return self.act(y)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's second half on X (the attention half's output): ffn_norm(x + ffn_out(act(ffn_in(x))))."""
        return self.ffn_norm(self.ffn_out(self.act(self.ffn_in(x))) + x)


def assign(module: _M, state: State, source: str) -> _M:
    """MODULE (built on the meta device) holding STATE's tensors, frozen, in eval mode; a tensor that
    does not fit config.json's sizes raises WeightsError naming SOURCE."""
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # shape mismatches between config.json and the tensors
        raise WeightsError(f"{source} does not fit its config.json: {exc}") from exc
    return module.requires_grad_(False).eval()


def take_linear(w: Weights, ours: str, theirs: str, bias: bool = True) -> State:
    """THEIRS' weight (and bias) under OURS' names (also for LayerNorms, embeddings and convolutions)."""
    kinds = ("weight", "bias") if bias else ("weight",)
    return {f"{ours}.{k}": w.take(f"{theirs}.{k}") for k in kinds}


def post_norm_block_state(w: Weights, src: str, dst: str, qkv: Sequence[str], parts: Sequence[str]) -> State:
    """A `PostNormBlock`'s tensors under DST: the QKV linears (names under SRC) concatenated into `qkv`,
    and PARTS (names under SRC, in `POST_NORM_PARTS`' order) as `attn_out` … `ffn_norm`."""
    state: State = {}
    for kind in ("weight", "bias"):
        state[f"{dst}qkv.{kind}"] = torch.cat(w.take_all(f"{src}{n}.{kind}" for n in qkv))
        for ours, theirs in zip(POST_NORM_PARTS, parts, strict=True):
            state[f"{dst}{ours}.{kind}"] = w.take(f"{src}{theirs}.{kind}")
    return state


def load_parts(
    folder: Path,
    dtype: torch.dtype,
    *,
    config: Callable[[Path], _C],
    encoder: Callable[[_C], _E],
    head: Callable[[_C], _H],
    encoder_state: Callable[[Weights, _C], State],
    head_state: Callable[[Weights, _C], State | None],
) -> tuple[_E, _H | None]:
    """What every `load_<arch>` does: CONFIG reads FOLDER's config.json, the safetensors load in DTYPE,
    ENCODER and HEAD build the modules on the meta device (no random init: every tensor is assigned
    from the checkpoint), ENCODER_STATE gives the encoder's tensors and HEAD_STATE the head's (None:
    the checkpoint has no head, and neither does the result)."""
    folder = Path(folder)
    cfg = config(folder)
    w = load_weights(folder, dtype)
    with torch.device("meta"):
        built, built_head = encoder(cfg), head(cfg)
    assign(built, encoder_state(w, cfg), str(folder))
    state = head_state(w, cfg)
    if state is None:
        return built, None
    return built, assign(built_head, state, str(folder))
