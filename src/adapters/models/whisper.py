"""Our own torch Whisper encoder (inference only, no `transformers` at run time): the audio half of
a Hugging Face `WhisperModel` / `WhisperForConditionalGeneration` package, as an embedder.

`load_whisper_encoder(folder)` reads `config.json` (`WhisperEncoderConfig`) and the encoder's
safetensors (`encoder.*` or `model.encoder.*`; the decoder's tensors are not read) into a
`WhisperEncoder`: log-mel features [B, n_mels, 2 × positions] → two 1-D convolutions with GELU
(the second of stride 2) → plus the learned positions → pre-LayerNorm blocks (`vit.PreNormBlock`,
the key projection without bias) → a final LayerNorm; `embed_audio` mean-pools the states over
every position (the window's padding included, as the features always fill the window).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_srun.adapters.models.audio_arch import AudioNetworkDefaults
from vllm_srun.adapters.models.dual_encoder_config import ACTIVATION_NAMES, TowerConfig
from vllm_srun.adapters.models.vit import BlockStack
from vllm_srun.adapters.models.weights import Weights, WeightsError, load_weights

_DEFAULTS: dict[str, Any] = dict(
    d_model=384,
    encoder_layers=4,
    encoder_attention_heads=6,
    encoder_ffn_dim=1536,
    num_mel_bins=80,
    max_source_positions=1500,
    activation_function="gelu",
)


@dataclass(frozen=True)
class WhisperEncoderConfig:
    tower: TowerConfig
    num_mel_bins: int
    max_source_positions: int

    @property
    def frames(self) -> int:
        """Feature frames the encoder reads (its convolutions halve them into positions)."""
        return 2 * self.max_source_positions

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WhisperEncoderConfig:
        if raw.get("model_type") != "whisper":
            raise ValueError(f"model_type {raw.get('model_type')!r} is not whisper")
        c = {**_DEFAULTS, **{k: v for k, v in raw.items() if k in _DEFAULTS}}
        tower = TowerConfig(
            hidden_size=int(c["d_model"]),
            intermediate_size=int(c["encoder_ffn_dim"]),
            num_hidden_layers=int(c["encoder_layers"]),
            num_attention_heads=int(c["encoder_attention_heads"]),
            hidden_act=str(c["activation_function"]),
            layer_norm_eps=1e-5,  # Whisper's LayerNorms take torch's default
        )
        if tower.hidden_act not in ACTIVATION_NAMES:
            raise ValueError(f"activation_function {tower.hidden_act!r} is not supported")
        tower.check("config")
        return cls(tower, int(c["num_mel_bins"]), int(c["max_source_positions"]))

    @classmethod
    def from_folder(cls, folder: Path) -> WhisperEncoderConfig:
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(raw)


class WhisperEncoder(AudioNetworkDefaults, nn.Module):  # an audio tower alone
    def __init__(self, cfg: WhisperEncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        h = cfg.tower.hidden_size
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, h, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(h, h, kernel_size=3, stride=2, padding=1)
        self.position = nn.Parameter(torch.empty(cfg.max_source_positions, h))
        self.blocks = BlockStack(cfg.tower)
        self.final_norm = nn.LayerNorm(h, eps=cfg.tower.layer_norm_eps)

    @property
    def dimensions(self) -> int:
        return self.config.tower.hidden_size

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, frames] → [B, positions, d_model]."""
        want = (self.config.num_mel_bins, self.config.frames)
        if features.dim() != 3 or tuple(features.shape[1:]) != want:
            raise ValueError(f"features of shape {tuple(features.shape)}; this encoder reads [B, {want[0]}, {want[1]}]")
        x = F.gelu(self.conv1(features.to(self.conv1.weight.dtype)))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        return self.final_norm(self.blocks(x + self.position))

    def embed_audio(self, features: torch.Tensor) -> torch.Tensor:
        """[B, d_model]: the states' mean over every position."""
        return self(features).mean(dim=1)


def _state(w: Weights, cfg: WhisperEncoderConfig, prefix: str) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    h = cfg.tower.hidden_size
    for i in range(cfg.tower.num_hidden_layers):
        s, d = f"{prefix}layers.{i}.", f"blocks.layers.{i}."
        q, k, v = w.take_all(f"{s}self_attn.{p}_proj.weight" for p in "qkv")
        state[f"{d}qkv.weight"] = torch.cat([q, k, v])
        zeros = torch.zeros(h, dtype=q.dtype)  # Whisper's key projection has no bias
        state[f"{d}qkv.bias"] = torch.cat(
            [w.take(f"{s}self_attn.q_proj.bias"), zeros, w.take(f"{s}self_attn.v_proj.bias")]
        )
        for ours, theirs in (
            ("norm1", "self_attn_layer_norm"),
            ("attn_out", "self_attn.out_proj"),
            ("norm2", "final_layer_norm"),
            ("mlp.fc1", "fc1"),
            ("mlp.fc2", "fc2"),
        ):
            for kind in ("weight", "bias"):
                state[f"{d}{ours}.{kind}"] = w.take(f"{s}{theirs}.{kind}")
    for part in ("conv1", "conv2"):
        for kind in ("weight", "bias"):
            state[f"{part}.{kind}"] = w.take(f"{prefix}{part}.{kind}")
    state["position"] = w.take(f"{prefix}embed_positions.weight")
    state["final_norm.weight"] = w.take(f"{prefix}layer_norm.weight")
    state["final_norm.bias"] = w.take(f"{prefix}layer_norm.bias")
    return state


def _prefix(w: Weights) -> str:
    for prefix in ("encoder.", "model.encoder."):
        if f"{prefix}conv1.weight" in w:
            return prefix
    raise WeightsError("no Whisper encoder in the weights (encoder.conv1.weight or model.encoder.conv1.weight)")


def load_whisper_encoder(
    folder: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> WhisperEncoder:
    """Read config.json and the encoder's safetensors of FOLDER into a WhisperEncoder on DEVICE."""
    folder = Path(folder)
    cfg = WhisperEncoderConfig.from_folder(folder)
    w = load_weights(folder, dtype)
    with torch.device("meta"):  # no random init: every tensor is assigned from the checkpoint
        model = WhisperEncoder(cfg)
    try:
        model.load_state_dict(_state(w, cfg, _prefix(w)), strict=True, assign=True)
    except RuntimeError as exc:  # shape mismatches between config.json and the tensors
        raise WeightsError(f"{folder} does not fit its config.json: {exc}") from exc
    model = model.requires_grad_(False).eval()
    return model.to(device) if torch.device(device).type != "cpu" else model
