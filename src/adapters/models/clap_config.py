"""What a CLAP package's `config.json` says (Hugging Face `ClapModel` layout), read without
`transformers`: an HTSAT audio tower, a RoBERTa text tower, and the two projections into one space.

`ClapConfig.from_dict(raw)` fills what the file leaves out with `transformers`' defaults
(`ClapAudioConfig`, `ClapTextConfig`, `ClapConfig`), then checks what our HTSAT code assumes:
fusion off (`enable_fusion: true` is refused in one line naming the field), square sizes, the
patch convolution landing on the patch grid, a grid that halves evenly at every patch merge and
is never smaller than the window, the spectrogram's bins folding into `spec_size`, and the last
stage's width equal to `audio_config.hidden_size` (what the audio projection reads). The top-level
`projection_dim` and `projection_hidden_act` override the towers' own, as `ClapConfig` does.
The text tower's fields become a `BertConfig` (RoBERTa positions: numbered from pad + 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.adapters.models.bert import BertConfig
from vllm_srun.adapters.models.encoder_parts import ACTIVATIONS

MODEL_TYPE = "clap"

_AUDIO_DEFAULTS: dict[str, Any] = dict(
    window_size=8,
    num_mel_bins=64,
    spec_size=256,
    hidden_act="gelu",
    patch_size=4,
    patch_stride=(4, 4),
    hidden_size=768,
    depths=(2, 2, 6, 2),
    num_attention_heads=(4, 8, 16, 32),
    enable_fusion=False,
    patch_embed_input_channels=1,
    flatten_patch_embeds=True,
    patch_embeds_hidden_size=96,
    enable_patch_layer_norm=True,
    qkv_bias=True,
    mlp_ratio=4.0,
    layer_norm_eps=1e-5,
)
_TEXT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=50265,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    max_position_embeddings=514,
    type_vocab_size=1,
    layer_norm_eps=1e-12,
    pad_token_id=1,
)
_TOP_DEFAULTS: dict[str, Any] = dict(projection_dim=512, projection_hidden_act="relu")


def _pair(value: Any, name: str) -> int:
    """One side of a square size given as an int or a pair."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"audio_config.{name} {list(value)!r}: only square sizes are supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"audio_config.{name} must be a positive integer (got {value!r})")
    return value


@dataclass(frozen=True)
class HtsatConfig:
    """The audio tower (HTSAT: a Swin transformer over the spectrogram folded into a square image)."""

    num_mel_bins: int
    spec_size: int
    patch_size: int
    patch_stride: int
    in_channels: int
    embed_dim: int  # patch_embeds_hidden_size: the first stage's width
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    window_size: int
    mlp_ratio: float
    hidden_act: str
    layer_norm_eps: float
    qkv_bias: bool
    patch_norm: bool
    hidden_size: int

    @property
    def freq_ratio(self) -> int:
        """How many time slices of the spectrogram are stacked along the frequency axis."""
        return self.spec_size // self.num_mel_bins

    @property
    def frames(self) -> int:
        """The spectrogram frames the tower reads: fewer are stretched to this (bicubic), more refused."""
        return self.spec_size * self.freq_ratio

    @property
    def grid(self) -> int:
        return self.spec_size // self.patch_stride

    @property
    def stages(self) -> int:
        return len(self.depths)

    def resolution(self, stage: int) -> int:
        return self.grid >> stage

    def width(self, stage: int) -> int:
        return self.embed_dim << stage

    @property
    def tokens(self) -> int:
        """Positions of the first stage (what a forward's cost grows with)."""
        return self.grid**2

    def check(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"audio_config.hidden_act {self.hidden_act!r} is not supported ({sorted(ACTIVATIONS)})")
        if not self.depths or len(self.depths) != len(self.heads):
            raise ValueError("audio_config.depths and num_attention_heads must name the same stages")
        if self.spec_size % self.num_mel_bins:
            raise ValueError(
                f"audio_config.spec_size {self.spec_size} is not a multiple of num_mel_bins {self.num_mel_bins}"
            )
        conv = (
            self.spec_size + 2 * ((self.patch_size - self.patch_stride) // 2) - self.patch_size
        ) // self.patch_stride
        if conv + 1 != self.grid:
            raise ValueError(
                f"audio_config.patch_size {self.patch_size} with patch_stride {self.patch_stride} "
                f"does not land on the {self.grid}×{self.grid} patch grid"
            )
        last = self.stages - 1
        if self.grid % (1 << last):
            raise ValueError(f"the {self.grid}×{self.grid} patch grid does not halve evenly over {self.stages} stages")
        if self.resolution(last) < self.window_size:
            raise ValueError(
                f"audio_config.window_size {self.window_size} is larger than the last stage's "
                f"{self.resolution(last)}×{self.resolution(last)} grid"
            )
        freq = self.resolution(last)
        c_freq = freq // self.freq_ratio
        if c_freq < 1 or freq % c_freq:
            raise ValueError(f"the last stage's {freq} rows do not fold by freq_ratio {self.freq_ratio}")
        for stage, heads in enumerate(self.heads):
            if heads < 1 or self.width(stage) % heads:
                raise ValueError(f"stage {stage}'s width {self.width(stage)} is not a multiple of {heads} heads")
        if self.width(last) != self.hidden_size:
            raise ValueError(
                f"audio_config.hidden_size {self.hidden_size} is not the last stage's width {self.width(last)}"
            )


@dataclass(frozen=True)
class ClapConfig:
    audio: HtsatConfig
    text: BertConfig
    projection_dim: int
    projection_act: str

    @property
    def dimensions(self) -> int:
        return self.projection_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClapConfig:
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type {raw.get('model_type')!r} is not {MODEL_TYPE}")
        a = {**_AUDIO_DEFAULTS, **{k: v for k, v in (raw.get("audio_config") or {}).items() if v is not None}}
        if a.get("enable_fusion"):
            raise ValueError("audio_config.enable_fusion is true: fused CLAP models are not supported")
        top = {**_TOP_DEFAULTS, **{k: raw[k] for k in _TOP_DEFAULTS if raw.get(k) is not None}}
        audio = HtsatConfig(
            num_mel_bins=int(a["num_mel_bins"]),
            spec_size=_pair(a["spec_size"], "spec_size"),
            patch_size=_pair(a["patch_size"], "patch_size"),
            patch_stride=_pair(a["patch_stride"], "patch_stride"),
            in_channels=int(a["patch_embed_input_channels"]),
            embed_dim=int(a["patch_embeds_hidden_size"]),
            depths=tuple(int(d) for d in a["depths"]),
            heads=tuple(int(h) for h in a["num_attention_heads"]),
            window_size=int(a["window_size"]),
            mlp_ratio=float(a["mlp_ratio"]),
            hidden_act=str(a["hidden_act"]),
            layer_norm_eps=float(a["layer_norm_eps"]),
            qkv_bias=bool(a["qkv_bias"]),
            patch_norm=bool(a["enable_patch_layer_norm"]),
            hidden_size=int(a["hidden_size"]),
        )
        if not a["flatten_patch_embeds"]:
            raise ValueError("audio_config.flatten_patch_embeds is false: not supported")
        audio.check()
        t = {**_TEXT_DEFAULTS, **{k: v for k, v in (raw.get("text_config") or {}).items() if v is not None}}
        text_raw = {k: t[k] for k in (*_TEXT_DEFAULTS, "position_embedding_type") if k in t}
        text = BertConfig.from_dict({**text_raw, "model_type": "roberta"})
        act = str(top["projection_hidden_act"])
        if act not in ACTIVATIONS:
            raise ValueError(f"projection_hidden_act {act!r} is not supported ({sorted(ACTIVATIONS)})")
        return cls(audio, text, int(top["projection_dim"]), act)

    @classmethod
    def from_folder(cls, folder: Path) -> ClapConfig:
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(raw)
