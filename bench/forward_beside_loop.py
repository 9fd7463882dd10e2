"""A CPU forward beside a busy event loop: what the GIL costs it, with the layer loop in Python, with
every layer in one C++ call (`srun_cpu::encoder_layers`), with the hidden states from one C++ call
pooled in torch (how outputs other than cls or mean pooling run) and with the whole forward in one
C++ call (`srun_cpu::encode`: the embeddings, the layers and the pooling, engines/cpu_op_library.py).

A worker's forwards run on device threads of the same process as its event loop. Every torch op
called from Python releases the GIL and takes it back; while the loop runs Python (parsing and
answering requests) each take-back waits up to a switch interval (1 ms, `adapters/offload.py`).
A tensor argument passed from Python costs one GIL take too, when the op drops it as it returns.
This runs MiniLM's packed forward of `--rows` short texts on one thread, alone and beside a thread
that only runs Python, for the four paths, and prints the medians and ratios measured side by side.
`--arch qwen3` (or `modernbert`, any `bench/architectures.py` architecture whose encoder names a
C++ stack, engines/cpu_stacks.py) does the same for a MiniLM-sized random package of that
architecture, with two paths: its layer loop in Python, and every layer in one C++ call.
`--arch qwen3_5` has three: the layer loop in Python on torch's kernels, the layer loop on the C++
delta rule and convolution, and every layer in one C++ call (engines/cpu_hybrid.py).

    python bench/forward_beside_loop.py [--rows 5] [--repeats 30] [--arch qwen3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _texts import make_texts
from peers import model_folder


def busy(stop: threading.Event) -> None:
    """Python and nothing else, like an event loop parsing requests, until STOP."""
    count = 0
    while not stop.is_set():
        for i in range(1000):
            count += i


def timed_paths(paths: dict, batch: list, repeats: int) -> dict[tuple[str, str], float]:  # type: ignore[type-arg]
    """Median ms of each path's `embed(BATCH)` on one thread, alone and beside a busy Python thread."""
    import torch

    medians: dict[tuple[str, str], float] = {}

    def timed(path: str, case: str) -> threading.Thread:
        def run() -> None:
            torch.set_num_threads(1)
            for _ in range(5):
                paths[path].embed(batch)
            spent = []
            for _ in range(repeats):
                start = time.perf_counter()
                paths[path].embed(batch)
                spent.append(time.perf_counter() - start)
            medians[path, case] = statistics.median(spent) * 1000

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    for path in paths:
        timed(path, "alone").join()
        stop = threading.Event()
        forward = timed(path, "beside")
        spinner = threading.Thread(target=busy, args=(stop,))
        spinner.start()
        forward.join()
        stop.set()
        spinner.join()
    return medians


def stacked(arch: str, rows: int, repeats: int) -> int:
    """ARCH's layer loop in Python against its C++ stack, alone and beside the busy thread."""
    import tempfile

    import torch
    from architectures import write_package

    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, cpu_ops
    from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer
    from vllm_srun.domain.worker.kernels import KernelPlan

    sys.setswitchinterval(0.001)  # the worker's (adapters/offload.py)
    torch.set_num_threads(1)
    ops, attention = cpu_ops(torch.float32, print)
    if not isinstance(ops, VarlenOps):
        print(f"no C++ ops here ({attention})")
        return 1

    class LayerLoop(VarlenOps):
        def stack(self, encoder, linears, x, packed, inputs):  # type: ignore[no-untyped-def]
            return None

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_package(Path(tmp) / arch, arch)
        reference, tokenizer = ReferenceEncoder.from_folder(folder), TextTokenizer.from_folder(folder)
    if getattr(reference.encoder, "hybrid_backbone", False):  # Qwen3.5: eager linears, its own kernels
        from vllm_srun.adapters.engines.cpu_hybrid import CppHybridKernels
        from vllm_srun.adapters.models.unpadded import EAGER_OPS

        class KernelsLoop(VarlenOps):
            def hybrid_kernels(self) -> CppHybridKernels:
                return CppHybridKernels(stack=False)

        paths = {
            "loop, torch kernels": NativeEncoder(reference, ops=EAGER_OPS),
            "loop, C++ kernels": NativeEncoder(reference, ops=KernelsLoop()),
            "layers in one call": NativeEncoder(reference, ops=ops),
        }
    else:
        packed = PackedEncoder(reference.encoder, reference.head)
        packed.warm(512)
        if not ops.runs_stack(reference.encoder, packed.layer_linears):
            print(f"{arch}: no C++ stack runs this package")
            return 1
        paths = {
            "layer loop": NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=LayerLoop()),
            "layers in one call": NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=ops),
        }
    batch = tokenizer.encode(make_texts("short", rows, 1), 256, True)
    medians = timed_paths(paths, batch, repeats)
    print(f"# {arch} (MiniLM-sized random package), {rows} short texts a forward, 1 thread, switch interval 1 ms")
    for path in paths:
        alone, beside = medians[path, "alone"], medians[path, "beside"]
        print(
            f"{path:20s} alone {alone:7.1f} ms   beside a busy Python thread {beside:7.1f} ms   ({beside / alone:.2f}x)"
        )
    one = medians["layers in one call", "beside"]
    for path in list(paths)[:-1]:
        print(f"beside the busy thread, {path} ÷ layers in one call: {medians[path, 'beside'] / one:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5, help="short texts per forward (default: %(default)d)")
    ap.add_argument("--repeats", type=int, default=30, help="forwards timed per case (default: %(default)d)")
    ap.add_argument("--arch", default="", help="a random package of this architecture instead of MiniLM")
    args = ap.parse_args()
    if args.arch:
        return stacked(args.arch, args.rows, args.repeats)

    import torch

    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder
    from vllm_srun.adapters.engines.cpu_op_library import cpu_ops
    from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer
    from vllm_srun.adapters.models.unpadded import ForwardOps
    from vllm_srun.domain.worker.kernels import KernelPlan

    sys.setswitchinterval(0.001)  # the worker's (adapters/offload.py)
    torch.set_num_threads(1)
    folder = model_folder()
    reference, tokenizer = ReferenceEncoder.from_folder(folder), TextTokenizer.from_folder(folder)
    packed = PackedEncoder(reference.encoder, reference.head)
    packed.warm(512)
    ops, attention = cpu_ops(torch.float32, print)

    class LayersInOneCall(type(ops)):  # type: ignore[misc]
        encode = ForwardOps.encode  # the embeddings, row building and pooling in torch, op by op

    class LayerLoop(LayersInOneCall):
        layers = ForwardOps.layers  # the loop in Python

    class HiddenInOneCall(type(ops)):  # type: ignore[misc]
        """As for an output other than cls or mean pooling: the hidden states from one call, pooled in torch."""

        def encode(self, encoder, linears, batch, rows_total, pooling, normalize):  # type: ignore[no-untyped-def]
            if pooling != "none":
                return None
            return super().encode(encoder, linears, batch, rows_total, pooling, normalize)

    paths = {
        "layer loop": NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=LayerLoop()),
        "layers in one call": NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=LayersInOneCall()),
        "hidden states in one call": NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=HiddenInOneCall()),
        "whole forward in one call": NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=ops),
    }
    batch = tokenizer.encode(make_texts("short", args.rows, 1), 256, True)
    medians = timed_paths(paths, batch, args.repeats)
    print(f"# MiniLM, {args.rows} short texts a forward, 1 thread, switch interval 1 ms; attention: {attention}")
    for path in paths:
        alone, beside = medians[path, "alone"], medians[path, "beside"]
        print(
            f"{path:26s} alone {alone:7.1f} ms   beside a busy Python thread {beside:7.1f} ms   ({beside / alone:.2f}x)"
        )
    whole = medians["whole forward in one call", "beside"]
    for path in list(paths)[:3]:
        print(f"beside the busy thread, {path} ÷ whole forward in one call: {medians[path, 'beside'] / whole:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
