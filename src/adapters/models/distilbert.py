"""Our own torch DistilBERT encoder (inference only, no `transformers` at run time).

DistilBERT is BERT without token types and without a pooler: word + position embeddings and a
LayerNorm (eps 1e-12), then post-norm blocks (`q_lin`/`k_lin`/`v_lin` → attention → `out_lin`,
`sa_layer_norm`; `ffn.lin1` → activation → `ffn.lin2`, `output_layer_norm`), so each block is
`bert.BertLayer` under other tensor names. Positions count from 0. `sinusoidal_pos_embds` models
keep their fixed table in the checkpoint as `position_embeddings.weight` too; when a checkpoint
lacks it we build the same table. The config names its sizes `dim`, `n_layers`, `n_heads`,
`hidden_dim`, `activation` (`hidden_size`… are accepted as aliases, as transformers does).

`DistilBertForSequenceClassification`'s head: `pre_classifier` → ReLU → `classifier` on the first
token. `load_distilbert(folder)` → `(DistilBertEncoder, DistilBertClassificationHead | None)`.
`families/fixtures/distilbert_fixture.py` writes tiny random packages as transformers lays them out,
for `vllm-srun fixture` and the parity tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.bert import BertLayer
from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import (
    ConfigBase,
    check_heads,
    config_labels,
    load_parts,
    post_norm_block_state,
    read_activation,
    read_model_type,
    take_linear,
)
from vllm_srun.adapters.models.unpadded import EmbeddingTables
from vllm_srun.adapters.models.weights import Weights

if TYPE_CHECKING:
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows

LAYER_NORM_EPS = 1e-12  # fixed in DistilBERT (not a config field)
# config.json name → the alias transformers' attribute_map also accepts
_ALIASES = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads"}


@dataclass(frozen=True)
class DistilBertConfig(ConfigBase):
    vocab_size: int = 30522
    hidden_size: int = 768  # `dim`
    num_hidden_layers: int = 6  # `n_layers`
    num_attention_heads: int = 12  # `n_heads`
    intermediate_size: int = 3072  # `hidden_dim` (transformers' default is 4 × 768 whatever `dim` is)
    hidden_act: str = "gelu"  # `activation`
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    pad_token_id: int = 0
    model_type: str = "distilbert"
    layer_norm_eps: float = LAYER_NORM_EPS

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DistilBertConfig:
        read_model_type(raw, "distilbert")

        def get(name: str, default: Any) -> Any:
            value = raw.get(name)
            if value is None and name in _ALIASES:
                value = raw.get(_ALIASES[name])
            return default if value is None else value

        act = read_activation(raw, "activation")
        num_labels, id2label = config_labels(raw)
        cfg = cls(
            vocab_size=int(get("vocab_size", cls.vocab_size)),
            hidden_size=int(get("dim", cls.hidden_size)),
            num_hidden_layers=int(get("n_layers", cls.num_hidden_layers)),
            num_attention_heads=int(get("n_heads", cls.num_attention_heads)),
            intermediate_size=int(get("hidden_dim", cls.intermediate_size)),
            hidden_act=act,
            max_position_embeddings=int(get("max_position_embeddings", cls.max_position_embeddings)),
            sinusoidal_pos_embds=bool(get("sinusoidal_pos_embds", False)),
            pad_token_id=int(get("pad_token_id", 0)),
            num_labels=num_labels,
            id2label=id2label,
            problem_type=raw.get("problem_type"),
        )
        check_heads(cfg.hidden_size, cfg.num_attention_heads, "dim", "n_heads")
        return cfg

    @property
    def max_tokens(self) -> int:
        return self.max_position_embeddings


def sinusoidal_table(positions: int, dim: int) -> torch.Tensor:
    """DistilBERT's fixed table: sin at even columns, cos at odd ones, of pos / 10000^(2⌊j/2⌋/dim)."""
    pos = np.arange(positions, dtype=np.float64)[:, None]
    j = np.arange(dim)
    angles = pos / np.power(10000.0, 2 * (j // 2) / dim)[None, :]
    table = np.where(j % 2 == 0, np.sin(angles), np.cos(angles))
    return torch.from_numpy(table.astype(np.float32))


class DistilBertEmbeddings(nn.Module):
    def __init__(self, cfg: DistilBertConfig) -> None:
        super().__init__()
        h, p = cfg.hidden_size, cfg.max_position_embeddings
        # `_weight` skips the random init (every table is loaded)
        self.word_embeddings = nn.Embedding(cfg.vocab_size, h, _weight=torch.empty(cfg.vocab_size, h))
        self.position_embeddings = nn.Embedding(p, h, _weight=torch.empty(p, h))
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.max_tokens = cfg.max_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        if t > self.max_tokens:
            raise ValueError(f"row of {t} tokens exceeds the {self.max_tokens} positions of this model")
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings.weight[:t])


class DistilBertEncoder(EncoderModuleDefaults, nn.Module):
    """Embeddings + the transformer blocks; `forward` returns the last hidden state [B, T, H]."""

    asks_for_layers = True  # `packed_forward` runs the layers through `ForwardOps.layers` where it can

    def __init__(self, cfg: DistilBertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = DistilBertEmbeddings(cfg)
        # BERT's blocks: this config has the sizes they read (`encoder_parts.PostNormSizes`)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    @property
    def blocks(self) -> list[BertLayer]:
        return cast("list[BertLayer]", list(self.layers))

    def embedding_tables(self) -> EmbeddingTables:
        """The embeddings as `ForwardOps.encode` runs them: word + position, no token types."""
        emb = self.embeddings
        return EmbeddingTables(emb.word_embeddings.weight, emb.position_embeddings.weight, None, emb.LayerNorm, 0)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # DistilBERT has no token types: ignored
    ) -> torch.Tensor:
        mask = attention_mask.to(torch.bool)[:, None, None, :] if attention_mask is not None else None
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor:
        """The last hidden state of every real token, [N, H], rows in PACKED's sorted order."""
        emb = self.embeddings
        x = emb.LayerNorm(emb.word_embeddings(packed.ids) + emb.position_embeddings.weight[packed.positions])
        stacked = ops.layers(x, packed, self.blocks, linears)  # one call where the ops have it
        if stacked is not None:
            return stacked
        for layer, lin in zip(self.blocks, linears):
            x = ops.add_norm(lin.attn_out(ops.attention(lin.qkv(x), packed, layer.heads)), x, layer.attn_norm)
            x = ops.add_norm(lin.ffn_out(lin.ffn_in_act(x)), x, layer.ffn_norm)
        return x


class DistilBertClassificationHead(nn.Module):
    """`DistilBertForSequenceClassification`'s head: pre_classifier → ReLU → classifier on token 0."""

    reads_first_token = True

    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.pre_classifier = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.classifier(F.relu(self.pre_classifier(hidden_states[:, 0])))


# transformers' names of a block's parts, in `encoder_parts.POST_NORM_PARTS`' order
BLOCK_NAMES = ("attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm")


def _encoder_state(w: Weights, cfg: DistilBertConfig) -> dict[str, torch.Tensor]:
    words = w.take("embeddings.word_embeddings.weight")
    state = {
        "embeddings.word_embeddings.weight": words,
        **take_linear(w, "embeddings.LayerNorm", "embeddings.LayerNorm"),
    }
    name = "embeddings.position_embeddings.weight"
    if name in w or not cfg.sinusoidal_pos_embds:
        state[name] = w.take(name)
    else:  # a fixed table the checkpoint left out: the same numbers, built here (in the checkpoint's dtype)
        state[name] = sinusoidal_table(cfg.max_position_embeddings, cfg.hidden_size).to(words.dtype)
    qkv = [f"attention.{n}" for n in ("q_lin", "k_lin", "v_lin")]
    for i in range(cfg.num_hidden_layers):
        state |= post_norm_block_state(w, f"transformer.layer.{i}.", f"layers.{i}.", qkv, BLOCK_NAMES)
    return state


def _head_state(w: Weights, cfg: DistilBertConfig) -> dict[str, torch.Tensor] | None:
    if "classifier.weight" not in w or "pre_classifier.weight" not in w:  # bare, masked-LM or a token head
        return None
    return take_linear(w, "pre_classifier", "pre_classifier") | take_linear(w, "classifier", "classifier")


def load_distilbert(
    folder: Path, dtype: torch.dtype = torch.float32
) -> tuple[DistilBertEncoder, DistilBertClassificationHead | None]:
    """Read config.json and the safetensors of FOLDER: the encoder, and the head when there is one."""
    return load_parts(
        folder,
        dtype,
        config=DistilBertConfig.from_folder,
        encoder=DistilBertEncoder,
        head=lambda cfg: DistilBertClassificationHead(cfg.hidden_size, cfg.num_labels),
        encoder_state=_encoder_state,
        head_state=_head_state,
    )
