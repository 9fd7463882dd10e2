"""Our own torch BERT encoder (inference only, no `transformers` at run time).

Reads a Hugging Face `BertModel` / `BertForSequenceClassification` folder (RoBERTa-style position
offsets too). Q, K and V are merged into one linear layer per block; attention is
`scaled_dot_product_attention`, without a mask when every row has the same length. No dropout.

`load_bert(folder)` → `(BertEncoder, SequenceClassificationHead | None)`: the head is there when the
checkpoint has `classifier.weight` (BERT: pooler + classifier) or `classifier.out_proj.weight`
(RoBERTa: the same maths under other names).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.weights import Weights, WeightsError, load_weights

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
ROBERTA_TYPES = frozenset({"roberta", "xlm-roberta", "camembert"})
SUPPORTED_TYPES = frozenset({"bert"}) | ROBERTA_TYPES
_M = TypeVar("_M", bound=nn.Module)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    num_labels: int = 2
    id2label: dict[int, str] = field(default_factory=dict)
    problem_type: str | None = None
    model_type: str = "bert"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        model_type = str(raw.get("model_type", "bert"))
        if model_type not in SUPPORTED_TYPES:
            raise ValueError(f"model_type {model_type!r} is not a BERT-style encoder ({sorted(SUPPORTED_TYPES)})")
        act = str(raw.get("hidden_act", "gelu"))
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported ({sorted(ACTIVATIONS)})")
        pos_type = raw.get("position_embedding_type", "absolute")
        if pos_type not in (None, "absolute"):
            raise ValueError(f"position_embedding_type {pos_type!r} is not supported (only 'absolute')")
        id2label = {int(k): str(v) for k, v in (raw.get("id2label") or {}).items()}
        num_labels = len(id2label) if id2label else int(raw.get("num_labels", 2))
        if not id2label:  # the transformers default names
            id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
        fields = {
            k: raw[k]
            for k in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
                "type_vocab_size",
                "layer_norm_eps",
                "problem_type",
            )
            if k in raw
        }
        pad = raw.get("pad_token_id")
        cfg = cls(
            **fields,
            hidden_act=act,
            model_type=model_type,
            num_labels=num_labels,
            id2label=id2label,
            pad_token_id=int(pad) if pad is not None else 0,
        )
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError(f"hidden_size {cfg.hidden_size} is not a multiple of {cfg.num_attention_heads} heads")
        return cfg

    @classmethod
    def from_folder(cls, folder: Path) -> BertConfig:
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(raw)

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers positions from pad_token_id + 1; BERT from 0."""
        return self.pad_token_id + 1 if self.model_type in ROBERTA_TYPES else 0

    @property
    def max_tokens(self) -> int:
        """The longest row (special tokens included) the position table can hold."""
        return self.max_position_embeddings - self.position_offset

    @property
    def labels(self) -> list[str]:
        return [self.id2label.get(i, f"LABEL_{i}") for i in range(self.num_labels)]


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        # `_weight` skips the random init (slow on the meta device; every table is loaded anyway)
        self.word_embeddings = nn.Embedding(cfg.vocab_size, h, _weight=torch.empty(cfg.vocab_size, h))
        self.position_embeddings = nn.Embedding(
            cfg.max_position_embeddings, h, _weight=torch.empty(cfg.max_position_embeddings, h)
        )
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, h, _weight=torch.empty(cfg.type_vocab_size, h))
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.offset = cfg.position_offset
        self.max_tokens = cfg.max_tokens

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        t = input_ids.shape[1]
        if t > self.max_tokens:
            raise ValueError(f"row of {t} tokens exceeds the {self.max_tokens} positions of this model")
        x = self.word_embeddings(input_ids)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        # right padding: positions are 0..T-1 (+ offset) for every row; padded slots are masked
        x = x + self.position_embeddings.weight[self.offset : self.offset + t]
        return self.LayerNorm(x)


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(h, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a = a.transpose(1, 2).reshape(b, t, h)
        x = self.attn_norm(self.attn_out(a) + x)
        return self.ffn_norm(self.ffn_out(self.act(self.ffn_in(x))) + x)


class BertEncoder(nn.Module):
    """Embeddings + the transformer blocks; `forward` returns the last hidden state [B, T, H]."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    @property
    def blocks(self) -> list[BertLayer]:
        """The transformer blocks, typed (an `nn.ModuleList` yields plain modules)."""
        return cast("list[BertLayer]", list(self.layers))

    @classmethod
    def from_pretrained(cls, folder: Path, dtype: torch.dtype = torch.float32) -> BertEncoder:
        return load_bert(folder, dtype)[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        mask = None
        if attention_mask is not None:  # [B, T] → [B, 1, 1, T] bool, True = attend
            mask = attention_mask.to(torch.bool)[:, None, None, :]
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    """dense + tanh on the first ([CLS]) token."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


class SequenceClassificationHead(nn.Module):
    """`BertForSequenceClassification`'s head: pooler, then a linear layer to num_labels logits."""

    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.pooler = BertPooler(hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pooler(hidden_states))


class BertClassifier(nn.Module):
    """Encoder + classification head: `forward` returns logits [B, num_labels]."""

    def __init__(self, encoder: BertEncoder, head: SequenceClassificationHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    @classmethod
    def from_pretrained(cls, folder: Path, dtype: torch.dtype = torch.float32) -> BertClassifier:
        encoder, head = load_bert(folder, dtype)
        if head is None:
            raise WeightsError(f"{folder} has no sequence-classification head (no 'classifier.weight')")
        return cls(encoder, head)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.head(self.encoder(input_ids, attention_mask, token_type_ids))


def _encoder_state(w: Weights, cfg: BertConfig) -> dict[str, torch.Tensor]:
    state = {
        f"embeddings.{n}": w.take(f"embeddings.{n}")
        for n in (
            "word_embeddings.weight",
            "position_embeddings.weight",
            "token_type_embeddings.weight",
            "LayerNorm.weight",
            "LayerNorm.bias",
        )
    }
    for i in range(cfg.num_hidden_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            state[dst + "qkv." + kind] = torch.cat(
                w.take_all(f"{src}attention.self.{n}.{kind}" for n in ("query", "key", "value"))
            )
            for ours, theirs in (
                ("attn_out", "attention.output.dense"),
                ("attn_norm", "attention.output.LayerNorm"),
                ("ffn_in", "intermediate.dense"),
                ("ffn_out", "output.dense"),
                ("ffn_norm", "output.LayerNorm"),
            ):
                state[f"{dst}{ours}.{kind}"] = w.take(f"{src}{theirs}.{kind}")
    return state


def _head_state(w: Weights) -> dict[str, torch.Tensor] | None:
    if "classifier.weight" in w:  # BERT
        names = {"pooler.dense": "pooler.dense", "classifier": "classifier"}
    elif "classifier.out_proj.weight" in w:  # RoBERTa: dense + tanh on <s>, then out_proj
        names = {"pooler.dense": "classifier.dense", "classifier": "classifier.out_proj"}
    else:
        return None
    return {f"{ours}.{k}": w.take(f"{theirs}.{k}") for ours, theirs in names.items() for k in ("weight", "bias")}


def _assign(module: _M, state: dict[str, torch.Tensor], source: str) -> _M:
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # shape mismatches between config.json and the tensors
        raise WeightsError(f"{source} does not fit its config.json: {exc}") from exc
    return module.requires_grad_(False).eval()


def load_bert(
    folder: Path,
    dtype: torch.dtype = torch.float32,
) -> tuple[BertEncoder, SequenceClassificationHead | None]:
    """Read config.json and the safetensors of FOLDER: the encoder, and the head when there is one."""
    folder = Path(folder)
    cfg = BertConfig.from_folder(folder)
    w = load_weights(folder, dtype)
    with torch.device("meta"):  # no random init: every tensor is assigned from the checkpoint
        encoder = BertEncoder(cfg)
        head = SequenceClassificationHead(cfg.hidden_size, cfg.num_labels)
    _assign(encoder, _encoder_state(w, cfg), str(folder))
    head_state = _head_state(w)
    if head_state is None:
        return encoder, None
    return encoder, _assign(head, head_state, str(folder))
