"""Our own torch MPNet encoder (inference only, no `transformers` at run time).

MPNet is a BERT-shaped post-norm encoder without token types, with two differences:
- positions are numbered as RoBERTa numbers them, from padding_idx + 1, and MPNet's padding_idx is
  1 whatever `pad_token_id` says (transformers hard-codes it): a row's token p reads position
  embedding 2 + p;
- every layer adds the same relative position bias to its attention scores: T5's bidirectional
  log buckets of the distance key − query (32 buckets, half per direction, exact up to 8, then
  logarithmic up to 128), looked up in `encoder.relative_attention_bias` (an embedding of one
  value per head). The bias depends only on the distance, so the unpadded forward looks it up once
  per forward for every distance its longest row can hold (`unpadded.RelativeBias`), and the
  attention of every row reads it there: the one-call C++ op on a CPU, one SDPA per run of
  equal-length rows elsewhere.
The blocks are `bert.BertLayer`s, the bias (padded keys at the lowest score) their attention mask.

Tensors: `embeddings.{word,position}_embeddings`, `embeddings.LayerNorm`,
`encoder.layer.i.attention.attn.{q,k,v,o}`, `attention.LayerNorm`, `intermediate.dense`,
`output.dense`, `output.LayerNorm`; `MPNetForSequenceClassification` prefixes them with `mpnet.` and
adds `classifier.dense` → tanh → `classifier.out_proj` on the first token: BERT's head maths, so
`bert.SequenceClassificationHead` serves it (and the oneDNN path packs it).
`load_mpnet(folder)` → `(MPNetEncoder, SequenceClassificationHead | None)`.
`families/fixtures/mpnet_fixture.py` writes tiny random packages as transformers lays them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from vllm_srun.adapters.models.bert import BertLayer, SequenceClassificationHead
from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import (
    SIZE_FIELDS,
    ConfigBase,
    check_heads,
    config_labels,
    given_fields,
    load_parts,
    post_norm_block_state,
    read_activation,
    read_model_type,
    take_linear,
)
from vllm_srun.adapters.models.unpadded import EmbeddingTables, RelativeBias
from vllm_srun.adapters.models.weights import Weights

if TYPE_CHECKING:
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows

PADDING_IDX = 1  # transformers' MPNetEmbeddings numbers positions past 1, whatever pad_token_id is
POSITION_OFFSET = PADDING_IDX + 1
BUCKETS = 32  # transformers' compute_position_bias always buckets into 32, whatever the config says


@dataclass(frozen=True)
class MPNetConfig(ConfigBase):
    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    relative_attention_num_buckets: int = 32
    pad_token_id: int = 1
    model_type: str = "mpnet"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> MPNetConfig:
        """Read a config.json as transformers 4.x or 5.x writes it (fields left out take transformers' defaults)."""
        read_model_type(raw, "mpnet")
        act = read_activation(raw, "hidden_act")
        num_labels, id2label = config_labels(raw)
        own = ("layer_norm_eps", "relative_attention_num_buckets", "pad_token_id", "problem_type")
        sizes = given_fields(raw, (*SIZE_FIELDS, *own))
        cfg = cls(**sizes, hidden_act=act, num_labels=num_labels, id2label=id2label)
        check_heads(cfg.hidden_size, cfg.num_attention_heads)
        if cfg.relative_attention_num_buckets < BUCKETS:
            raise ValueError(
                f"relative_attention_num_buckets {cfg.relative_attention_num_buckets} is below the {BUCKETS} "
                "buckets MPNet's attention reads"
            )
        if cfg.max_tokens < 1:
            raise ValueError(f"max_position_embeddings {cfg.max_position_embeddings} leaves no position past 2")
        return cfg

    @property
    def max_tokens(self) -> int:
        """The longest row the position table holds (positions start at 2)."""
        return self.max_position_embeddings - POSITION_OFFSET


def distance_buckets(n: torch.Tensor) -> torch.Tensor:
    """The bucket of each distance N = query − key: T5's bidirectional buckets. Half of them
    (16..31) are for n < 0 (keys after the query); a distance m = |n| below 8 is its own bucket,
    a longer one goes to 8 + ⌊log(m / 8) / log(128 / 8) · 8⌋ = 8 + ⌊log2(m² / 64)⌋, capped at 15.
    That is counted here in integers (m² ≥ 64 · 2^j for j = 1..7), so every device gets the same
    buckets; they equal transformers' float32 formula on a CPU at every distance."""
    half = BUCKETS // 2
    exact = half // 2
    m = n.abs()
    thresholds = exact * exact * 2 ** torch.arange(1, half - exact, device=n.device)  # 64 · 2^j, j = 1..7
    large = exact + (m[..., None] * m[..., None] >= thresholds).sum(-1)
    return (n < 0).long() * half + torch.where(m < exact, m, large)


def relative_buckets(length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[L, L] bucket of query i attending to key j (`distance_buckets` of i − j)."""
    pos = torch.arange(length, device=device)
    return distance_buckets(pos[:, None] - pos[None, :])


class MPNetEmbeddings(nn.Module):
    def __init__(self, cfg: MPNetConfig) -> None:
        super().__init__()
        h, p = cfg.hidden_size, cfg.max_position_embeddings
        self.word_embeddings = nn.Embedding(cfg.vocab_size, h, _weight=torch.empty(cfg.vocab_size, h))
        self.position_embeddings = nn.Embedding(p, h, _weight=torch.empty(p, h))
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.max_tokens = cfg.max_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        if t > self.max_tokens:
            raise ValueError(f"row of {t} tokens exceeds the {self.max_tokens} positions of this model")
        # right padding: positions 2..T+1 for every row; padded slots are masked
        positions = self.position_embeddings.weight[POSITION_OFFSET : POSITION_OFFSET + t]
        return self.LayerNorm(self.word_embeddings(input_ids) + positions)


class MPNetEncoder(EncoderModuleDefaults, nn.Module):
    """Embeddings + the transformer blocks; `forward` returns the last hidden state [B, T, H]."""

    def __init__(self, cfg: MPNetConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = MPNetEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        n, heads = cfg.relative_attention_num_buckets, cfg.num_attention_heads
        self.relative_attention_bias = nn.Embedding(n, heads, _weight=torch.empty(n, heads))

    @property
    def blocks(self) -> list[BertLayer]:
        return cast("list[BertLayer]", list(self.layers))

    def embedding_tables(self) -> EmbeddingTables:
        """The embeddings as `ForwardOps.encode` runs them: word + position (from row
        POSITION_OFFSET), no token types, then the LayerNorm (`packed_forward`'s sums)."""
        emb = self.embeddings
        return EmbeddingTables(
            emb.word_embeddings.weight, emb.position_embeddings.weight, None, emb.LayerNorm, POSITION_OFFSET
        )

    def distance_table(self, longest: int | None = None) -> RelativeBias:
        """What every layer adds to a score, by distance, for rows of up to LONGEST tokens (default:
        the model's longest, the table `ForwardOps.encode` holds for every forward)."""
        table = self.relative_attention_bias.weight
        reach = self.config.max_tokens if longest is None else longest
        return RelativeBias.over(reach, lambda n: table[distance_buckets(n.to(table.device))])

    def position_bias(self, length: int) -> torch.Tensor:
        """[heads, L, L]: what every layer adds to the scores of a row of LENGTH tokens."""
        table = self.relative_attention_bias.weight
        return table[relative_buckets(length, table.device)].permute(2, 0, 1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # MPNet has no token types: ignored
    ) -> torch.Tensor:
        x = self.embeddings(input_ids)
        bias = self.position_bias(input_ids.shape[1])[None]
        if attention_mask is not None:  # padded keys: the lowest score, so softmax gives them 0
            keep = attention_mask.to(torch.bool)[:, None, None, :]
            bias = bias.masked_fill(~keep, torch.finfo(bias.dtype).min)
        for layer in self.layers:
            x = layer(x, bias)  # the bias is every block's attention mask
        return x

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor:
        """The last hidden state of every real token, [N, H], rows in PACKED's sorted order."""
        emb = self.embeddings
        x = emb.word_embeddings(packed.ids) + emb.position_embeddings.weight[POSITION_OFFSET + packed.positions]
        x = emb.LayerNorm(x)
        relative = self.distance_table(packed.longest)
        for layer, lin in zip(self.blocks, linears):
            attended = ops.attention(lin.qkv(x), packed, layer.heads, relative)  # every row in one call on a CPU
            x = ops.add_norm(lin.attn_out(attended), x, layer.attn_norm)
            x = ops.add_norm(lin.ffn_out(lin.ffn_in_act(x)), x, layer.ffn_norm)
        return x


# transformers' names of a block's parts, in `encoder_parts.POST_NORM_PARTS`' order
BLOCK_NAMES = ("attention.attn.o", "attention.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")


def _encoder_state(w: Weights, cfg: MPNetConfig) -> dict[str, torch.Tensor]:
    state = {
        f"embeddings.{n}": w.take(f"embeddings.{n}")
        for n in ("word_embeddings.weight", "position_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")
    }
    state["relative_attention_bias.weight"] = w.take("encoder.relative_attention_bias.weight")
    qkv = [f"attention.attn.{n}" for n in "qkv"]
    for i in range(cfg.num_hidden_layers):
        state |= post_norm_block_state(w, f"encoder.layer.{i}.", f"layers.{i}.", qkv, BLOCK_NAMES)
    return state


def _head_state(w: Weights, cfg: MPNetConfig) -> dict[str, torch.Tensor] | None:
    if "classifier.out_proj.weight" not in w:  # MPNetModel's pooler is not a classification head
        return None
    return take_linear(w, "pooler.dense", "classifier.dense") | take_linear(w, "classifier", "classifier.out_proj")


def load_mpnet(
    folder: Path, dtype: torch.dtype = torch.float32
) -> tuple[MPNetEncoder, SequenceClassificationHead | None]:
    """Read config.json and the safetensors of FOLDER: the encoder, and the head when there is one."""
    return load_parts(
        folder,
        dtype,
        config=MPNetConfig.from_folder,
        encoder=MPNetEncoder,
        head=lambda cfg: SequenceClassificationHead(cfg.hidden_size, cfg.num_labels),
        encoder_state=_encoder_state,
        head_state=_head_state,
    )
