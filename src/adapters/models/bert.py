"""Our own torch BERT encoder (inference only, no `transformers` at run time).

Reads a Hugging Face `BertModel` / `BertForSequenceClassification` folder (RoBERTa-style position
offsets too). Q, K and V are merged into one linear layer per block; attention is
`scaled_dot_product_attention`, without a mask when every row has the same length. No dropout.

`load_bert(folder)` → `(BertEncoder, SequenceClassificationHead | None)`: the head is there when the
checkpoint has `classifier.weight` (BERT: pooler + classifier) or `classifier.out_proj.weight`
(RoBERTa: the same maths under other names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import ACTIVATIONS as ACTIVATIONS  # read from here too (cpu_onednn)
from vllm_srun.adapters.models.encoder_parts import (
    BERT_BLOCK_NAMES,
    SIZE_FIELDS,
    ConfigBase,
    PostNormBlock,
    check_heads,
    config_labels,
    given_fields,
    load_parts,
    post_norm_block_state,
    read_activation,
    take_linear,
)
from vllm_srun.adapters.models.unpadded import EmbeddingTables
from vllm_srun.adapters.models.weights import Weights, WeightsError

if TYPE_CHECKING:
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows

ROBERTA_TYPES = frozenset({"roberta", "xlm-roberta", "camembert"})
SUPPORTED_TYPES = frozenset({"bert"}) | ROBERTA_TYPES


@dataclass(frozen=True)
class BertConfig(ConfigBase):
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
    model_type: str = "bert"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        """Read a config.json as transformers 4.x or 5.x writes it; a field one of them leaves out takes
        transformers' default for the model type (RoBERTa's pad_token_id is 1, BERT's 0)."""
        model_type = str(raw.get("model_type", "bert"))
        if model_type not in SUPPORTED_TYPES:
            raise ValueError(f"model_type {model_type!r} is not a BERT-style encoder ({sorted(SUPPORTED_TYPES)})")
        act = read_activation(raw, "hidden_act")
        # transformers 5.x dropped the field (absolute only); 4.x's relative kinds we cannot serve
        pos_type = raw.get("position_embedding_type", "absolute")
        if pos_type not in (None, "absolute"):
            raise ValueError(f"position_embedding_type {pos_type!r} is not supported (only 'absolute')")
        num_labels, id2label = config_labels(raw)
        fields = given_fields(raw, (*SIZE_FIELDS, "type_vocab_size", "layer_norm_eps", "problem_type"))
        pad = raw.get("pad_token_id")
        if pad is None:
            pad = 1 if model_type in ROBERTA_TYPES else 0
        cfg = cls(
            **fields,
            hidden_act=act,
            model_type=model_type,
            num_labels=num_labels,
            id2label=id2label,
            pad_token_id=int(pad),
        )
        check_heads(cfg.hidden_size, cfg.num_attention_heads)
        if cfg.max_tokens < 1:
            raise ValueError(
                f"max_position_embeddings {cfg.max_position_embeddings} leaves no position past pad_token_id {pad}"
            )
        return cfg

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers positions from pad_token_id + 1; BERT from 0."""
        return self.pad_token_id + 1 if self.model_type in ROBERTA_TYPES else 0

    @property
    def max_tokens(self) -> int:
        """The longest row (special tokens included) the position table can hold."""
        return self.max_position_embeddings - self.position_offset


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


class BertLayer(PostNormBlock):
    """BERT's post-norm block (DistilBERT's and MPNet's too, whose configs carry the same sizes)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """X [B, T, H]; MASK None, a bool [B, 1, 1, T] (True = attend) or an additive float bias
        broadcast to [B, heads, T, T] (MPNet's position bias, padded keys at the dtype's lowest)."""
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a = a.transpose(1, 2).reshape(b, t, h)
        return self.feed_forward(self.attn_norm(self.attn_out(a) + x))


class BertEncoder(EncoderModuleDefaults, nn.Module):
    """Embeddings + the transformer blocks; `forward` returns the last hidden state [B, T, H]."""

    asks_for_layers = True  # `packed_forward` runs the layers through `ForwardOps.layers` where it can

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def embedding_tables(self) -> EmbeddingTables:
        """The embeddings as `ForwardOps.encode` runs them (the same sums, in `packed_forward`'s order)."""
        emb = self.embeddings
        return EmbeddingTables(
            emb.word_embeddings.weight,
            emb.position_embeddings.weight,
            emb.token_type_embeddings.weight,
            emb.LayerNorm,
            emb.offset,
        )

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

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor:
        """The last hidden state of every real token, [N, H], rows in PACKED's sorted order."""
        emb = self.embeddings
        x = emb.word_embeddings(packed.ids) + emb.position_embeddings.weight[emb.offset + packed.positions]
        if packed.types is None:
            x = x + emb.token_type_embeddings.weight[0]
        else:
            x = x + emb.token_type_embeddings(packed.types)
        x = emb.LayerNorm(x)
        stacked = ops.layers(x, packed, self.blocks, linears)  # one call where the ops have it
        if stacked is not None:
            return stacked
        for layer, lin in zip(self.blocks, linears):
            attended = ops.attention(lin.qkv(x), packed, layer.heads)
            x = ops.add_norm(lin.attn_out(attended), x, layer.attn_norm)
            x = ops.add_norm(lin.ffn_out(lin.ffn_in_act(x)), x, layer.ffn_norm)
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

    reads_first_token = True  # the unpadded forward may hand it each row's first token alone

    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.pooler = BertPooler(hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
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
        return self.head(self.encoder(input_ids, attention_mask, token_type_ids), attention_mask)


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
    qkv = [f"attention.self.{n}" for n in ("query", "key", "value")]
    for i in range(cfg.num_hidden_layers):
        state |= post_norm_block_state(w, f"encoder.layer.{i}.", f"layers.{i}.", qkv, BERT_BLOCK_NAMES)
    return state


def _head_state(w: Weights, cfg: BertConfig) -> dict[str, torch.Tensor] | None:
    if "classifier.weight" in w and "pooler.dense.weight" in w:  # BERT (without a pooler: a token head)
        pooler, classifier = "pooler.dense", "classifier"
    elif "classifier.out_proj.weight" in w:  # RoBERTa: dense + tanh on <s>, then out_proj
        pooler, classifier = "classifier.dense", "classifier.out_proj"
    else:
        return None
    return take_linear(w, "pooler.dense", pooler) | take_linear(w, "classifier", classifier)


def load_bert(
    folder: Path,
    dtype: torch.dtype = torch.float32,
) -> tuple[BertEncoder, SequenceClassificationHead | None]:
    """Read config.json and the safetensors of FOLDER: the encoder, and the head when there is one."""
    return load_parts(
        folder,
        dtype,
        config=BertConfig.from_folder,
        encoder=BertEncoder,
        head=lambda cfg: SequenceClassificationHead(cfg.hidden_size, cfg.num_labels),
        encoder_state=_encoder_state,
        head_state=_head_state,
    )
