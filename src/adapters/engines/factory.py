"""The engine factory the composition root hands to families (through `LoadOptions.engines`).

Families ask it for the forward that serves the model they loaded; they never import an engine
module, so which engines exist (and their heavy imports: onnxruntime, the exporter) stays here.
`--engine auto` and `native` give the native torch engine (with the oneDNN fast path where it is
measured safe and faster); `onnxruntime` gives ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINES = ("auto", "native", "onnxruntime")


@dataclass(frozen=True)
class Engines:
    cache_dir: Path | None = None  # where exported graphs and kernel timings are kept (None: not cached)

    def encoder(self, runner: Any, options: Any, progress: Any, *, onnx_file: Path | None = None,
                largest_forward_tokens: int = 4096) -> Any:
        if options.engine == "onnxruntime":
            from vllm_srun.adapters.engines.onnxruntime import onnx_encoder

            return onnx_encoder(runner, device=options.device, threads=options.threads, progress=progress,
                                onnx_file=onnx_file, cache_dir=self.cache_dir,
                                package_sha256=options.package_sha256)
        if options.engine not in ENGINES:
            raise ValueError(f"unknown engine {options.engine!r} (known: {', '.join(ENGINES)})")
        from vllm_srun.adapters.engines.native import native_encoder

        return native_encoder(runner, options.device, progress, largest_forward_tokens=largest_forward_tokens,
                              cache_dir=self.cache_dir)


CACHE_ENV = "VLLM_SRUN_ENGINE_CACHE"


def default_engines() -> Engines:
    """Exported graphs and kernel timings cached in the model store (`<store>/.engines`), or
    where `VLLM_SRUN_ENGINE_CACHE` says (the test suite keeps its own, so timings measured
    while tests load the machine never reach a user's store)."""
    import os

    from vllm_srun.adapters.model_store import store_root

    return Engines(cache_dir=Path(os.environ.get(CACHE_ENV) or store_root() / ".engines"))
