"""CLAP packages of the audio family (R-PKG-2): text and audio embeddings in one space on
`/v1/embeddings` (text items and `input_audio` items, mixed freely in one request).

A package is a Hugging Face `ClapModel` folder with fusion off: `config.json`, safetensors,
`tokenizer.json` (RoBERTa's byte-level BPE) and `preprocessor_config.json` (a
`ClapFeatureExtractor`'s settings, `truncation: rand_trunc`: one mel channel), plus an optional
`srun.json` (`modalities`, `max_input_tokens`, `media.max_audio_bytes` / `media.max_audio_seconds`).
Embeddings are L2-normalized (`get_text_features` / `get_audio_features`, `models/clap.py`).
Text rows go to the `text` lane, audio rows to the `audio` lane (R-BAT-6): they never share a
forward and keep their own cost per token. Audio longer than the extractor's window
(`max_length_s`) is refused, never cut. Published precision FP32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import Encoded, LoadContext, LoadedModel, as_audio_encoder_engine
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
from vllm_srun.adapters.models.manifest import read_manifest
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE

FAMILY = "audio"
MODALITIES = frozenset({"text", "audio"})
CPU_TEXT_CAP_TOKENS = 4096  # R-BAT-7 cap of the text lane on a CPU, as the encoder family's


def clap_text_tokens(config: dict[str, Any], manifest: dict[str, Any]) -> int:
    """The longest text row (special tokens included) of a CLAP package, read without torch:
    RoBERTa numbers positions from pad + 1; srun.json's `max_input_tokens` may lower it."""
    text = config.get("text_config") or {}
    pad = text.get("pad_token_id")
    limit = int(text.get("max_position_embeddings") or 514) - (1 if pad is None else int(pad)) - 1
    declared = manifest.get("max_input_tokens")
    return min(int(declared), limit) if declared else limit


class ClapModel(LoadedModel):
    family = FAMILY
    audio_lane = AUDIO_LANE
    normalized = True
    architecture = "clap"

    def __init__(self, folder: Path, context: LoadContext) -> None:
        import torch

        from vllm_srun.adapters.models.clap import load_clap
        from vllm_srun.adapters.models.tokenization import TextTokenizer

        manifest = read_manifest(folder)
        device = self.device = context.device
        self.dtype = context.model_dtype(FAMILY)
        context.progress(f"load: reading weights of {folder.name} ({self.dtype})")
        self.network = load_clap(folder, getattr(torch, self.dtype), device.torch_device)
        cfg = self.config = self.network.config
        spec = self.audio_preprocess = read_audio_preprocess(folder)
        if spec.kind != "clap" or spec.truncation != "rand_trunc":
            raise ValueError(
                f"{PREPROCESSOR} makes {spec.kind} features ({spec.truncation}); an unfused CLAP reads "
                "ClapFeatureExtractor's with truncation rand_trunc"
            )
        channels, frames, mels = spec.output_shape()
        if mels != cfg.audio.num_mel_bins or frames > cfg.audio.frames or channels != cfg.audio.in_channels:
            raise ValueError(
                f"{PREPROCESSOR} makes features of shape {spec.output_shape()}; the audio tower reads "
                f"({cfg.audio.in_channels}, at most {cfg.audio.frames}, {cfg.audio.num_mel_bins})"
            )
        self.audio_engine = as_audio_encoder_engine(context.build_engine("audio_encoder", self.network))
        self.engine = self.audio_engine
        self.tokenizer = TextTokenizer.from_folder(folder)
        self.max_input_tokens = min(int(manifest.get("max_input_tokens") or cfg.text.max_tokens), cfg.text.max_tokens)
        self.audio_tokens = cfg.audio.tokens
        self.dimensions = cfg.dimensions
        self.audio_limits = audio_limits(manifest, spec.seconds)
        self.modalities = frozenset(manifest.get("modalities") or MODALITIES)
        if not self.modalities <= MODALITIES or "audio" not in self.modalities:
            raise ValueError(f"srun.json modalities must include audio and name only {sorted(MODALITIES)}")
        self.surfaces = frozenset({"embeddings"})
        cpu = device.kind == "cpu"
        audio_cap = max(CPU_AUDIO_CAP_TOKENS, self.audio_tokens)
        self.lanes = (
            Lane(DEFAULT_LANE, Accounting.PADDED, cap_tokens=CPU_TEXT_CAP_TOKENS if cpu else None),
            Lane(AUDIO_LANE, Accounting.PADDED, cap_tokens=audio_cap if cpu else None),
        )
        golden = folder / GOLDEN_FILE
        self.golden_file = golden if golden.is_file() else None

    # TextEmbedder
    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Encoded]:
        limit = min(max_length or self.max_input_tokens, self.max_input_tokens)
        return self.tokenizer.encode(list(texts), max_length=limit, truncate=truncate)

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        if lane == AUDIO_LANE:
            return list(self.audio_engine.embed_audio(payloads))
        return list(self.audio_engine.embed_text([p.ids for p in payloads]))

    def warm_up(self) -> None:
        self.run(AUDIO_LANE, sample_features(self.audio_preprocess, [0.5]))
        self.run(DEFAULT_LANE, self.tokenize(["warm up"], truncate=True))

    def probe_payloads(self) -> list[Any]:
        """Text rows of mixed lengths for the batch-invariance probe (the first lane's)."""
        words = ["the", "sound", "of", "a", "dog", "barking", "in", "heavy", "rain", "near", "a", "road"]
        texts = [" ".join(words[i % len(words)] for i in range(n)) for n in (1, 3, 6, 11, 20)]
        return self.tokenize(texts, truncate=True)

    def card_section(self) -> dict[str, Any]:
        return {
            **self.audio_engine.describe(),
            "embedding": {
                "dimensions": [self.dimensions],
                "layers": [self.config.text.num_hidden_layers],  # no early exits: the text tower's last layer
                "modalities": sorted(self.modalities),
                "normalized": self.normalized,
                "input_types": [],
                "architecture": self.architecture,
                "pooling": "text: <s> through the pooler; audio: mean of the HTSAT states; both projected",
            },
            "media": media_card(self.audio_preprocess, self.audio_limits, self.audio_tokens),
        }
