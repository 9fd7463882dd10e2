"""Our torch decoder (R-PKG-2) equals the `transformers` reference on tiny random models."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from vllm_srun.adapters.models.decoder import DecoderConfig, DecoderLM, restricted_probs

TINY = dict(
    vocab_size=96,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

CASES = {
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, rope_theta=5000.0)),
    "llama-bias-untied": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "llama-mha": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=6, tie_word_embeddings=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=12, tie_word_embeddings=True)),
}


def _reference(kind: str, seed: int = 0):
    config_name, model_name, extra = CASES[kind]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**{**TINY, **extra})
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # norms at 1 and zero biases would hide mistakes: disturb everything
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    ref = _reference(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return ref, DecoderLM.from_pretrained(folder)


def _padded_batch(lengths: list[int], vocab: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
    return ids, mask


def test_logits_at_every_real_position_match(pair):
    ref, ours = pair
    lengths = [13, 5, 9, 1]
    ids, mask = _padded_batch(lengths, TINY["vocab_size"])
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
    rows = torch.arange(len(lengths))
    for t in range(max(lengths)):
        positions = torch.clamp(mask.sum(1) - 1, max=t)
        got = ours.logits_at(ids, mask, positions)
        assert got.shape == (len(lengths), TINY["vocab_size"])
        torch.testing.assert_close(got, expected[rows, positions], atol=1e-4, rtol=0)


def test_default_position_is_last_real_token(pair):
    ref, ours = pair
    ids, mask = _padded_batch([7, 3, 11], TINY["vocab_size"], seed=2)
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
    last = mask.sum(1) - 1
    torch.testing.assert_close(ours.logits_at(ids, mask), expected[torch.arange(3), last], atol=1e-4, rtol=0)


def test_hidden_states_match_on_real_tokens(pair):
    ref, ours = pair
    ids, mask = _padded_batch([10, 4], TINY["vocab_size"], seed=3)
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    got = ours(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)


def test_a_row_alone_equals_the_row_in_a_padded_batch(pair):
    _, ours = pair
    ids, mask = _padded_batch([12, 6], TINY["vocab_size"], seed=4)
    alone = ours.logits_at(ids[1:, :6])
    torch.testing.assert_close(ours.logits_at(ids, mask)[1:], alone, atol=1e-5, rtol=0)


def test_config_of_saved_models(pair):
    _, ours = pair
    assert ours.config.num_layers == 2 and ours.config.vocab_size == TINY["vocab_size"]
    assert ours.dtype == torch.float32


def _raw(**changes) -> dict:
    raw = dict(TINY, model_type="llama", hidden_act="silu", rope_theta=10000.0)
    raw.update(changes)
    return raw


@pytest.mark.parametrize("scaling", [None, {"rope_type": "default", "rope_theta": 500.0}, {"type": "default"}])
def test_default_rope_is_accepted(scaling):
    config = DecoderConfig.from_dict(_raw(rope_scaling=scaling))
    assert config.rope_theta in (10000.0, 500.0)
    assert DecoderConfig.from_dict(_raw(rope_parameters={"rope_type": "default", "rope_theta": 7.0})).rope_theta == 7.0


@pytest.mark.parametrize(
    "raw",
    [
        _raw(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
        _raw(rope_scaling={"type": "linear", "factor": 2.0}),
        _raw(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
    ],
)
def test_unknown_rope_scaling_is_refused(raw):
    with pytest.raises(ValueError, match="rope scaling type"):
        DecoderConfig.from_dict(raw)


@pytest.mark.parametrize(
    "raw, words",
    [
        (_raw(model_type="gpt2"), "model_type"),
        (_raw(hidden_act="gelu"), "hidden_act"),
        (_raw(model_type="qwen2", use_sliding_window=True, sliding_window=64), "sliding"),
    ],
)
def test_other_layouts_are_refused(raw, words):
    with pytest.raises(ValueError, match=words):
        DecoderConfig.from_dict(raw)


def test_weights_that_do_not_fit_are_refused(tmp_path):
    ref = _reference("llama-tied")
    ref.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="missing"):
        DecoderLM.from_pretrained(tmp_path)


def test_restricted_probs_is_a_softmax_over_the_answer_tokens():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, -1.0, 0.5, 0.0]])
    probs = restricted_probs(logits, [[3, 1], [0, 1, 2]])
    torch.testing.assert_close(probs[0], torch.softmax(torch.tensor([3.0, 1.0]), -1))
    torch.testing.assert_close(probs[1], torch.softmax(torch.tensor([5.0, -1.0, 0.5]), -1))
    assert all(abs(float(p.sum()) - 1.0) < 1e-6 for p in probs)
