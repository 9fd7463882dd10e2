"""The engine plugins this package registers (entry points of group `vllm_srun.engines`).

- `native`: our torch code; encoders run unpadded with the oneDNN fast path where it is measured
  safe and faster (`native.py`), decoders eager (`native_decoder.py`);
- `onnxruntime`: ONNX Runtime for encoders (`onnxruntime.py`).

Each plugin imports its engine module only when it builds, so `--engine native` never imports
onnxruntime.
"""

from __future__ import annotations

from vllm_srun.adapters.contracts import Engine, EngineRefused, EngineRequest, Progress


def use_threads(threads: int | None) -> None:
    """Build (and time kernels) on THREADS intra-op threads: the device thread builds the engine.
    Every forward then declares its own count in the process's thread context (`threads.py`)."""
    if threads:
        from vllm_srun.adapters.engines.threads import TorchThreadContext

        TorchThreadContext().declare(threads)


class NativePlugin:
    name = "native"

    def build(self, request: EngineRequest, progress: Progress) -> Engine:
        if request.kind in ("encoder", "decoder"):
            use_threads(request.threads)
        if request.kind == "encoder":
            from vllm_srun.adapters.engines.native import native_encoder

            return native_encoder(
                request.model,
                request.device.name,
                progress,
                largest_forward_tokens=request.largest_forward_tokens,
                cache_dir=request.cache_dir,
                deterministic=request.deterministic,
            )
        if request.kind == "decoder":
            from vllm_srun.adapters.engines.native_decoder import NativeDecoder

            return NativeDecoder(request.model)
        raise EngineRefused(f"the native engine has no forward for {request.kind} models")


class OnnxRuntimePlugin:
    name = "onnxruntime"

    def build(self, request: EngineRequest, progress: Progress) -> Engine:
        if request.kind != "encoder":
            raise EngineRefused(f"the onnxruntime engine serves encoder models only (this is a {request.kind} model)")
        use_threads(request.threads)  # torch pools a package graph's hidden states
        from vllm_srun.adapters.engines.onnxruntime import onnx_encoder

        return onnx_encoder(
            request.model,
            device=request.device.name,
            threads=request.threads,
            progress=progress,
            onnx_file=request.package_graph,
            cache_dir=request.cache_dir,
            package_sha256=request.package_sha256,
        )
