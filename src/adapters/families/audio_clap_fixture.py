"""The `clap` variant of the audio fixtures (R-PKG-3): a tiny random-weight `ClapModel` package in
Hugging Face layout (`transformers`' `ClapModel`, `ClapFeatureExtractor` and `RobertaTokenizer`
load it as it is), deterministic by seed.

Audio tower: HTSAT with fusion off over 16 mel bins, `spec_size` 64 (so four time slices fold into
a 64 × 64 image), 4 × 4 patches, three Swin stages of widths 16, 32, 64 with windows of 4 (the
last stage's 4 × 4 grid is one unshifted window). Text tower: RoBERTa, width 32, 2 layers, rows of
at most 32 tokens, with a byte-level BPE tokenizer built in code. Both project to 16 dimensions.
`preprocessor_config.json` is a `ClapFeatureExtractor`'s, `rand_trunc` (one mel channel) over a
2-second window at 16 kHz (201 frames, stretched to the tower's 256). Weights come from numpy's
PCG64; the batch norm's statistics are those of dB spectrograms, so its input is near unit scale.
Returns the requests its golden file records: text and audio in one request, as the space is one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.models.encoder_parts import FixtureTensors
from vllm_srun.adapters.models.manifest import write_manifest

MELS, RATE, HOP, N_FFT, CHUNK_SECONDS = 16, 16000, 160, 512, 2
SPEC, PATCH, WINDOW, EMBED = 64, 4, 4, 16
DEPTHS, AUDIO_HEADS, MLP_RATIO = (2, 2, 2), (2, 4, 8), 2.0
TEXT_HIDDEN, TEXT_LAYERS, TEXT_HEADS, TEXT_FFN, TEXT_POSITIONS = 32, 2, 4, 64, 32
PROJECTION = 16
WORDS = [
    "a",
    "the",
    "of",
    "sound",
    "dog",
    "barking",
    "cat",
    "bird",
    "singing",
    "rain",
    "on",
    "roof",
    "car",
    "engine",
    "piano",
    "music",
    "loud",
    "quiet",
    "noise",
    "tone",
    "silence",
    "speech",
]


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def clap_config(vocab_size: int, pad_token_id: int) -> dict[str, Any]:
    audio = {
        "model_type": "clap_audio_model",
        "window_size": WINDOW,
        "num_mel_bins": MELS,
        "spec_size": SPEC,
        "hidden_act": "gelu",
        "patch_size": PATCH,
        "patch_stride": [PATCH, PATCH],
        "hidden_size": EMBED << (len(DEPTHS) - 1),
        "depths": list(DEPTHS),
        "num_attention_heads": list(AUDIO_HEADS),
        "enable_fusion": False,
        "patch_embed_input_channels": 1,
        "flatten_patch_embeds": True,
        "patch_embeds_hidden_size": EMBED,
        "enable_patch_layer_norm": True,
        "drop_path_rate": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "hidden_dropout_prob": 0.0,
        "qkv_bias": True,
        "mlp_ratio": MLP_RATIO,
        "layer_norm_eps": 1e-5,
    }
    text = {
        "model_type": "clap_text_model",
        "vocab_size": vocab_size,
        "hidden_size": TEXT_HIDDEN,
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": TEXT_HEADS,
        "intermediate_size": TEXT_FFN,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": TEXT_POSITIONS + pad_token_id + 1,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": pad_token_id,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    return {
        "architectures": ["ClapModel"],
        "model_type": "clap",
        "projection_dim": PROJECTION,
        "projection_hidden_act": "relu",
        "logit_scale_init_value": 14.285714285714285,
        "audio_config": audio,
        "text_config": text,
        "torch_dtype": "float32",
    }


def clap_preprocessor() -> dict[str, Any]:
    return {
        "feature_extractor_type": "ClapFeatureExtractor",
        "feature_size": MELS,
        "sampling_rate": RATE,
        "hop_length": HOP,
        "max_length_s": CHUNK_SECONDS,
        "fft_window_size": N_FFT,
        "frequency_min": 50,
        "frequency_max": RATE // 2,
        "padding_value": 0.0,
        "return_attention_mask": False,
        "truncation": "rand_trunc",
        "padding": "repeatpad",
        "top_db": None,
    }


def _relative_index(size: int) -> np.ndarray:
    ys, xs = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    coords = np.stack([ys.ravel(), xs.ravel()])
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (size - 1)
    return (rel[..., 0] * (2 * size - 1) + rel[..., 1]).astype(np.int64)


def clap_tensors(vocab: int, pad_token_id: int, seed: int) -> dict[str, np.ndarray]:
    t = FixtureTensors(seed)
    h, ffn, positions = TEXT_HIDDEN, TEXT_FFN, TEXT_POSITIONS + pad_token_id + 1
    x = "text_model."
    out: dict[str, np.ndarray] = {
        f"{x}embeddings.word_embeddings.weight": t.normal(vocab, h),
        f"{x}embeddings.position_embeddings.weight": t.normal(positions, h),
        f"{x}embeddings.token_type_embeddings.weight": t.normal(1, h),
        f"{x}embeddings.position_ids": np.arange(positions, dtype=np.int64)[None],
        f"{x}embeddings.token_type_ids": np.zeros((1, positions), dtype=np.int64),
        **t.norm(f"{x}embeddings.LayerNorm", h),
    }
    for i in range(TEXT_LAYERS):
        p = f"{x}encoder.layer.{i}."
        for n in ("query", "key", "value"):
            out.update(t.linear(f"{p}attention.self.{n}", h, h))
        out.update(t.linear(f"{p}attention.output.dense", h, h) | t.norm(f"{p}attention.output.LayerNorm", h))
        out.update(t.linear(f"{p}intermediate.dense", ffn, h) | t.linear(f"{p}output.dense", h, ffn))
        out.update(t.norm(f"{p}output.LayerNorm", h))
    out.update(t.linear(f"{x}pooler.dense", h, h))
    a = "audio_model.audio_encoder."
    out.update(
        {
            f"{a}batch_norm.weight": (1.0 + 0.1 * t.normal(MELS)).astype(np.float32),
            f"{a}batch_norm.bias": t.normal(MELS, scale=0.1),
            f"{a}batch_norm.running_mean": (-50.0 + 5.0 * t.normal(MELS)).astype(np.float32),
            f"{a}batch_norm.running_var": (400.0 * (1.0 + 0.5 * np.abs(t.normal(MELS)))).astype(np.float32),
            f"{a}batch_norm.num_batches_tracked": np.array(0, dtype=np.int64),
            f"{a}patch_embed.proj.weight": t.normal(EMBED, 1, PATCH, PATCH),
            f"{a}patch_embed.proj.bias": t.normal(EMBED),
            **t.norm(f"{a}patch_embed.norm", EMBED),
        }
    )
    for s, (depth, heads) in enumerate(zip(DEPTHS, AUDIO_HEADS, strict=True)):
        dim = EMBED << s
        for b in range(depth):
            p = f"{a}layers.{s}.blocks.{b}."
            out.update(t.norm(f"{p}layernorm_before", dim))
            out[f"{p}attention.self.relative_position_bias_table"] = t.normal((2 * WINDOW - 1) ** 2, heads, scale=1.0)
            out[f"{p}attention.self.relative_position_index"] = _relative_index(WINDOW)
            for n in ("query", "key", "value"):
                out.update(t.linear(f"{p}attention.self.{n}", dim, dim))
            out.update(t.linear(f"{p}attention.output.dense", dim, dim) | t.norm(f"{p}layernorm_after", dim))
            inner = int(MLP_RATIO * dim)
            out.update(t.linear(f"{p}intermediate.dense", inner, dim) | t.linear(f"{p}output.dense", dim, inner))
        if s < len(DEPTHS) - 1:
            out.update(t.norm(f"{a}layers.{s}.downsample.norm", 4 * dim))
            out.update(t.linear(f"{a}layers.{s}.downsample.reduction", 2 * dim, 4 * dim, bias=False))
    width = EMBED << (len(DEPTHS) - 1)
    out.update(t.norm(f"{a}norm", width))
    for tower, size in (("audio", width), ("text", h)):
        out.update(t.linear(f"{tower}_projection.linear1", PROJECTION, size))
        out.update(t.linear(f"{tower}_projection.linear2", PROJECTION, PROJECTION))
    out["logit_scale_a"] = np.array(np.log(14.285714285714285), dtype=np.float32)
    out["logit_scale_t"] = np.array(np.log(14.285714285714285), dtype=np.float32)
    return out


def golden_requests(seed: int) -> list[dict[str, Any]]:
    from vllm_srun.adapters.media.audio_samples import audio_item

    return [
        {
            "surface": "embeddings",
            "body": {
                "input": [
                    "the sound of a dog barking",
                    audio_item("tone", 1.2, RATE, "wav", seed),
                    {"type": "text", "text": "rain on the roof"},
                    audio_item("noise", 0.5, 22050, "flac", seed + 1),
                    audio_item("chord", 1.9, 48000, "ogg", seed + 2),
                ]
            },
        },
        {"surface": "embeddings", "body": {"input": ["piano music", "a quiet car engine"], "dimensions": 8}},
        {
            "surface": "embeddings",
            "body": {"input": [audio_item("clipped", 0.8, 8000, "mp3", seed + 3)], "dimensions": 8},
        },
    ]


def write_clap_fixture(out: Path, seed: int) -> list[dict[str, Any]]:
    from safetensors.numpy import save_file

    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    tokens = write_fixture_tokenizer(out, "roberta", WORDS, model_max_length=TEXT_POSITIONS)
    _write_json(out / "config.json", clap_config(tokens.vocab_size, tokens.pad_token_id))
    tensors = clap_tensors(tokens.vocab_size, tokens.pad_token_id, seed)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "preprocessor_config.json", clap_preprocessor())
    write_manifest(
        out,
        {
            "family": "audio",
            "surfaces": ["embeddings"],
            "modalities": ["audio", "text"],
            "dtype": "float32",
            "fixture": {"variant": "clap", "seed": seed},
        },
    )
    return golden_requests(seed)
