"""Tiny random-weight multimodal packages (R-PKG-3), deterministic by seed, in Hugging Face layout
(`transformers`' `CLIPModel` / `SiglipModel` load them as they are).

Variants: `clip` (quick-GELU towers, class-token vision pooling, causal text pooled at the
end-of-text token, bias-free projections to 16 dimensions) and `siglip` (no class token, an
attention pooling head, bidirectional text padded to 16 positions and pooled at the last one).
Both read 32×32 images in 8×8 patches; `preprocessor_config.json` is the matching CLIP or
SigLIP image processor's. Weights come from numpy's PCG64, the tokenizer is the model type's real
kind built in code (CLIP's byte-level BPE, SigLIP's SentencePiece Unigram), and the golden
requests carry images and a video made in code (`media/samples.py`). Returns the requests its golden file records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vllm_srun.adapters.models.manifest import write_manifest

if TYPE_CHECKING:
    from vllm_srun.adapters.models.fixture_tokenizers import TokenizerInfo

VARIANTS = ("clip", "siglip")
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 32, 2, 4, 64
IMAGE, PATCH, PROJECTION = 32, 8, 16
TEXT_POSITIONS = {"clip": 32, "siglip": 16}
VIDEO_FRAMES = 4
WORDS = [
    "a",
    "photo",
    "of",
    "the",
    "an",
    "cat",
    "dog",
    "bird",
    "fish",
    "red",
    "blue",
    "green",
    "small",
    "large",
    "square",
    "circle",
    "sea",
    "sky",
    "tree",
    "house",
    "car",
    "street",
    "night",
    "day",
    "video",
    "frame",
    "picture",
    "drawing",
]


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def write_tokenizer(folder: Path, kind: str) -> TokenizerInfo:
    """The variant's real kind of tokenizer (`models/fixture_tokenizers.py`), WORDS whole tokens:
    CLIP's byte-level BPE, `<|startoftext|> … <|endoftext|>` (ids 0 and 1; the end token is also
    the pad), or SigLIP's SentencePiece Unigram with spiece.model, `… </s>` (<pad> 0, </s> 1 — the
    pad token —, <unk> 2). `transformers`' CLIPTokenizer / SiglipTokenizer give the same ids."""
    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    return write_fixture_tokenizer(folder, kind, WORDS, model_max_length=TEXT_POSITIONS[kind])


def _config(kind: str, tokens: TokenizerInfo) -> dict[str, Any]:
    act = "quick_gelu" if kind == "clip" else "gelu_pytorch_tanh"
    eps = 1e-5 if kind == "clip" else 1e-6
    tower = dict(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        hidden_act=act,
        layer_norm_eps=eps,
    )
    text = {
        **tower,
        "vocab_size": tokens.vocab_size,
        "max_position_embeddings": TEXT_POSITIONS[kind],
        "pad_token_id": tokens.pad_token_id,
    }
    vision = {**tower, "image_size": IMAGE, "patch_size": PATCH, "num_channels": 3}
    if kind == "clip":
        text.update(bos_token_id=tokens.bos_token_id, eos_token_id=tokens.eos_token_id)
        return {
            "architectures": ["CLIPModel"],
            "model_type": "clip",
            "projection_dim": PROJECTION,
            "logit_scale_init_value": 2.6592,
            "text_config": {**text, "model_type": "clip_text_model"},
            "vision_config": {**vision, "model_type": "clip_vision_model"},
            "torch_dtype": "float32",
        }
    text.update(eos_token_id=tokens.eos_token_id, bos_token_id=None, projection_size=HIDDEN)
    return {
        "architectures": ["SiglipModel"],
        "model_type": "siglip",
        "text_config": {**text, "model_type": "siglip_text_model"},
        "vision_config": {**vision, "model_type": "siglip_vision_model", "vision_use_head": True},
        "torch_dtype": "float32",
    }


def _tensors(kind: str, vocab: int, seed: int) -> dict[str, np.ndarray]:
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

    def encoder(prefix: str) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for i in range(LAYERS):
            p = f"{prefix}.encoder.layers.{i}."
            for proj in ("q", "k", "v", "out"):
                out.update(linear(f"{p}self_attn.{proj}_proj", HIDDEN, HIDDEN))
            out.update(norm(f"{p}layer_norm1") | norm(f"{p}layer_norm2"))
            out.update(linear(f"{p}mlp.fc1", INTERMEDIATE, HIDDEN) | linear(f"{p}mlp.fc2", HIDDEN, INTERMEDIATE))
        return out

    grid = (IMAGE // PATCH) ** 2
    v, t = "vision_model", "text_model"
    out = {
        f"{t}.embeddings.token_embedding.weight": normal(vocab, HIDDEN),
        f"{t}.embeddings.position_embedding.weight": normal(TEXT_POSITIONS[kind], HIDDEN),
        **encoder(t),
        **norm(f"{t}.final_layer_norm"),
        f"{v}.embeddings.patch_embedding.weight": normal(HIDDEN, 3, PATCH, PATCH, scale=0.05),
        **encoder(v),
        **norm(f"{v}.post_layernorm"),
    }
    if kind == "clip":
        out.update(
            {
                f"{v}.embeddings.class_embedding": normal(HIDDEN),
                f"{v}.embeddings.position_embedding.weight": normal(grid + 1, HIDDEN),
                **norm(f"{v}.pre_layrnorm"),
                "visual_projection.weight": normal(PROJECTION, HIDDEN),
                "text_projection.weight": normal(PROJECTION, HIDDEN),
                "logit_scale": np.array(2.6592, dtype=np.float32),
            }
        )
        return out
    h = f"{v}.head"
    out.update(
        {
            f"{v}.embeddings.patch_embedding.bias": normal(HIDDEN),
            f"{v}.embeddings.position_embedding.weight": normal(grid, HIDDEN),
            f"{h}.probe": normal(1, 1, HIDDEN),
            f"{h}.attention.in_proj_weight": normal(3 * HIDDEN, HIDDEN),
            f"{h}.attention.in_proj_bias": normal(3 * HIDDEN),
            **linear(f"{h}.attention.out_proj", HIDDEN, HIDDEN),
            **norm(f"{h}.layernorm"),
            **linear(f"{h}.mlp.fc1", INTERMEDIATE, HIDDEN),
            **linear(f"{h}.mlp.fc2", HIDDEN, INTERMEDIATE),
            **linear(f"{t}.head", HIDDEN, HIDDEN),
            "logit_scale": normal(1),
            "logit_bias": normal(1),
        }
    )
    return out


def preprocessor_config(kind: str) -> dict[str, Any]:
    from vllm_srun.adapters.media.preprocess import CLIP_MEAN, CLIP_STD, HALF

    common = {"do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True}
    if kind == "clip":
        return {
            "image_processor_type": "CLIPImageProcessor",
            **common,
            "size": {"shortest_edge": IMAGE},
            "do_center_crop": True,
            "crop_size": {"height": IMAGE, "width": IMAGE},
            "image_mean": list(CLIP_MEAN),
            "image_std": list(CLIP_STD),
            "do_convert_rgb": True,
        }
    return {
        "image_processor_type": "SiglipImageProcessor",
        **common,
        "size": {"height": IMAGE, "width": IMAGE},
        "image_mean": list(HALF),
        "image_std": list(HALF),
        "do_convert_rgb": True,
    }


def golden_requests(seed: int) -> list[dict[str, Any]]:
    from vllm_srun.adapters.media.samples import image_url, video_url

    def image(url: str) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": url}}

    def video(url: str) -> dict[str, Any]:
        return {"type": "video_url", "video_url": {"url": url}}

    mixed = [
        {"type": "text", "text": "a photo of a red square"},
        image(image_url(seed, 48, 40)),
        video(video_url(seed, 6)),
        "blue sky",
    ]
    return [
        {"surface": "embeddings", "body": {"input": mixed}},
        {"surface": "embeddings", "body": {"input": ["a small cat", "the sea at night"], "dimensions": 8}},
        {
            "surface": "embeddings",
            "body": {"input": [image(image_url(seed + 1, 30, 50, fmt="JPEG", orientation=6))], "dimensions": 8},
        },
        {"surface": "embeddings", "body": {"input": [video(video_url(seed + 2, 5))], "options": {"frames": 2}}},
    ]


def write_multimodal_fixture(out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
    from safetensors.numpy import save_file

    kind = variant or "clip"
    if kind not in VARIANTS:
        raise ValueError(f"multimodal fixtures come in variants {', '.join(VARIANTS)} (got {variant!r})")
    out = Path(out)
    tokens = write_tokenizer(out, kind)
    _write_json(out / "config.json", _config(kind, tokens))
    save_file(_tensors(kind, tokens.vocab_size, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "preprocessor_config.json", preprocessor_config(kind))
    write_manifest(
        out,
        {
            "family": "multimodal",
            "surfaces": ["embeddings"],
            "modalities": ["text", "image", "video"],
            "dtype": "float32",
            "video_frames": VIDEO_FRAMES,
            "fixture": {"variant": kind, "seed": seed},
        },
    )
    return golden_requests(seed)
