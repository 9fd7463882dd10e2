"""The Qwen3.5 backbone's C++ kernels and layer stack on a CPU (engines/cpu_hybrid.py,
csrc/gated_delta.cpp, csrc/qwen3_5_layers.cpp): the stack gives the Python layer loop's bits on the
same kernels, rows alone and packed, unshared, for a shared state and for its branches; the kernels
answer like transformers at every position (1e-4) and like the exact rule in FP64, a row's kernel
outputs beside other rows being its bits alone; what they do not run goes to torch's kernels; bad
weights and inputs are refused in one line; the engines' cards say what runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.test_qwen3_5_parity import CASES, LENGTHS, TOL, _packed_logits, _reference, _reference_logits
from tests.integration.test_qwen3_5_parity import TEXT as REFERENCE_TEXT
from tests.integration.test_qwen3_5_parity import _rows as reference_rows
from vllm_srun.adapters.devices.torch_devices import CpuDevice
from vllm_srun.adapters.engines import cpp_ops
from vllm_srun.adapters.engines.cpu_hybrid import NO_TENSOR, CppHybridKernels
from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, hybrid_kernels, load_varlen_attention
from vllm_srun.adapters.engines.native import native_encoder
from vllm_srun.adapters.engines.native_decoder import native_decoder
from vllm_srun.adapters.families.fixtures.encoder_fixture import write_arch_package
from vllm_srun.adapters.models.gated_delta import Segments, causal_conv, chunk_gated_delta, l2norm
from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config
from vllm_srun.adapters.models.qwen3_5_kernels import TORCH_KERNELS, MixerShape
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.unpadded import EAGER_OPS

pytestmark = pytest.mark.skipif(cpp_ops.compiler(os.environ) is None, reason="no C++ compiler here")

TEXT = {"model_type": "qwen3_5_text", **REFERENCE_TEXT}
MODELS = {
    # grouped heads (two value heads a key head), key and value heads of 8 and 12, a quarter turning
    "grouped": {},
    # full attention first, MHA with biases, one value head a key head of 16, a kernel of 3, half turning
    "full-first": dict(
        attention_bias=True,
        num_key_value_heads=4,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=3,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
    ),
}
LOOP, STACK = CppHybridKernels(stack=False), CppHybridKernels()


@pytest.fixture(scope="module", autouse=True)
def loaded() -> None:
    why = load_varlen_attention(lambda _m: None)
    assert why is None, why  # a compiler is here: a failed build is a failure, not a skip


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> Qwen35LM:
    return Qwen35LM.random(Qwen35Config.from_dict({**TEXT, **MODELS[request.param]}), seed=3, std=0.1)


def _rows(lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TEXT["vocab_size"], (n,), generator=gen).tolist() for n in lengths]


def _hidden(lm: Qwen35LM, rows: list[list[int]], kernels: Any) -> torch.Tensor:
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r))
    return lm.hidden_states([t for r in rows for t in r], cu, kernels)


def _equal_states(a: Any, b: Any) -> None:
    for x, y in zip(a.layers, b.layers, strict=True):
        for name in ("tail", "recurrent", "keys", "values"):
            first, second = getattr(x, name), getattr(y, name)
            assert (first is None) == (second is None), name
            if first is not None:
                assert torch.equal(first, second), name


def test_the_stack_gives_the_loop_bits_alone_and_packed(model: Qwen35LM) -> None:
    rows = _rows(LENGTHS)
    assert STACK.weights(model) is not None  # the stack runs this model (else both would be the loop)
    assert torch.equal(_hidden(model, rows, STACK), _hidden(model, rows, LOOP))
    for row in rows:
        assert torch.equal(_hidden(model, [row], STACK), _hidden(model, [row], LOOP))
    assert not torch.equal(_hidden(model, rows, STACK), _hidden(model, rows, TORCH_KERNELS))  # other kernels


def test_the_stack_gives_the_loop_bits_of_a_shared_state_and_its_branches(model: Qwen35LM) -> None:
    state, *questions = _rows([37, 1, 5, 11, 2, 9])
    try:
        model.kernels = LOOP
        by_loop = model.prefix_kv(state)
        loop_logits = model.branch_logits(by_loop, questions)
        model.kernels = STACK
        by_stack = model.prefix_kv(state)
        _equal_states(by_loop, by_stack)
        assert torch.equal(model.branch_logits(by_stack, questions), loop_logits)
        assert torch.equal(model.branch_logits(by_loop, questions), loop_logits)
        unshared = model.packed_logits([state + q for q in questions])
        assert (unshared - loop_logits).abs().max() < TOL  # shared answers equal unshared ones (R-SC-1)
    finally:
        model.kernels = TORCH_KERNELS


@pytest.fixture(scope="module", params=sorted(CASES))
def reference_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Qwen35LM]:
    ref = _reference(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    ours = Qwen35LM.from_pretrained(folder)
    ours.kernels = STACK
    return ref, ours


def test_the_stack_matches_transformers_at_every_position(reference_pair: tuple[Any, Qwen35LM]) -> None:
    ref, ours = reference_pair
    rows = reference_rows(LENGTHS, REFERENCE_TEXT["vocab_size"], seed=2)
    for row, got in zip(rows, _packed_logits(ours, rows), strict=True):
        torch.testing.assert_close(got, _reference_logits(ref, row), atol=TOL, rtol=0)


def _mixer_inputs(lengths: list[int], shape: MixerShape, kernel: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hk, hv, dk, dv = shape.key_heads, shape.value_heads, shape.key_dim, shape.value_dim
    n, channels = sum(lengths), 2 * hk * dk + hv * dv
    return {
        "x": torch.randn(n, channels, generator=gen),
        "weight": 0.3 * torch.randn(channels, kernel, generator=gen),
        "tail": torch.randn(1, kernel - 1, channels, generator=gen),
        "g": -2 * torch.rand(n, hv, generator=gen),
        "beta": torch.rand(n, hv, generator=gen),
        "initial": 0.5 * torch.randn(1, hv, dk, dv, generator=gen),
    }


def _exact_rule(mixed: torch.Tensor, t: dict[str, torch.Tensor], seg: Segments, shape: MixerShape) -> Any:
    hk, hv, dk, dv = shape.key_heads, shape.value_heads, shape.key_dim, shape.value_dim
    n = mixed.shape[0]
    q, k, v = torch.split(mixed.double(), [hk * dk, hk * dk, hv * dv], dim=-1)
    q = q.reshape(n, hk, dk).repeat_interleave(hv // hk, 1)
    k = k.reshape(n, hk, dk).repeat_interleave(hv // hk, 1)
    initial = t["initial"].double()
    return chunk_gated_delta(l2norm(q) * dk**-0.5, l2norm(k), v.reshape(n, hv, dv), t["g"].double(),
                             t["beta"].double(), seg, initial)  # fmt: skip


@pytest.mark.parametrize("shape", [MixerShape(2, 4, 8, 12), MixerShape(3, 3, 64, 40), MixerShape(1, 2, 20, 33)])
def test_the_kernels_equal_the_exact_rule_and_a_row_beside_others_is_its_bits_alone(shape: MixerShape) -> None:
    lengths = [1, 5, 63, 64, 65, 130, 7, 2]
    t = _mixer_inputs(lengths, shape, kernel=4, seed=sum(lengths) + shape.value_dim)
    seg = Segments.of(lengths)
    mixed, tails = STACK.conv(t["x"], t["weight"], seg, t["tail"])
    exact, exact_tails = causal_conv(t["x"].double(), t["weight"].double(), seg, t["tail"].double())
    assert (mixed.double() - exact).abs().max() < 1e-5 and torch.equal(tails.double(), exact_tails)
    out, state = STACK.rule(mixed, t["g"], t["beta"], seg, t["initial"], shape, True)
    exact_out, exact_state = _exact_rule(mixed, t, seg, shape)
    assert (out.double() - exact_out).abs().max() < 1e-5 and (state.double() - exact_state).abs().max() < 1e-5
    assert STACK.rule(mixed, t["g"], t["beta"], seg, t["initial"], shape, False)[1] is None  # nothing kept
    at = 0
    for i, n in enumerate(lengths):  # each row run alone: the same bits
        part = slice(at, at + n)
        alone = Segments.of([n])
        own_mixed, own_tail = STACK.conv(t["x"][part], t["weight"], alone, t["tail"])
        assert torch.equal(own_mixed, mixed[part]) and torch.equal(own_tail[0], tails[i])
        own_out, own_state = STACK.rule(mixed[part], t["g"][part], t["beta"][part], alone, t["initial"], shape, True)
        assert torch.equal(own_out, out[part]) and torch.equal(own_state[0], state[i])
        at += n


def test_what_the_kernels_do_not_run_goes_to_torch(model: Qwen35LM) -> None:
    shape = MixerShape(2, 4, 8, 12)
    t = {k: v.bfloat16() for k, v in _mixer_inputs([3, 9], shape, 4, 0).items()}
    seg = Segments.of([3, 9])
    for got, want in (
        (STACK.conv(t["x"], t["weight"], seg, None), TORCH_KERNELS.conv(t["x"], t["weight"], seg, None)),
        (
            STACK.rule(t["x"], t["g"], t["beta"], seg, None, shape, True),
            TORCH_KERNELS.rule(t["x"], t["g"], t["beta"], seg, None, shape, True),
        ),
    ):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    rows = _rows([4, 6])
    half = Qwen35LM.random(model.config, seed=3, std=0.1, dtype=torch.bfloat16)
    assert STACK.weights(half) is None  # not FP32: the loop, on torch's kernels
    assert torch.equal(_hidden(half, rows, STACK), _hidden(half, rows, TORCH_KERNELS))
    state = model.prefix_kv(rows[0])
    x = model.model.embed_tokens(torch.tensor(rows[1]))
    rope = model.rotary(torch.arange(6) + 4)
    try:
        model.split_attention = False  # the state's keys copied per row: the loop runs the branches
        assert STACK.layers(model, x, Segments.of([6]), rope, state.layers, False) is None
    finally:
        model.split_attention = True
    assert STACK.layers(model, x, Segments.of([6]), rope, state.layers, False) is not None
    kernels, why = hybrid_kernels(torch.bfloat16, lambda _m: None)
    assert kernels is TORCH_KERNELS and why is not None and "FP32" in why
    kernels, why = hybrid_kernels(torch.float32, lambda _m: None, {"VLLM_SRUN_CPU_ATTENTION": "0"})
    assert kernels is TORCH_KERNELS and why == "turned off (VLLM_SRUN_CPU_ATTENTION=0)"


def test_bad_weights_and_inputs_are_refused_in_one_line(model: Qwen35LM) -> None:
    layer = [torch.ones(4)] * 16
    final = torch.ones(4)
    shape = [4, 2, 16, 2, 4, 8, 12]
    with pytest.raises(RuntimeError, match="16 tensors a layer, got 15 for 1 layers"):
        torch.classes.srun_cpu.Qwen35Weights(layer[:15], [0], shape, 1e-6, final)
    with pytest.raises(RuntimeError, match=r"a layer is 0 \(linear\) or 1 \(full attention\)"):
        torch.classes.srun_cpu.Qwen35Weights(layer, [2], shape, 1e-6, final)
    with pytest.raises(RuntimeError, match="kv_heads must divide heads"):
        torch.classes.srun_cpu.Qwen35Weights(layer, [0], [4, 3, 16, 2, 4, 8, 12], 1e-6, final)
    with pytest.raises(RuntimeError, match="float32 tensors only"):
        torch.classes.srun_cpu.Qwen35Weights([t.double() for t in layer], [0], shape, 1e-6, final)
    weights = STACK.weights(model)
    x = torch.zeros(5, model.config.hidden_size)
    cos = sin = torch.zeros(5, 1, model.config.rotary_dim)
    with pytest.raises(RuntimeError, match="the rows' lengths add up to 4, not to 5"):
        torch.ops.srun_cpu.qwen3_5_layers(weights, x, [2, 2], cos, sin, [], False)
    with pytest.raises(RuntimeError, match=r"cos and sin are \[N, 1, rotary dims\]"):
        torch.ops.srun_cpu.qwen3_5_layers(weights, x, [5], cos[:4], sin[:4], [], False)
    with pytest.raises(RuntimeError, match="a prefix holds two tensors a layer"):
        torch.ops.srun_cpu.qwen3_5_layers(weights, x, [5], cos, sin, [x], False)
    mixed = torch.zeros(5, 2 * 2 * 8 + 4 * 12)
    with pytest.raises(RuntimeError, match="every row needs at least one token"):
        torch.ops.srun_cpu.causal_conv(mixed, torch.zeros(mixed.shape[1], 4), [5, 0], NO_TENSOR)
    with pytest.raises(RuntimeError, match="the tail has the wrong shape"):
        torch.ops.srun_cpu.causal_conv(mixed, torch.zeros(mixed.shape[1], 4), [5], torch.zeros(1, 2, mixed.shape[1]))
    g = beta = torch.zeros(5, 4)
    with pytest.raises(RuntimeError, match="key heads must divide value heads"):
        torch.ops.srun_cpu.gated_delta_rule(mixed, g, beta, [5], NO_TENSOR, 3, 4, 8, 12, False)
    with pytest.raises(RuntimeError, match=r"the initial state holds one entry or one a row"):
        torch.ops.srun_cpu.gated_delta_rule(mixed, g, beta, [2, 3], torch.zeros(3, 4, 8, 12), 2, 4, 8, 12, False)


def test_the_engines_cards_say_what_runs(model: Qwen35LM, tmp_path: Path) -> None:
    engine = native_decoder(model, CpuDevice(), lambda _m: None, {})
    try:
        kernels = engine.describe()["kernels"]
        assert model.kernels.name == "cpp" and kernels == {
            "attention": "torch sdpa per group of rows of one length",
            "linear": "eager",
            **CppHybridKernels().card(),
        }
    finally:
        model.kernels = TORCH_KERNELS
    assert EAGER_OPS.hybrid_kernels() is None and isinstance(VarlenOps().hybrid_kernels(), CppHybridKernels)
    write_arch_package(tmp_path, "qwen3_5", "embed", 5)
    encoder = native_encoder(ReferenceEncoder.from_folder(tmp_path), CpuDevice(), lambda _m: None, env={})
    card = encoder.describe()["kernels"]
    assert card["layers"] == CppHybridKernels().card()["layers"] and card["delta_rule"].startswith("C++"), card
