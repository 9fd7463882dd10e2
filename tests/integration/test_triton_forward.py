"""Whole forwards on the fused Triton kernels (R-DT-3) give the eager forwards' answers: the
unpadded encoder (bias+GELU, residual+LayerNorm, variable-length attention) and the decoder
(residual+RMSNorm, SiLU·mul), every kernel forced on, run by Triton's interpreter on a CPU
(tests/conftest.py) or compiled on a GPU. And the load-time choice (`gpu_kernels.choose`): a kernel
whose answers differ is never used; one is used only at the sizes where it was measured faster."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch

from tests.fakes import FakeDevice
from vllm_srun.adapters.engines import gpu_kernels
from vllm_srun.adapters.engines.gpu_kernels import FORCED, KernelChoice, choose
from vllm_srun.adapters.engines.native import NativeEncoder
from vllm_srun.adapters.engines.native_decoder import NativeDecoder
from vllm_srun.adapters.engines.triton_decoder import GpuDecoderKernels, TritonDecoderOps
from vllm_srun.adapters.engines.triton_encoder import GpuEncoderKernels, fused_ffn_in
from vllm_srun.adapters.models.decoder import DecoderLM
from vllm_srun.adapters.models.encoder_arch import eager_linears
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.adapters.models.unpadded import LayerLinears
from vllm_srun.domain.worker.kernels import SizePlan

triton = pytest.importorskip("triton")
GPU = torch.cuda.is_available()
needs_kernels = pytest.mark.skipif(
    not GPU and not triton.knobs.runtime.interpret, reason="without a GPU, Triton kernels run only interpreted"
)
TEXTS = ["a", "the quick brown fox jumps", "over the lazy dog " * 6, "red", "blue bird", "the quick brown fox jumps"]


def _forced_encoder(reference: ReferenceEncoder) -> GpuEncoderKernels:
    cfg = reference.config
    fused = [
        LayerLinears(b.qkv, b.attn_out, partial(fused_ffn_in, b, cfg.hidden_act), b.ffn_out)
        for b in reference.encoder.blocks
    ]
    forced = [KernelChoice(name, FORCED, 0.0) for name in ("bias_gelu", "add_layer_norm", "varlen_attention")]
    return GpuEncoderKernels(*forced, fused, eager_linears(reference.encoder))


@pytest.mark.triton
@needs_kernels
@pytest.mark.parametrize("variant", ["embed", "classify"])
def test_unpadded_encoder_on_the_fused_kernels_equals_eager(encoder_fixture, variant: str) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture(variant)
    device = "cuda" if GPU else "cpu"
    reference = ReferenceEncoder.from_folder(folder, device=device)
    rows = TextTokenizer.from_folder(folder).encode(TEXTS, max_length=64, truncate=True)
    eager, fused = NativeEncoder(reference), NativeEncoder(reference, gpu=_forced_encoder(reference))
    linears, ops = fused.kernels_for(32)
    assert ops.name == "varlen_attention+add_layer_norm" and linears is fused.gpu.fused_linears  # type: ignore[union-attr]
    for run in ("embed", "classify_logits") if variant == "classify" else ("embed",):
        got, want = getattr(fused, run)(rows), getattr(eager, run)(rows)
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4


@pytest.mark.triton
@needs_kernels
def test_decoder_on_the_fused_kernels_equals_eager(decision_fixture) -> None:  # type: ignore[no-untyped-def]
    device = "cuda" if GPU else "cpu"
    lm = DecoderLM.from_pretrained(decision_fixture("llama"), dtype=torch.float32, device=device)
    ops = TritonDecoderOps(True, True)
    ids = torch.tensor([[5, 9, 13, 2, 7, 0, 0], [3, 4, 5, 6, 7, 8, 9]], device=device)
    positions = torch.tensor([4, 6], device=device)
    want, got = lm.logits_at(ids, positions=positions), lm.logits_at(ids, positions=positions, ops=ops)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    state = lm.prefix_kv([11, 12, 13, 14, 15], ops=ops)
    branches = [[3, 4], [5, 6, 7, 8], [9]]
    shared = lm.branch_logits(state, branches, ops=ops)
    assert torch.allclose(shared, lm.branch_logits(lm.prefix_kv([11, 12, 13, 14, 15]), branches), atol=1e-4, rtol=1e-4)
    forced = GpuDecoderKernels(KernelChoice("add_rms_norm", FORCED, 0.0), KernelChoice("silu_mul", FORCED, 0.0))
    engine = NativeDecoder(lm, forced)
    assert engine.kernel_switch_tokens == 1 << 30 and engine.ops_for(10) is not None
    rows = [[5, 9, 13, 2, 7], [3, 4, 5, 6, 7, 8, 9]]  # the engine pads them as `ids` is
    assert torch.allclose(engine.logits_at(rows), want, atol=1e-4, rtol=1e-4)


# ---- the load-time choice, with fake kernels, a fake device and a fake clock -----------------------
def _fake_kernels() -> tuple[Callable[[], float], Callable]:  # type: ignore[type-arg]
    """A clock that the fake kernels advance by their cost at the current size."""
    now = [0.0]

    def clock() -> float:
        return now[0]

    def case_for(eager_cost: Callable[[int], float], fast_cost: Callable[[int], float], wrong: bool = False):  # type: ignore[no-untyped-def]
        def case(tokens: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
            def eager() -> torch.Tensor:
                now[0] += eager_cost(tokens)
                return torch.ones(4)

            def fast() -> torch.Tensor:
                now[0] += fast_cost(tokens)
                return torch.ones(4) * (1.5 if wrong else 1.0)

            return eager, fast

        return case

    return clock, case_for


def test_a_kernel_that_changes_answers_is_never_used() -> None:
    clock, case_for = _fake_kernels()
    device = FakeDevice(kind="cuda", index=0)
    choice = choose("k", case_for(lambda t: 1.0, lambda t: 0.1, wrong=True), "float32", device, "auto", clock=clock)
    assert not choice.plan.enabled and choice.gap == pytest.approx(0.5) and "differ" in choice.reason
    forced = choose("k", case_for(lambda t: 1.0, lambda t: 0.1, wrong=True), "float32", device, "force", clock=clock)
    assert not forced.plan.enabled  # even VLLM_SRUN_TRITON=1 never runs a kernel that failed its check


def test_a_kernel_serves_exactly_the_sizes_where_it_was_faster() -> None:
    clock, case_for = _fake_kernels()
    device = FakeDevice(kind="cuda", index=0)
    # launch-bound at small sizes (slower), faster from 1,024 tokens, slower again at the largest
    fast = {64: 2.0, 256: 2.0, 1024: 0.5, 4096: 0.5, 16384: 1.5}
    choice = choose("k", case_for(lambda t: 1.0, lambda t: fast[t]), "float32", device, "auto", clock=clock)
    assert [t.tokens for t in choice.timings] == [64, 256, 1024, 4096, 16384]
    assert [choice.plan.use_fast(t) for t in (1, 64, 65, 256, 257, 1024, 4096, 4097, 16384, 20000)] == [
        False, False, False, False, True, True, True, False, False, False,
    ]  # fmt: skip
    assert choice.plan.fast_ranges() == [(257, 4096)] and choice.plan.switch_tokens == 256
    assert len(device.synchronized) >= 4 * 5 * 2  # every timed run waited for the device
    forced = choose("k", case_for(lambda t: 1.0, lambda t: fast[t]), "float32", device, "force", clock=clock)
    assert forced.plan == FORCED and forced.timings == []


def test_triton_is_refused_off_gpus_at_other_dtypes_and_on_meta() -> None:
    why = gpu_kernels.triton_unsupported
    assert "not a GPU" in (why(FakeDevice(kind="cpu"), torch.float32, torch.float32) or "")
    assert "R-DT-2" in (why(FakeDevice(kind="cuda", index=0), torch.bfloat16, torch.float32) or "")
    assert "meta" in (why(FakeDevice(kind="cuda", index=0), torch.float32, torch.float32) or "")
    assert gpu_kernels.mode({"VLLM_SRUN_TRITON": "0"}) == "off" and gpu_kernels.mode({}) == "auto"
    assert SizePlan().switch_tokens is None


def test_a_cpu_install_never_imports_triton(encoder_fixture, decision_fixture) -> None:  # type: ignore[no-untyped-def]
    """Triton is a GPU extra: with it unimportable, both families load and answer on the CPU."""
    import subprocess
    import sys

    from tests.stores import subprocess_env

    script = f"""
import sys
sys.modules["triton"] = None  # any import of triton now fails
from pathlib import Path
from vllm_srun.adapters.contracts import LoadContext
from vllm_srun.adapters.devices.torch_devices import open_device
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.decision import DecisionFamily
from vllm_srun.adapters.families.decision_rows import QuestionRow
from vllm_srun.adapters.families.encoder import EncoderFamily
from vllm_srun.domain.settings.engine_args import EngineArgs
context = LoadContext(device=open_device("auto"), args=EngineArgs(), engines=EngineRegistry())
encoder = EncoderFamily().load(Path({str(encoder_fixture("embed"))!r}), context)
assert len(encoder.run("text", encoder.tokenize(["a red bird"], truncate=True))) == 1
decision = DecisionFamily().load(Path({str(decision_fixture("llama"))!r}), context)
assert len(decision.run("text", [QuestionRow((3, 4, 5), (0, 1))])) == 1
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env(), timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr
