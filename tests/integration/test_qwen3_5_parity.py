"""Our Qwen3.5 text backbone (R-PKG-2) equals `transformers`' `Qwen3_5ForCausalLM` and the text part
of `Qwen3_5ForConditionalGeneration` on tiny random models: logits within 1e-4 (FP32) at every
real position of every row, run alone and laid back to back with rows of other lengths; and a
row's bits beside other rows are its bits alone where the work is per row (module doc of
`models/gated_delta.py`)."""

from __future__ import annotations

import itertools

import pytest
import torch
import transformers

from vllm_srun.adapters.models.gated_delta import Segments, causal_conv, chunk_gated_delta, l2norm
from vllm_srun.adapters.models.qwen3_5 import Qwen35LM

TOL = 1e-4
TEXT = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    max_position_embeddings=512,
)
VISION = dict(
    depth=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=32,
    out_hidden_size=48,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
)
MROPE = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}
CASES = {
    "text-tied": dict(tie_word_embeddings=True),
    "text-untied-bias": dict(  # full attention first, MHA, one value head per key head, half the head turning
        attention_bias=True,
        num_key_value_heads=4,
        linear_num_value_heads=2,
        linear_conv_kernel_dim=3,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
    ),
    "multimodal-tied": dict(rope_parameters=MROPE, mrope_interleaved=True),
}
LENGTHS = [1, 5, 63, 64, 65, 130, 7, 2]


def _reference(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    extra = dict(CASES[kind])
    if kind.startswith("multimodal"):
        extra.pop("mrope_interleaved")
        text = {**TEXT, **extra}
        config = transformers.Qwen3_5Config(
            text_config=text,
            vision_config=VISION,
            tie_word_embeddings=True,
            image_token_id=93,
            video_token_id=94,
            vision_start_token_id=95,
            vision_end_token_id=96,
        )
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**{**TEXT, **extra}))
    with torch.no_grad():  # zero norms, unit dt_bias and zero biases would hide mistakes: disturb everything
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    ref = _reference(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return ref, Qwen35LM.from_pretrained(folder)


def _rows(lengths: list[int], vocab: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 4, (n,), generator=gen).tolist() for n in lengths]  # no image tokens


def _reference_logits(ref, row: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(input_ids=torch.tensor([row])).logits[0]


def _packed_logits(ours: Qwen35LM, rows: list[list[int]]) -> list[torch.Tensor]:
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r))
    logits = ours.head_logits(ours.hidden_states([t for r in rows for t in r], cu))
    return [logits[a:b] for a, b in itertools.pairwise(cu)]


def test_logits_at_every_position_of_each_row_alone(pair):
    ref, ours = pair
    for row in _rows([1, 3, 64, 97], TEXT["vocab_size"]):
        got = _packed_logits(ours, [row])[0]
        torch.testing.assert_close(got, _reference_logits(ref, row), atol=TOL, rtol=0)


def test_logits_at_every_position_in_a_mixed_packed_forward(pair):
    ref, ours = pair
    rows = _rows(LENGTHS, TEXT["vocab_size"], seed=2)
    for row, got in zip(rows, _packed_logits(ours, rows), strict=True):
        torch.testing.assert_close(got, _reference_logits(ref, row), atol=TOL, rtol=0)


def test_padded_batch_api_matches_the_reference_padded_batch(pair):
    """`logits_at` / `forward` over right-padded rows (the `DecoderLM` API) against transformers
    run on the same padded batch with its attention mask."""
    ref, ours = pair
    lengths = [13, 5, 70, 1]
    rows = _rows(lengths, TEXT["vocab_size"], seed=3)
    ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
    index = torch.arange(len(rows))
    for t in (0, 4, 12, 69):
        positions = torch.clamp(mask.sum(1) - 1, max=t)
        torch.testing.assert_close(ours.logits_at(ids, mask, positions), expected[index, positions], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.logits_at(ids, mask), expected[index, mask.sum(1) - 1], atol=TOL, rtol=0)
    hidden = ours(ids, mask)
    real = mask.bool()
    assert hidden.shape == (*ids.shape, TEXT["hidden_size"]) and not hidden[~real].any()


def test_the_weights_read_are_the_text_models(pair):
    ref, ours = pair
    names = {k for k, _ in ours.named_parameters()}
    assert not any("visual" in n or "mtp" in n for n in names)
    assert (ours.lm_head is None) is bool(ref.config.tie_word_embeddings)
    assert ours.config.num_layers == 4 and ours.dtype == torch.float32


# ---- bits: a row beside others ---------------------------------------------------------------


def _mixer_inputs(lengths: list[int], heads: int = 4, dk: int = 8, dv: int = 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    q = l2norm(torch.randn(n, heads, dk, generator=gen)) * dk**-0.5
    k = l2norm(torch.randn(n, heads, dk, generator=gen))
    v = torch.randn(n, heads, dv, generator=gen)
    g = -torch.rand(n, heads, generator=gen) * 2
    beta = torch.rand(n, heads, generator=gen)
    return q, k, v, g, beta


def test_conv_and_delta_rule_of_a_row_beside_others_are_its_bits_alone():
    """No state crosses a row's start: the convolution and the recurrence of each row, laid
    beside rows of other lengths (its chunks at other places, scan steps shared), give the bits
    of that row run alone, outputs and final states."""
    lengths = [13, 40, 77, 13, 130, 25, 1, 64]
    seg = Segments.of(lengths)
    q, k, v, g, beta = _mixer_inputs(lengths)
    x = torch.randn(seg.tokens, 80, generator=torch.Generator().manual_seed(1))
    weight = torch.randn(80, 4, generator=torch.Generator().manual_seed(2))
    tails = torch.randn(len(lengths), 3, 80, generator=torch.Generator().manual_seed(3))
    init = torch.randn(len(lengths), 4, 8, 12, generator=torch.Generator().manual_seed(4))
    out, state = chunk_gated_delta(q, k, v, g, beta, seg, init)
    conv, tail = causal_conv(x, weight, seg, tails)
    start = 0
    for i, n in enumerate(lengths):
        at = slice(start, start + n)
        start += n
        alone = Segments.of([n])
        o1, s1 = chunk_gated_delta(q[at], k[at], v[at], g[at], beta[at], alone, init[i : i + 1])
        c1, t1 = causal_conv(x[at], weight, alone, tails[i : i + 1])
        assert torch.equal(o1, out[at]) and torch.equal(s1[0], state[i]), n
        assert torch.equal(c1, conv[at]) and torch.equal(t1[0], tail[i]), n


def test_a_row_beside_others_equals_itself_alone(pair):
    """The whole model: a row's hidden states beside other rows equal its own run within 5e-6
    (rows of 12 tokens or more) and 5e-5 (shorter ones), on values up to about 5. Not bit for
    bit: every mixer is per row (above), but torch's CPU kernels are not: elementwise
    transcendental ops (sigmoid, exp, SiLU) compute a tensor's last few elements on a scalar path
    that rounds differently from the vector lanes, so where a row's tokens fall in the forward
    moves its last bits (seen: up to 2e-6 after 4 layers), and MKL's matrix products take another
    path for fewer than 12 rows, so a short row run alone differs more (seen: 1.5e-5)."""
    _, ours = pair
    rows = _rows([13, 40, 77, 13, 130, 25, 3], TEXT["vocab_size"], seed=4)
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r))
    together = ours.hidden_states([t for r in rows for t in r], cu)
    for r, a, b in zip(rows, cu, cu[1:], strict=False):
        tol = 5e-6 if len(r) >= 12 else 5e-5
        torch.testing.assert_close(together[a:b], ours.hidden_states(r, [0, len(r)]), atol=tol, rtol=0)


def test_chunked_rule_equals_the_token_by_token_rule():
    from vllm_srun.adapters.models.gated_delta import recurrent_gated_delta

    lengths = [1, 70, 129]
    seg = Segments.of(lengths)
    q, k, v, g, beta = _mixer_inputs(lengths, seed=5)
    init = torch.randn(3, 4, 8, 12, generator=torch.Generator().manual_seed(6))
    out, state = chunk_gated_delta(q, k, v, g, beta, seg, init)
    start = 0
    for i, n in enumerate(lengths):
        at = slice(start, start + n)
        start += n
        o1, s1 = recurrent_gated_delta(q[at], k[at], v[at], g[at], beta[at], init[i])
        torch.testing.assert_close(out[at], o1, atol=1e-5, rtol=0)
        torch.testing.assert_close(state[i], s1, atol=1e-5, rtol=0)


def test_bf16_where_asked(pair, tmp_path):
    """BF16 weights and activations (the published precision on a GPU; `--dtype bfloat16`):
    our forward follows transformers' at BF16 as closely as BF16 rounding allows, and the
    delta rule keeps FP32 inside."""
    ref, _ = pair
    ref.save_pretrained(tmp_path)
    ours = Qwen35LM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    rows = _rows([9, 70], TEXT["vocab_size"], seed=6)
    for row, got in zip(rows, _packed_logits(ours, rows), strict=True):
        assert got.dtype == torch.bfloat16
        exact = _reference_logits(ref, row)
        with torch.no_grad():
            rounded = ref.to(torch.bfloat16)(input_ids=torch.tensor([row])).logits[0].float()
        ref.float()
        ours_err = (got.float() - exact).abs().max().item()
        ref_err = (rounded - exact).abs().max().item()
        assert ours_err <= 2 * ref_err + 0.05, (ours_err, ref_err)


def test_weights_that_do_not_fit_are_refused(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    ref = _reference("text-untied-bias")
    ref.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["num_hidden_layers"], raw["layer_types"] = 5, [*raw["layer_types"], "linear_attention"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="missing"):
        Qwen35LM.from_pretrained(tmp_path)
    raw["num_hidden_layers"], raw["layer_types"] = 4, raw["layer_types"][:4]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="without lm_head"):
        Qwen35LM.from_pretrained(tmp_path)


def test_packed_inputs_are_checked(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="cu_seqlens"):
        ours.hidden_states([1, 2, 3], [0, 2, 2, 3])
    with pytest.raises(ValueError, match="token ids"):
        ours.hidden_states([1, 2, 3], [0, 4])
    with pytest.raises(ValueError, match="positions"):
        ours.logits_at(torch.ones(2, 3, dtype=torch.long), positions=torch.tensor([0, 3]))
