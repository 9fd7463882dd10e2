"""The audio family (R-PKG-2): audio embeddings on `/v1/embeddings` (`input_audio` items), on the
multimodal family's media machinery (media workers, the decode cache). Two kinds of package:
a Whisper encoder (this module) and CLAP, text and audio in one space (`audio_clap.py`).

A Whisper package is a Hugging Face `WhisperModel` folder: `config.json`, safetensors (the encoder's
tensors are read) and `preprocessor_config.json` (the `WhisperFeatureExtractor`'s settings), plus
an optional `srun.json` (`media.max_audio_bytes` and `media.max_audio_seconds` may lower the
limits). An embedding is the mean of the encoder's states (`models/whisper.py`), not normalized.
Audio is decoded, resampled to the extractor's rate, mixed to mono and turned into log-mel
features in the media workers (`media/audio.py`, `media/audio_features.py`); longer than the
model's window (30 s for Whisper) is refused, never cut. Audio rows go to the `audio` lane
(R-BAT-6): a lane of their own, with their own cost per token. Published precision FP32.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import (
    Encoded,
    Family,
    LoadContext,
    LoadedModel,
    PackageInfo,
    as_audio_encoder_engine,
)
from vllm_srun.adapters.families.audio_parts import (
    AUDIO_LANE,
    CPU_AUDIO_CAP_TOKENS,
    GOLDEN_FILE,
    PREPROCESSOR,
    audio_limits,
    media_card,
    read_audio_preprocess,
    sample_features,
)
from vllm_srun.adapters.families.fixtures.audio_fixture import VARIANTS, write_audio_fixture
from vllm_srun.adapters.models.manifest import read_manifest
from vllm_srun.domain.scheduling.lanes import Accounting, Lane

FAMILY = "audio"
KINDS = ("whisper", "clap")


def _config(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}


class AudioModel(LoadedModel):
    family = FAMILY
    audio_lane = AUDIO_LANE
    normalized = False

    def __init__(self, folder: Path, context: LoadContext) -> None:
        import torch

        from vllm_srun.adapters.models.whisper import load_whisper_encoder

        manifest = read_manifest(folder)
        device = self.device = context.device
        self.dtype = context.model_dtype(FAMILY)
        self.architecture = str(_config(folder).get("model_type"))
        context.progress(f"load: reading weights of {folder.name} ({self.dtype})")
        self.network = load_whisper_encoder(folder, getattr(torch, self.dtype), device.torch_device)
        cfg = self.network.config
        spec = self.audio_preprocess = read_audio_preprocess(folder)
        if spec.kind != "whisper" or spec.output_shape() != (cfg.num_mel_bins, cfg.frames):
            raise ValueError(
                f"{PREPROCESSOR} makes {spec.kind} features of shape {spec.output_shape()}; "
                f"the encoder reads ({cfg.num_mel_bins}, {cfg.frames})"
            )
        self.audio_engine = as_audio_encoder_engine(context.build_engine("audio_encoder", self.network))
        self.engine = self.audio_engine
        self.audio_tokens = cfg.max_source_positions
        self.max_input_tokens = self.audio_tokens
        self.dimensions = self.network.dimensions
        self.audio_limits = audio_limits(manifest, spec.seconds)
        self.modalities = frozenset({"audio"})
        declared = frozenset(manifest.get("modalities") or self.modalities)
        if declared != self.modalities:
            raise ValueError(f"srun.json modalities {sorted(declared)}: a Whisper encoder reads audio only")
        self.surfaces = frozenset({"embeddings"})
        cap = max(CPU_AUDIO_CAP_TOKENS, self.audio_tokens)
        self.lanes = (Lane(AUDIO_LANE, Accounting.PADDED, cap_tokens=cap if device.kind == "cpu" else None),)
        golden = folder / GOLDEN_FILE
        self.golden_file = golden if golden.is_file() else None

    # TextEmbedder (the surface refuses text before this is asked: modalities has no text)
    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Encoded]:
        raise ValueError("this model reads audio only")

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        if lane != AUDIO_LANE:
            raise ValueError(f"the audio family runs no {lane} lane")
        return list(self.audio_engine.embed_audio(payloads))

    def warm_up(self) -> None:
        self.run(AUDIO_LANE, sample_features(self.audio_preprocess, [0.5]))

    def probe_payloads(self) -> list[Any]:
        """Features of a few signals of mixed lengths (every row fills the window)."""
        return sample_features(self.audio_preprocess, [0.05, 0.3, 0.7, 1.1])

    def card_section(self) -> dict[str, Any]:
        return {
            **self.audio_engine.describe(),
            "embedding": {
                "dimensions": [self.dimensions],
                "layers": [self.network.config.tower.num_hidden_layers],  # no early exits
                "modalities": sorted(self.modalities),
                "normalized": self.normalized,
                "pooling": "mean of the encoder's states",
                "input_types": [],
                "architecture": self.architecture,
            },
            "media": media_card(self.audio_preprocess, self.audio_limits, self.audio_tokens),
        }


class AudioFamily(Family):
    name = FAMILY
    fixture_variants = VARIANTS

    def detect(self, folder: Path) -> bool:
        return _config(folder).get("model_type") in KINDS

    def describe(self, folder: Path) -> PackageInfo:
        manifest = read_manifest(folder)
        config = _config(folder)
        if config.get("model_type") == "clap":
            from vllm_srun.adapters.families.audio_clap import clap_text_tokens

            return PackageInfo(self.name, frozenset({"embeddings"}), clap_text_tokens(config, manifest))
        positions = config.get("max_source_positions")
        return PackageInfo(self.name, frozenset({"embeddings"}), int(positions) if positions else None)

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        if _config(folder).get("model_type") == "clap":
            from vllm_srun.adapters.families.audio_clap import ClapModel

            return ClapModel(folder, context)
        return AudioModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        return write_audio_fixture(out, variant, seed)
