"""Our own torch CLAP (inference only, no `transformers` at run time): text and audio embeddings
in one space, as `transformers`' `ClapModel.get_text_features` / `get_audio_features` compute them.

`load_clap(folder)` reads `config.json` (`clap_config.py`) and the safetensors of a Hugging Face
`ClapModel` folder (fusion off) into a `ClapNetwork`:

- `embed_audio(features)` — [B, 1, frames, n_mels] log-mel features (`ClapFeatureExtractor`,
  `rand_trunc`) → the HTSAT tower's latent vector (`clap_htsat.py`) → the audio projection
  (linear, ReLU, linear) → L2-normalized [B, projection_dim] float32.
- `embed_text(rows)` — token id rows (RoBERTa's tokenizer) → our RoBERTa encoder (`bert.py`, rows
  right-padded with the pad id and masked) → the pooler (dense + tanh on `<s>`) → the text
  projection → L2-normalized [B, projection_dim].
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from vllm_srun.adapters.models.audio_arch import AudioNetworkDefaults
from vllm_srun.adapters.models.bert import BertEncoder, BertPooler
from vllm_srun.adapters.models.clap_config import ClapConfig
from vllm_srun.adapters.models.clap_htsat import HtsatTower, WindowBlock
from vllm_srun.adapters.models.encoder_parts import (
    ACTIVATIONS,
    BERT_BLOCK_NAMES,
    State,
    assign,
    post_norm_block_state,
    take_linear,
)
from vllm_srun.adapters.models.weights import Weights, WeightsError, load_weights


class Projection(nn.Module):
    """CLAP's projection head: linear → activation → linear."""

    def __init__(self, width: int, out: int, act: str) -> None:
        super().__init__()
        self.linear1 = nn.Linear(width, out)
        self.linear2 = nn.Linear(out, out)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.act(self.linear1(x)))


def normalize(x: torch.Tensor) -> torch.Tensor:
    """L2 normalization as `F.normalize` does it (norms floored at 1e-12)."""
    return x / x.norm(p=2, dim=-1, keepdim=True).clamp_min(1e-12)


class ClapNetwork(AudioNetworkDefaults, nn.Module):
    has_text_tower = True

    def __init__(self, cfg: ClapConfig) -> None:
        super().__init__()
        self.config = cfg
        self.audio = HtsatTower(cfg.audio)
        self.audio_projection = Projection(cfg.audio.hidden_size, cfg.projection_dim, cfg.projection_act)
        self.text = BertEncoder(cfg.text)
        self.pooler = BertPooler(cfg.text.hidden_size)
        self.text_projection = Projection(cfg.text.hidden_size, cfg.projection_dim, cfg.projection_act)

    @property
    def dimensions(self) -> int:
        return self.config.dimensions

    def embed_audio(self, features: torch.Tensor) -> torch.Tensor:
        return normalize(self.audio_projection(self.audio(features)))

    def embed_text(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        if not rows or min(len(r) for r in rows) < 1:
            raise ValueError("every text row needs at least one token")
        longest = max(len(r) for r in rows)
        pad = self.config.text.pad_token_id
        device = self.pooler.dense.weight.device
        ids = torch.tensor([[*r, *[pad] * (longest - len(r))] for r in rows], dtype=torch.long, device=device)
        mask = None
        if any(len(r) < longest for r in rows):
            mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows], device=device)
        states = self.text(ids, mask)
        return normalize(self.text_projection(self.pooler(states)))


# ---- loading ------------------------------------------------------------------------------------
def _under(w: Weights, prefix: str) -> Weights:
    """The tensors of W under PREFIX, the prefix dropped."""
    return Weights({k[len(prefix) :]: v for k, v in w.tensors.items() if k.startswith(prefix)}, w.source)


def _text_state(w: Weights, cfg: ClapConfig) -> State:
    t = _under(w, "text_model.")
    state = {
        f"text.embeddings.{n}.weight": t.take(f"embeddings.{n}.weight")
        for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    }
    state |= take_linear(t, "text.embeddings.LayerNorm", "embeddings.LayerNorm")
    qkv = [f"attention.self.{n}" for n in ("query", "key", "value")]
    for i in range(cfg.text.num_hidden_layers):
        state |= post_norm_block_state(t, f"encoder.layer.{i}.", f"text.layers.{i}.", qkv, BERT_BLOCK_NAMES)
    state |= take_linear(t, "pooler.dense", "pooler.dense")
    for part in ("linear1", "linear2"):
        state |= take_linear(w, f"text_projection.{part}", f"text_projection.{part}")
        state |= take_linear(w, f"audio_projection.{part}", f"audio_projection.{part}")
    return state


def _audio_state(w: Weights, cfg: ClapConfig) -> State:
    a = _under(w, "audio_model.audio_encoder.")
    state = take_linear(a, "audio.patch", "patch_embed.proj") | take_linear(a, "audio.final_norm", "norm")
    if cfg.audio.patch_norm:
        state |= take_linear(a, "audio.patch_norm", "patch_embed.norm")
    state |= take_linear(a, "audio.mel_norm", "batch_norm")
    state["audio.mel_norm.running_mean"] = a.take("batch_norm.running_mean")
    state["audio.mel_norm.running_var"] = a.take("batch_norm.running_var")
    state["audio.mel_norm.num_batches_tracked"] = torch.zeros((), dtype=torch.long)  # unused in eval
    for s, depth in enumerate(cfg.audio.depths):
        for b in range(depth):
            src, dst = f"layers.{s}.blocks.{b}.", f"audio.stages.{s}.blocks.{b}."
            kinds = ("weight", "bias") if cfg.audio.qkv_bias else ("weight",)
            for kind in kinds:
                parts = (f"{src}attention.self.{n}.{kind}" for n in ("query", "key", "value"))
                state[f"{dst}qkv.{kind}"] = torch.cat(a.take_all(parts))
            state[f"{dst}bias_table"] = a.take(f"{src}attention.self.relative_position_bias_table")
            for ours, theirs in (
                ("norm1", "layernorm_before"),
                ("attn_out", "attention.output.dense"),
                ("norm2", "layernorm_after"),
                ("fc1", "intermediate.dense"),
                ("fc2", "output.dense"),
            ):
                state |= take_linear(a, f"{dst}{ours}", f"{src}{theirs}")
        if s < cfg.audio.stages - 1:
            state |= take_linear(a, f"audio.stages.{s}.merge.norm", f"layers.{s}.downsample.norm")
            state |= take_linear(a, f"audio.stages.{s}.merge.reduction", f"layers.{s}.downsample.reduction", bias=False)
    return state


def load_clap(folder: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> ClapNetwork:
    """Read config.json and the safetensors of FOLDER into a ClapNetwork on DEVICE."""
    folder = Path(folder)
    cfg = ClapConfig.from_folder(folder)
    w = load_weights(folder, dtype)
    if "audio_model.audio_encoder.patch_embed.proj.weight" not in w:
        raise WeightsError(f"no CLAP audio tower in {folder} (audio_model.audio_encoder.patch_embed.proj.weight)")
    with torch.device("meta"):  # no random init: every tensor is assigned from the checkpoint
        model = ClapNetwork(cfg)
    model = assign(model, _text_state(w, cfg) | _audio_state(w, cfg), str(folder))
    for block in model.modules():
        if isinstance(block, WindowBlock):
            block.fill_buffers()
    return model.to(device) if torch.device(device).type != "cpu" else model
