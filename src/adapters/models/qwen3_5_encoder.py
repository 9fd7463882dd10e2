"""The Qwen3.5 hybrid backbone (Gated DeltaNet + gated full attention, `qwen3_5.py`) on the encoder
surfaces: last-token embedders, the yes/no reranker recipe, and the heads transformers defines for
it — `Qwen3_5TextForSequenceClassification` / `Qwen3_5ForSequenceClassification` (classify; rerank
with one label) and `Qwen3_5ForTokenClassification` (token heads: the family reads its `score`).

`load_qwen3_5_encoder(folder, dtype)` → `(Qwen35Encoder, head | None)`, for both config layouts
(`qwen3_5_text`: fields at the top; `qwen3_5`: the text model's under `text_config`, labels and
`problem_type` at the top). What the encoder needs of the backbone is one call:
`Qwen35LM.hidden_states(ids [N], cu_seqlens [R + 1])` → final-normed hidden states [N, H] of rows
laid back to back, every row starting fresh (convolution, recurrence and attention restart at its
first token). Over it the encoder follows `encoder_arch.EncoderModule`:
- padded `forward(ids, mask, types)`: the real tokens of right-padded rows through that call,
  scattered back to [B, T, H] (padded places hold zeros no head or pooling reads);
- `packed_forward(packed, linears, ops)`: `packed.ids` / `packed.bounds` through that call, on the
  ops' kernels for this backbone (`ForwardOps.hybrid_kernels`: on a CPU in FP32 the C++ delta rule,
  convolution and layer stack of engines/cpu_hybrid.py);
- `blocks` is empty: the linear-attention layers are not four-linear blocks, so the oneDNN packed
  copies have nothing to take (`linears` is ignored); `hybrid_backbone` tells the engine's card.
Heads come from `decoder_heads.py`, as for the other decoders.

Weights are read under every name transformers saves the text model with: `model.language_model.*`
(the multimodal classes), `model.*` (the text-only classes), `language_model.*` (a bare
`Qwen3_5Model`) and no prefix (a bare `Qwen3_5TextModel`, a sentence-transformers package); the
vision tower (`visual.*`) and the multi-token-prediction weights (`mtp.*`) are not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vllm_srun.adapters.models.decoder_heads import (
    HEAD_TENSORS,
    ScoreHead,
    YesNoHead,
    decoder_head,
    labelled,
    tokenizer_pad_id,
)
from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.encoder_parts import ConfigBase, config_labels, decoder_pad_ids
from vllm_srun.adapters.models.manifest import read_config
from vllm_srun.adapters.models.weights import Weights, WeightsError, safetensors_files

if TYPE_CHECKING:
    from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
    from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config
    from vllm_srun.adapters.models.unpadded import ForwardOps, LayerLinears, PackedRows

MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
# checkpoint prefixes of the text model → ours (`model.`), longest first
PREFIXES = ("model.language_model.", "language_model.", "model.")
BARE_PARTS = ("embed_tokens.", "layers.", "norm.")  # a bare text model's own names
SKIPPED = ("model.visual.", "visual.", "mtp.", "model.mtp.")


def _text_part(raw: dict[str, Any]) -> dict[str, Any]:
    text = raw.get("text_config")
    return text if str(raw.get("model_type", "")).lower() == "qwen3_5" and isinstance(text, dict) else raw


@dataclass(frozen=True)
class Qwen35EncoderConfig(ConfigBase):
    """The `EncoderConfigLike` view of a Qwen3.5 config.json (the backbone's own fields in `backbone`)."""

    backbone: Qwen35Config
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    hidden_act: str = "silu"
    pad_token_id: int = 0  # the id that pads rows (config.json's, else the tokenizer's, else 0)
    config_pad_token_id: int | None = None  # the text config's own: what a score head reads by
    architectures: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict[str, Any], pad_token_id: int | None = None) -> Qwen35EncoderConfig:
        """Read a config.json of either layout; PAD_TOKEN_ID is the fallback when it has none."""
        from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config

        kind = str(raw.get("model_type", "")).lower()
        if kind not in MODEL_TYPES:
            raise ValueError(f"model_type {kind!r} is not a Qwen3.5 backbone ({', '.join(MODEL_TYPES)})")
        backbone = Qwen35Config.from_dict(raw)
        num_labels, id2label = config_labels(raw)  # the top level's (a multimodal config keeps them there)
        pad, own = decoder_pad_ids(_text_part(raw).get("pad_token_id"), pad_token_id, backbone.vocab_size)
        return cls(
            backbone=backbone,
            model_type=kind,
            vocab_size=backbone.vocab_size,
            hidden_size=backbone.hidden_size,
            num_hidden_layers=backbone.num_layers,
            num_attention_heads=backbone.num_heads,
            max_position_embeddings=backbone.max_position_embeddings,
            pad_token_id=pad,
            config_pad_token_id=own,
            architectures=tuple(str(a) for a in raw.get("architectures") or ()),
            num_labels=num_labels,
            id2label=id2label,
            problem_type=raw.get("problem_type"),
        )

    @property
    def max_tokens(self) -> int:
        return self.max_position_embeddings


class Qwen35Encoder(EncoderModuleDefaults, nn.Module):
    """A `Qwen35LM` (without its LM head) as an encoder (module doc)."""

    default_pooling = "lasttoken"
    blocks: Sequence[Any] = ()  # no four-linear blocks: nothing for the packed copies
    hybrid_backbone = True  # its layers run on `ForwardOps.hybrid_kernels` (the card says which)

    def __init__(self, config: Qwen35EncoderConfig, lm: Qwen35LM) -> None:
        super().__init__()
        self.config = config
        self.lm = lm

    def _check_length(self, longest: int) -> None:
        if longest > self.config.max_tokens:
            raise ValueError(f"row of {longest} tokens exceeds the {self.config.max_tokens} positions of this model")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [B, T, H] of right-padded rows (zeros where they pad)."""
        b, t = input_ids.shape
        self._check_length(int(t))
        mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        lengths = mask.sum(1)
        if bool((lengths < 1).any()):
            raise ValueError("every row needs at least one token")
        cu = torch.zeros(b + 1, dtype=torch.long, device=input_ids.device)
        cu[1:] = torch.cumsum(lengths, 0)
        hidden = self.lm.hidden_states(input_ids[mask], cu)
        out = hidden.new_zeros(b, t, hidden.shape[-1])
        out[mask] = hidden
        return out

    def packed_forward(self, packed: PackedRows, linears: Sequence[LayerLinears], ops: ForwardOps) -> torch.Tensor:
        """Final-normed hidden states of every real token, [N, H], rows in PACKED's sorted order
        (zeros for any padding rows after them)."""
        self._check_length(packed.longest)
        hidden = self.lm.hidden_states(packed.ids[: packed.tokens], packed.bounds, ops.hybrid_kernels())
        extra = packed.rows_total - packed.tokens
        return torch.cat([hidden, hidden.new_zeros(extra, hidden.shape[-1])]) if extra else hidden


def read_text_tensors(folder: Path, dtype: torch.dtype) -> Weights:
    """The text model's tensors of FOLDER as `model.*` (module doc) and the heads' (`lm_head.weight`,
    `score.*`) under their own names, cast to DTYPE."""
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for file in safetensors_files(Path(folder)):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                name = _our_name(key)
                if name is None:
                    continue
                if name in found:
                    raise WeightsError(f"tensor {name!r} appears twice in {folder} (as {key!r} and another key)")
                tensor = f.get_tensor(key)
                found[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return Weights(found, str(folder))


def _our_name(key: str) -> str | None:
    if key.startswith(SKIPPED):
        return None
    if key in HEAD_TENSORS:
        return key
    for prefix in PREFIXES:
        if key.startswith(prefix):
            return "model." + key[len(prefix) :]
    return "model." + key if key.startswith(BARE_PARTS) else None


def load_qwen3_5_encoder(
    folder: Path, dtype: torch.dtype = torch.float32
) -> tuple[Qwen35Encoder, YesNoHead | ScoreHead | None]:
    """Read config.json, srun.json and the safetensors of FOLDER: the encoder and its head (module doc)."""
    from vllm_srun.adapters.models.qwen3_5 import Qwen35LM

    folder = Path(folder)
    cfg = Qwen35EncoderConfig.from_dict(read_config(folder), tokenizer_pad_id(folder))
    w = read_text_tensors(folder, dtype)
    state = {k: v for k, v in w.tensors.items() if k not in HEAD_TENSORS}
    with torch.device("meta"):
        lm = Qwen35LM(cfg.backbone, head=False)
    try:
        missing, unexpected = lm.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # shape mismatches between config.json and the tensors
        raise WeightsError(f"{folder} does not fit its config.json: {str(exc).splitlines()[-1].strip()}") from exc
    if missing or unexpected:
        raise WeightsError(
            f"weights in {folder} do not fit the Qwen3.5 layout: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    lm.eval().requires_grad_(False)
    tied = cfg.backbone.tie_word_embeddings
    head = decoder_head(folder, w, cfg, lambda: lm.model.embed_tokens.weight if tied else w.take("lm_head.weight"))
    return Qwen35Encoder(labelled(cfg, head), lm).eval().requires_grad_(False), head
