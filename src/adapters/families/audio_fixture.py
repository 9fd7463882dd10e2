"""Tiny random-weight audio packages (R-PKG-3), deterministic by seed, in Hugging Face layout
(`transformers`' `WhisperModel` loads them as they are; the decoder, which an embedder never
reads, is left out and initialised at random there).

Variant `whisper`: a 2-layer encoder of width 32 over 16 mel bins, reading a 2-second window
(`WhisperFeatureExtractor` with `chunk_length` 2: 200 frames, 100 positions). Weights come from
numpy's PCG64; the golden requests carry audio made in code (`media/audio_samples.py`) in every
format. Variant `clap` (`audio_clap_fixture.py`): a tiny `ClapModel`, text and audio in one space.
Returns the requests its golden file records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.models.manifest import write_manifest

VARIANTS = ("whisper", "clap")
HIDDEN, LAYERS, HEADS, FFN = 32, 2, 4, 64
MELS, RATE, HOP, N_FFT, CHUNK_SECONDS = 16, 16000, 160, 400, 2
POSITIONS = CHUNK_SECONDS * RATE // HOP // 2


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def whisper_config() -> dict[str, Any]:
    return {
        "architectures": ["WhisperModel"],
        "model_type": "whisper",
        "d_model": HIDDEN,
        "encoder_layers": LAYERS,
        "encoder_attention_heads": HEADS,
        "encoder_ffn_dim": FFN,
        "decoder_layers": 1,
        "decoder_attention_heads": HEADS,
        "decoder_ffn_dim": FFN,
        "num_mel_bins": MELS,
        "max_source_positions": POSITIONS,
        "max_target_positions": 32,
        "vocab_size": 64,
        "activation_function": "gelu",
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "decoder_start_token_id": 1,
        "torch_dtype": "float32",
    }


def whisper_preprocessor() -> dict[str, Any]:
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": MELS,
        "sampling_rate": RATE,
        "hop_length": HOP,
        "chunk_length": CHUNK_SECONDS,
        "n_fft": N_FFT,
        "padding_value": 0.0,
        "padding_side": "right",
        "return_attention_mask": False,
    }


def whisper_tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {
            f"{name}.weight": (1.0 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32),
            f"{name}.bias": normal(HIDDEN),
        }

    def linear(name: str, rows: int, cols: int, bias: bool = True) -> dict[str, np.ndarray]:
        out = {f"{name}.weight": normal(rows, cols)}
        if bias:
            out[f"{name}.bias"] = normal(rows)
        return out

    e = "encoder"
    out = {
        f"{e}.conv1.weight": normal(HIDDEN, MELS, 3, scale=0.2),
        f"{e}.conv1.bias": normal(HIDDEN),
        f"{e}.conv2.weight": normal(HIDDEN, HIDDEN, 3, scale=0.1),
        f"{e}.conv2.bias": normal(HIDDEN),
        f"{e}.embed_positions.weight": normal(POSITIONS, HIDDEN),
        **norm(f"{e}.layer_norm"),
    }
    for i in range(LAYERS):
        p = f"{e}.layers.{i}."
        out.update(linear(f"{p}self_attn.q_proj", HIDDEN, HIDDEN))
        out.update(linear(f"{p}self_attn.k_proj", HIDDEN, HIDDEN, bias=False))
        out.update(linear(f"{p}self_attn.v_proj", HIDDEN, HIDDEN))
        out.update(linear(f"{p}self_attn.out_proj", HIDDEN, HIDDEN))
        out.update(norm(f"{p}self_attn_layer_norm") | norm(f"{p}final_layer_norm"))
        out.update(linear(f"{p}fc1", FFN, HIDDEN) | linear(f"{p}fc2", HIDDEN, FFN))
    return out


def golden_requests(seed: int) -> list[dict[str, Any]]:
    from vllm_srun.adapters.media.audio_samples import audio_item

    return [
        {
            "surface": "embeddings",
            "body": {
                "input": [
                    audio_item("tone", 1.2, RATE, "wav", seed),
                    audio_item("noise", 0.5, 22050, "flac", seed + 1),
                    audio_item("chord", 1.5, 48000, "ogg", seed + 2),
                ]
            },
        },
        {
            "surface": "embeddings",
            "body": {"input": [audio_item("clipped", 0.8, 8000, "mp3", seed + 3)], "dimensions": 8},
        },
    ]


def write_audio_fixture(out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
    from safetensors.numpy import save_file

    kind = variant or "whisper"
    if kind not in VARIANTS:
        raise ValueError(f"audio fixtures come in variants {', '.join(VARIANTS)} (got {variant!r})")
    out = Path(out)
    if kind == "clap":
        from vllm_srun.adapters.families.audio_clap_fixture import write_clap_fixture

        return write_clap_fixture(out, seed)
    _write_json(out / "config.json", whisper_config())
    save_file(whisper_tensors(seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "preprocessor_config.json", whisper_preprocessor())
    write_manifest(
        out,
        {
            "family": "audio",
            "surfaces": ["embeddings"],
            "modalities": ["audio"],
            "dtype": "float32",
            "fixture": {"variant": kind, "seed": seed},
        },
    )
    return golden_requests(seed)
