"""Convert a llama.cpp GGUF file into a Hugging Face folder our decoder reads (R-PKG-4).

Uses the `gguf` package (reader + dequantisation) and numpy only. Writes `config.json`,
`model.safetensors` (FP32), `tokenizer.json` (built with `tokenizers` from the GGUF vocabulary)
and `tokenizer_config.json` (chat template, special tokens). Architectures: llama (SmolLM),
qwen2, qwen3. llama.cpp stores Llama's Q/K rows permuted for its rotary layout; that is undone.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

Progress = Callable[[str], None]

_ARCHES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_CONTROL, _USER_DEFINED = 3, 4
# Pre-tokenizer split patterns for `tokenizer.ggml.pre` values that do not use GPT-2's own.
_SPLITS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def _quiet(_: str) -> None:
    pass


def convert_gguf_to_hf(gguf_path: str | Path, out_dir: str | Path, progress: Progress = _quiet) -> Path:
    """Write a Hugging Face folder for GGUF_PATH into OUT_DIR (created if needed); returns OUT_DIR."""
    import gguf

    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(gguf_path))
    meta = _Meta(reader)
    arch = meta.get("general.architecture")
    if arch not in _ARCHES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (known: {sorted(_ARCHES)})")
    tokens = meta.get("tokenizer.ggml.tokens")
    config = _config(meta, arch, tokens)
    tensors = _tensors(reader, config, arch, progress)
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    from safetensors.numpy import save_file

    _atomic(out / "model.safetensors", lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    _atomic_text(out / "config.json", json.dumps(config, indent=2, sort_keys=True))
    tokenizer = _tokenizer(meta, tokens)
    _atomic(out / "tokenizer.json", lambda p: tokenizer.save(str(p)))
    _atomic_text(out / "tokenizer_config.json", json.dumps(_tokenizer_config(meta, tokens, config), indent=2))
    progress(f"convert: wrote {out} in {time.perf_counter() - started:.1f}s")
    return out


class _Meta:
    """GGUF key/value fields, read lazily."""

    def __init__(self, reader) -> None:
        self._fields = reader.fields

    def get(self, key: str, default=None):
        field = self._fields.get(key)
        if field is None:
            return default
        return field.contents()


def _config(meta: _Meta, arch: str, tokens: list[str]) -> dict:
    def key(name: str, default=None):
        return meta.get(f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden // heads))
    eps = float(str(np.float32(key("attention.layer_norm_rms_epsilon", 1e-6))))
    theta = float(str(np.float32(key("rope.freq_base", 10000.0))))
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ValueError(f"GGUF rope scaling {meta.get(f'{arch}.rope.scaling.type')!r} is not supported")
    config = {
        "architectures": [_ARCHES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "rope_scaling": None,
        "max_position_embeddings": int(key("context_length", 2048)),
        "vocab_size": int(key("vocab_size", len(tokens))),
        "torch_dtype": "float32",
    }
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    for name, field in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = meta.get(f"tokenizer.ggml.{field}_token_id")
        if value is not None:
            config[name] = int(value)
    return config


def _hf_name(name: str) -> str | None:
    base, _, suffix = name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        hf = _LAYER_NAMES.get(part)
        return None if hf is None else f"model.layers.{layer}.{hf}.{suffix}"
    hf = _TOP_NAMES.get(base)
    return None if hf is None else f"{hf}.{suffix}"


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of each head's rotary halves in Q/K rows (weights or biases)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(reader, config: dict, arch: str, progress: Progress) -> dict[str, np.ndarray]:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}
    total = len(reader.tensors)
    step = max(1, -(-total // 10))
    out: dict[str, np.ndarray] = {}
    for i, t in enumerate(reader.tensors, 1):
        name = _hf_name(t.name)
        if name is None:
            raise ValueError(f"GGUF tensor {t.name!r} has no place in a {arch} model")
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        data = np.asarray(t.data) if t.tensor_type in plain else dequantize(t.data, t.tensor_type)
        w = np.ascontiguousarray(data.reshape(shape), dtype=np.float32)
        if arch == "llama" and ".self_attn.q_proj." in name:
            w = _unpermute(w, config["num_attention_heads"])
        elif arch == "llama" and ".self_attn.k_proj." in name:
            w = _unpermute(w, config["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w)
        if i % step == 0 or i == total:
            progress(f"convert: {i}/{total} tensors ({i * 100 // total}%)")
    return out


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in keep]
    mapping = {b: chr(b) for b in keep}
    mapping.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return mapping


def _tokenizer(meta: _Meta, tokens: list[str]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    spell = _byte_alphabet()
    alphabet = set(spell.values())
    vocab: dict[str, int] = {}
    for i, piece in enumerate(tokens):
        text = piece if set(piece) <= alphabet else "".join(spell[b] for b in piece.encode("utf-8"))
        vocab.setdefault(text, i)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level: pre_tokenizers.PreTokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    split = _SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is not None:
        byte_level = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types)
            if ty == _CONTROL and set(t) <= alphabet
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types)
            if ty == _USER_DEFINED and t in vocab
        ]
    )
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        name = tokens[int(bos)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{name} $A", pair=f"{name} $A {name} $B", special_tokens=[(name, int(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _tokenizer_config(meta: _Meta, tokens: list[str], config: dict) -> dict:
    def named(field: str):
        value = meta.get(f"tokenizer.ggml.{field}_token_id")
        return None if value is None else tokens[int(value)]

    out = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": named("bos"),
        "eos_token": named("eos"),
        "unk_token": named("unknown"),
        "pad_token": named("padding"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        out["chat_template"] = template
    return out


def _atomic(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _atomic_text(path: Path, text: str) -> None:
    _atomic(path, lambda p: p.write_text(text + "\n", encoding="utf-8"))
