"""The tiny Qwen3.5 decision package that reads images and videos (variant `qwen3_5_vision`),
deterministic by seed, written as transformers saves a `Qwen3_5ForConditionalGeneration`.

- `config.json`: `model_type: qwen3_5`, the text model under `text_config` (hidden 64, four layers
  in the order linear, full, linear, full, so the attention modes show; half of each head rotary,
  `mrope_section` [2, 1, 1] interleaved), a two-block vision tower under `vision_config` (width 32,
  patches of 8 pixels over 2 frames, 2 × 2 merge, a 4 × 4 learned position grid), tied embeddings,
  and the ids of `<|image_pad|>`, `<|video_pad|>`, `<|vision_start|>`, `<|vision_end|>`;
- `model.safetensors`: `model.language_model.*` (`qwen3_5_fixture.text_tensors`, the embeddings
  halved and the layers' matrices × 0.7: a random model that amplifies FP32 rounding less) and
  `model.visual.*`, FP32 from numpy's PCG64 generator;
- `preprocessor_config.json` (transformers' Qwen2-VL image processor: 1,024 to 16,384 pixels, mean
  and std ½) and `video_preprocessor_config.json` (its Qwen3-VL video processor: 2 frames a
  second, 4 to 32 of them, 2,048 to 65,536 pixels over all frames);
- the Qwen3.5 byte-level BPE tokenizer (`fixture_tokenizers`) with the four vision tokens added as
  special tokens (the ids above);
- `srun.json`: the decision family, ChatML with an empty thinking block, published BF16.

The golden requests (`golden_requests`) add an image question and a video question, their media
made in code (`media/samples.py`), to the decision fixture's text requests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.families.decision_package import write_decision_package
from vllm_srun.adapters.families.qwen3_5_fixture import ANSWER_WORDS, POSITIONS, text_config, text_tensors

VARIANT = "qwen3_5_vision"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_vision",
    "depth": 2,
    "hidden_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 8,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 16,
    "initializer_range": 0.02,
}
IMAGE_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"shortest_edge": 1024, "longest_edge": 16384},
    "patch_size": 8,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
VIDEO_PROCESSOR: dict[str, Any] = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    "processor_class": "Qwen3VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "do_sample_frames": True,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"shortest_edge": 2048, "longest_edge": 65536},
    "patch_size": 8,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "fps": 2,
    "min_frames": 4,
    "max_frames": 32,
}
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]


def vision_tensors(config: dict[str, Any], out_hidden: int, seed: int) -> dict[str, np.ndarray]:
    """`model.visual.*` for CONFIG: matrices normal(0, 1/√fan-in), LayerNorm weights near 1, biases
    and the position grid small."""
    rng = np.random.default_rng([seed, 7])
    h, inter, depth = config["hidden_size"], config["intermediate_size"], config["depth"]
    c, t, p = config["in_channels"], config["temporal_patch_size"], config["patch_size"]
    merged = h * config["spatial_merge_size"] ** 2

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def small(*shape: int, std: float = 0.05) -> np.ndarray:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm(size: int) -> dict[str, np.ndarray]:
        return {"weight": (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32), "bias": small(size)}

    out: dict[str, np.ndarray] = {
        "patch_embed.proj.weight": (rng.standard_normal((h, c, t, p, p)) / np.sqrt(c * t * p * p)).astype(np.float32),
        "patch_embed.proj.bias": small(h),
        "pos_embed.weight": small(config["num_position_embeddings"], h, std=0.5),
    }
    for i in range(depth):
        b = f"blocks.{i}."
        for name in ("norm1", "norm2"):
            out.update({f"{b}{name}.{k}": v for k, v in norm(h).items()})
        out[b + "attn.qkv.weight"], out[b + "attn.qkv.bias"] = matrix(3 * h, h), small(3 * h)
        out[b + "attn.proj.weight"], out[b + "attn.proj.bias"] = matrix(h, h), small(h)
        out[b + "mlp.linear_fc1.weight"], out[b + "mlp.linear_fc1.bias"] = matrix(inter, h), small(inter)
        out[b + "mlp.linear_fc2.weight"], out[b + "mlp.linear_fc2.bias"] = matrix(h, inter), small(h)
    out.update({f"merger.norm.{k}": v for k, v in norm(h).items()})
    out["merger.linear_fc1.weight"], out["merger.linear_fc1.bias"] = matrix(merged, merged), small(merged)
    out["merger.linear_fc2.weight"] = matrix(out_hidden, merged)
    out["merger.linear_fc2.bias"] = small(out_hidden)
    return {"model.visual." + k: v for k, v in out.items()}


def _add_vision_tokens(out: Path) -> dict[str, int]:
    """Add the vision tokens to OUT's tokenizer as special tokens (tokenizer.json and
    tokenizer_config.json); their ids."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    ids: dict[str, int] = {}
    for token in VISION_TOKENS:
        index = tok.token_to_id(token)
        assert index is not None  # just added
        ids[token] = int(index)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    decoder = config.setdefault("added_tokens_decoder", {})
    for token, index in ids.items():
        decoder[str(index)] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    config["image_token"], config["video_token"] = "<|image_pad|>", "<|video_pad|>"
    config["vision_start_token"], config["vision_end_token"] = "<|vision_start|>", "<|vision_end|>"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return ids


def write_qwen3_5_vision_fixture(out: Path, seed: int, words: Sequence[str]) -> None:
    """Write the package (module doc) into OUT, WORDS whole tokens of its tokenizer."""

    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    out = Path(out)
    info = write_fixture_tokenizer(out, "qwen3_5", [*words, *ANSWER_WORDS, "seconds"], model_max_length=POSITIONS)
    ids = _add_vision_tokens(out)
    vocab = info.vocab_size + len(VISION_TOKENS)
    text = text_config(vocab)
    text.update(
        eos_token_id=info.eos_token_id,
        tie_word_embeddings=True,
        layer_types=LAYER_TYPES,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    vision = {**VISION_CONFIG, "out_hidden_size": text["hidden_size"]}
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": True,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "dtype": "bfloat16",
    }
    tensors = text_tensors(text, seed, prefix="model.language_model.")
    for name, value in tensors.items():  # tamer than the text fixtures': FP32 rounding stays near 1e-5
        if "embed_tokens" in name:
            tensors[name] = value * np.float32(0.5)
        elif value.ndim == 2:
            tensors[name] = value * np.float32(0.7)
    tensors.update(vision_tensors(vision, text["hidden_size"], seed))
    (out / "preprocessor_config.json").write_text(json.dumps(IMAGE_PROCESSOR, indent=2) + "\n", encoding="utf-8")
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PROCESSOR, indent=2) + "\n", encoding="utf-8")
    write_decision_package(
        out,
        config,
        tensors,
        template="chatml-think",
        max_input_tokens=POSITIONS,
        fixture={"variant": VARIANT, "seed": seed},
    )


def golden_requests(text_requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decision fixture's TEXT_REQUESTS, then an image question and a video question."""
    from vllm_srun.adapters.media.samples import image_url, video_url

    return [
        *text_requests,
        {
            "surface": "decisions",
            "body": {
                "state": "the picture of the day",
                "images": [image_url(11, 40, 32)],
                "questions": {
                    "bright": {"type": "noul", "instructions": "is the picture bright"},
                    "tone": {
                        "type": "choice",
                        "instructions": "what is the tone",
                        "criteria": {"positive": "a good picture", "negative": None},
                    },
                },
            },
        },
        {
            "surface": "decisions",
            "body": {
                "state": "a short video of the order",
                "videos": [video_url(5, frames=8, width=48, height=40)],
                "questions": {"late": {"type": "noul", "instructions": "is the order late"}},
            },
        },
    ]
