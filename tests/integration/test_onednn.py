"""The oneDNN fast path of the native engine (R-DT-3 b): parity with eager on MiniLM over a spread
of shapes, batch invariance, the load-time gates, the per-shape choice from (synthetic) timings,
the timing cache, and what a served model reports (kernels, numerics, golden)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.serving import serving
from vllm_srun.adapters.devices.cpu_features import cpu_has_native_bf16
from vllm_srun.adapters.devices.torch_devices import CpuDevice
from vllm_srun.adapters.engines import native, onednn_timing
from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.native import NativeEncoder, native_encoder
from vllm_srun.adapters.models.encoder_arch import hidden_states
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.adapters.models.unpadded import PackedRows
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.worker.kernels import KernelPlan, KernelTiming

pytestmark = pytest.mark.skipif(
    onednn_unsupported("cpu", torch.float32) is not None, reason="no oneDNN fast path on this machine"
)


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> tuple[ReferenceEncoder, NativeEncoder, TextTokenizer]:
    reference = ReferenceEncoder.from_folder(minilm_dir)
    forced = NativeEncoder(reference, PackedEncoder(reference.encoder, reference.head), KernelPlan(1 << 30))
    return reference, forced, TextTokenizer.from_folder(minilm_dir)


def _rows(lengths: list[int], seed: int = 0) -> list[Encoded]:
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = [101, *rng.integers(1000, 30000, n - 2).tolist(), 102]
        out.append(Encoded(ids, [0] * n, False, n))
    return out


@pytest.mark.parametrize(
    "lengths", [[2], [8], [31], [17, 17, 17], [64] * 8, [128] * 4, [256, 256], [200, 96, 50, 50, 9, 3], [256, 2, 3]]
)
def test_packed_forward_within_1e5_of_eager_on_minilm(minilm, lengths: list[int]) -> None:  # type: ignore[no-untyped-def]
    reference, forced, _ = minilm
    batch = _rows(lengths, seed=len(lengths))
    got, want = forced.embed(batch), reference.embed(batch)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5
    with torch.inference_mode():  # the hidden states too, on every real token (rows sorted longest first)
        ids, mask, _ = reference.tensors(batch)
        rows = PackedRows.build(batch)
        hidden = hidden_states(reference.encoder, rows, forced.linears_for(int(rows.ids.shape[0])))
        eager = reference.encoder(ids, mask, None)
        for j, (i, start) in enumerate(zip(rows.order, rows.starts.tolist())):
            n = lengths[i]
            gap = (hidden[start : start + n] - eager[i, :n]).abs().max().item()
            assert gap <= 1e-4 * max(1.0, eager[i, :n].abs().max().item()), (j, gap)


def test_packed_forward_is_batch_invariant_on_minilm(minilm) -> None:  # type: ignore[no-untyped-def]
    """A row's embedding is bit-identical alone and in any mix: the packed linears give every row the
    same bits whatever the row count, and attention and pooling run per run of equal lengths."""
    reference, forced, tok = minilm
    texts = [
        "route this to billing",
        "a",
        "the quick brown fox jumps over the lazy dog " * 4,
        "hello world",
        "refund my order please",
        "x y",
    ]
    rows = tok.encode(texts)
    alone = [forced.embed([r])[0] for r in rows]
    for order in (
        list(range(6)),
        list(range(6))[::-1],
        sorted(range(6), key=lambda i: -len(rows[i].ids)),
        [2, 0, 0, 5],
    ):
        out = forced.embed([rows[i] for i in order])
        assert all(np.array_equal(out[k], alone[i]) for k, i in enumerate(order))
    eager_alone = [reference.embed([r])[0] for r in rows]  # eager is not: F.linear picks kernels by row count
    mixed = reference.embed(rows)
    assert not all(np.array_equal(mixed[i], eager_alone[i]) for i in range(6))


def test_packed_classifier_head_is_batch_invariant(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture("classify")
    reference = ReferenceEncoder.from_folder(folder)
    forced = NativeEncoder(reference, PackedEncoder(reference.encoder, reference.head), KernelPlan(1 << 30))
    rows = TextTokenizer.from_folder(folder).encode(["great fun movie", "bad", "the plot was boring and bad", "ok"])
    alone = [forced.classify_logits([r])[0] for r in rows]
    out = forced.classify_logits(rows)
    assert all(np.array_equal(out[i], alone[i]) for i in range(4))
    assert np.abs(out - reference.classify_logits(rows)).max() <= 1e-5


def test_gates_fall_back_to_eager_with_a_reason(minilm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reference = minilm[0]
    off = native_encoder(reference, CpuDevice(), lambda _m: None, env={"VLLM_SRUN_ONEDNN": "0"})
    assert off.packed is None and off.describe()["kernels"] == {
        "linear": "eager",
        "reason": "turned off (VLLM_SRUN_ONEDNN=0)",
        "attention": "one call for every row (C++ varlen op)",  # attention is not the linears' switch
        "add_norm": "residual add + LayerNorm in one pass (C++ op)",  # nor is the residual's norm
    }
    assert off.kernel_switch_tokens is None
    assert "not a CPU" in onednn_unsupported("cuda:0", torch.float32)
    assert "without native BF16" in onednn_unsupported("cpu", torch.bfloat16, native_bf16=False)
    assert "FP32 or BF16 only" in onednn_unsupported("cpu", torch.float16)
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert "not an x86 CPU" in onednn_unsupported("cpu", torch.float32)
    assert "x86" in native_encoder(reference, CpuDevice(), lambda _m: None, env={}).describe()["kernels"]["reason"]


def test_bfloat16_keeps_eager_on_a_cpu_without_native_bf16(encoder_fixture, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("vllm_srun.adapters.devices.cpu_features.cpu_has_native_bf16", lambda: False)
    reference = ReferenceEncoder.from_folder(encoder_fixture("embed"), dtype=torch.bfloat16)
    kernels = native_encoder(reference, CpuDevice(), lambda _m: None, env={}).describe()["kernels"]
    assert kernels["linear"] == "eager" and "bfloat16" in kernels["reason"]


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native BF16 (avx512_bf16/amx_bf16)")
def test_bfloat16_runs_onednn_packed_kernels_within_0999_cosine_of_fp32(minilm_dir: Path, tmp_path: Path) -> None:
    """R-DT-2 on a CPU with native BF16: `--dtype bfloat16` encoders run oneDNN's BF16 kernels on
    packed weights (where the load-time timings send a forward there; forced here) or torch's own
    BF16 linears, and every MiniLM embedding keeps a cosine of at least 0.999 to FP32's."""
    fp32 = ReferenceEncoder.from_folder(minilm_dir)
    bf16_reference = ReferenceEncoder.from_folder(minilm_dir, dtype=torch.bfloat16)
    packed = native_encoder(bf16_reference, CpuDevice(), lambda _m: None, env={"VLLM_SRUN_ONEDNN": "1"})
    kernels = packed.describe()["kernels"]
    assert kernels["linear"] == "onednn_packed" and kernels["dtype"] == "bfloat16", kernels
    assert kernels["numerics_gap"] <= native.NUMERICS_TOL_BY_DTYPE[torch.bfloat16]
    batch = _rows([2, 5, 9, 17, 33, 64, 64, 128, 200, 256], seed=3)
    want = fp32.embed(batch)
    for engine in (packed, NativeEncoder(bf16_reference)):
        got = engine.embed(batch)
        assert got.dtype == np.float32
        cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cosine.min() >= 0.999, cosine


def test_the_plan_from_timings_picks_the_path_per_shape(minilm, monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = minilm[0]
    fake = [KernelTiming(n, 1.0, 1.0 / s) for n, s in ((17, 1.8), (34, 1.5), (67, 1.1), (133, 0.8))]
    monkeypatch.setattr(onednn_timing, "time_linears", lambda *a, **k: fake)
    engine = native_encoder(reference, CpuDevice(), lambda _m: None, env={}, cache_dir=tmp_path)
    assert engine.plan == KernelPlan(67) and engine.kernel_switch_tokens == 67
    kernels = engine.describe()["kernels"]
    assert kernels["linear"] == "onednn_packed" and kernels["packed_up_to_tokens"] == 67
    assert kernels["speedups"] == [[17, 1.8], [34, 1.5], [67, 1.1], [133, 0.8]] and kernels["timings"] == "measured"
    calls: list[tuple[int, bool]] = []
    choose = engine.linears_for
    monkeypatch.setattr(
        engine, "linears_for", lambda n: calls.append((n, choose(n) is engine.packed_linears)) or choose(n)
    )
    short, long = _rows([8]), _rows([40, 30])  # 8 tokens: packed copies; 40 + 30 = 70 tokens: eager
    assert np.abs(engine.embed(short) - reference.embed(short)).max() <= 1e-5
    assert np.abs(engine.embed(long) - reference.embed(long)).max() <= 1e-5
    assert calls == [(8, True), (70, False)]


def test_timings_are_measured_once_per_machine_and_shape(minilm, monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = minilm[0]
    measured: list[list[int]] = []

    def fake(_runner, _packed, sizes, **_kw):  # type: ignore[no-untyped-def]
        measured.append(list(sizes))
        return [KernelTiming(n, 1.0, 0.5) for n in sizes]

    monkeypatch.setattr(onednn_timing, "time_linears", fake)
    first = native_encoder(reference, CpuDevice(), lambda _m: None, env={}, cache_dir=tmp_path)
    second = native_encoder(reference, CpuDevice(), lambda _m: None, env={}, cache_dir=tmp_path)
    assert len(measured) == 1 and measured[0] == onednn_timing.timed_sizes(4096)
    assert first.describe()["kernels"]["timings"] == "measured" and second.describe()["kernels"]["timings"] == "cached"
    assert first.plan == second.plan == KernelPlan(2048)
    assert len(list((tmp_path / "kernels").glob("onednn-*.json"))) == 1


def test_real_timings_run_and_give_a_plan(minilm) -> None:  # type: ignore[no-untyped-def]
    reference, forced, _ = minilm
    timings = onednn_timing.time_linears(reference, forced.packed, [17, 67])
    assert [t.tokens for t in timings][:1] == [17] and all(t.eager_s > 0 and t.fast_s > 0 for t in timings)


# eager: whatever the probe finds (unpadded eager forwards are often row-invariant too, but MKL's
# kernel choice per shape is not promised); the packed copies are promised exact
@pytest.mark.parametrize(("mode", "linear", "numerics"), [("1", "onednn_packed", "exact"), ("0", "eager", None)])
def test_served_card_reports_kernels_and_the_probe_finds_packed_forwards_exact(
    encoder_fixture, monkeypatch, mode: str, linear: str, numerics: str
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(native.ENV, mode)
    # profile batching: `meta.numerics` then says what the probe found (under exact every answer is exact)
    batching = EngineArgs(profile="batching")
    with serving([(encoder_fixture("embed"), batching), (encoder_fixture("rerank"), batching)]) as (client, rt):
        for card in client.get("/v1/models").json()["data"]:
            assert card["ready"] and card["engine"] == "native" and card["kernels"]["linear"] == linear
            assert card["golden"]["status"] == "matched"  # the readiness check ran the path that serves
            probed = "exact" if rt.models[card["id"]].scheduler_loop.scheduler.batch_invariant else "approximate"
            assert card["numerics"] == probed and numerics in (None, probed)
        if numerics is None:
            numerics = "exact" if rt.models["tiny-embed"].scheduler_loop.scheduler.batch_invariant else "approximate"
        r = client.post(
            "/v1/embeddings", json={"model": "tiny-embed", "input": ["a b", "c"], "options": {"return_meta": True}}
        )
        assert r.status_code == 200 and r.json()["meta"]["numerics"] == numerics


def test_a_fast_path_ending_below_512_tokens_is_approximate_without_a_probe(
    encoder_fixture, monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Merged forwards of an exact model hold at least 256 tokens (R-BAT-5,
    `invariant_forward_tokens`): a forward that changes kernels before that cannot be
    batch-invariant, whatever the probe's small batches would show."""
    from vllm_srun.adapters.contracts import LoadContext
    from vllm_srun.adapters.engines.registry import EngineRegistry
    from vllm_srun.adapters.families.encoder import EncoderFamily
    from vllm_srun.adapters.readiness.probe import probe_model
    from vllm_srun.domain.settings.engine_args import EngineArgs

    folder = encoder_fixture("embed")  # written (and its golden recorded) before the fake timings
    fake = [KernelTiming(n, 1.0, 1.0 / s) for n, s in ((17, 1.8), (34, 1.5), (67, 0.8))]
    monkeypatch.setattr(onednn_timing, "time_linears", lambda *a, **k: fake)
    monkeypatch.delenv(native.ENV, raising=False)
    context = LoadContext(device=CpuDevice(), args=EngineArgs(), engines=EngineRegistry(), cache_dir=tmp_path)
    model = EncoderFamily().load(folder, context)
    assert model.engine.kernel_switch_tokens == 34
    assert probe_model(model) is False  # without probing: the fast path ends below 512 tokens
    monkeypatch.setenv(native.ENV, "1")  # every forward packed: the probe decides (and finds it exact)
    model = EncoderFamily().load(folder, context)
    assert model.engine.kernel_switch_tokens is not None and model.engine.kernel_switch_tokens >= 512
    assert probe_model(model) is True


def test_a_fast_path_ending_between_256_and_512_tokens_caps_merged_forwards_there(
    encoder_fixture, monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The oneDNN fast path at one thread measured not slower only up to 265 tokens: the probe
    still decides, and an exact model merges forwards up to 265 tokens, every one of them packed."""
    from vllm_srun.adapters.contracts import LoadContext
    from vllm_srun.adapters.engines.registry import EngineRegistry
    from vllm_srun.adapters.families.encoder import EncoderFamily
    from vllm_srun.adapters.readiness.probe import probe_model
    from vllm_srun.domain.settings.engine_args import EngineArgs

    folder = encoder_fixture("embed")  # written (and its golden recorded) before the fake timings
    speedups = ((17, 1.8), (34, 1.5), (67, 1.3), (133, 1.2), (265, 1.1), (529, 0.9))
    fake = [KernelTiming(n, 1.0, 1.0 / s) for n, s in speedups]
    monkeypatch.setattr(onednn_timing, "time_linears", lambda *a, **k: fake)
    monkeypatch.delenv(native.ENV, raising=False)
    context = LoadContext(device=CpuDevice(), args=EngineArgs(), engines=EngineRegistry(), cache_dir=tmp_path)
    model = EncoderFamily().load(folder, context)
    assert model.engine.kernel_switch_tokens == 265 and model.invariant_tokens == 265
    calls: list[int] = []
    real = model.engine.linears_for  # the kernels each forward of the probe runs on
    monkeypatch.setattr(model.engine, "linears_for", lambda tokens: calls.append(tokens) or real(tokens))
    assert probe_model(model) is True
    assert calls and max(calls) <= 265  # every probe forward ran on the packed copies
