"""The ONNX Runtime engine for encoders (`--engine onnxruntime`, dtype auto only; R-DEV-3).

`onnx_encoder(reference, ...)` serves the model the encoder family loaded with ONNX Runtime: the
CPU execution provider on the CPU, the CUDA (or ROCm / MIGraphX) execution provider on a GPU when
the installed build has it (`execution_providers`; without it the engine is refused with one line
naming the missing provider, before any weights load when `--engine onnxruntime` is asked for).
It runs the package's own graph when the family passes one that gives what the model serves, else
our exported graph (`onnx_export.cached_export`, cached by the package's sha256, exported from a
host copy of the model).
Rows are planned in the same lane as on the native engine, but counted padded (one session.run
on right-padded ids is one forward; the native engine counts packed tokens).
Session threads follow the worker's `--threads` (intra-op), with one inter-op thread.

A package graph may return pooled `embeddings`/`logits` (our export's names) or a last hidden
state [batch, tokens, hidden], which is pooled here with the package's pooling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_srun.adapters.contracts import Determinism, Device, EngineRefused
from vllm_srun.adapters.contracts.batch import Ask, Batch, BatchOutputs
from vllm_srun.adapters.engines.onnx_export import INPUTS, cached_export
from vllm_srun.adapters.models.pooling import pool
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.domain.scheduling.lanes import Accounting

Progress = Callable[[str], None]
NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
CPU_PROVIDER = "CPUExecutionProvider"
# the execution providers that run a device kind, in order of preference
GPU_PROVIDERS = {
    "cuda": ("CUDAExecutionProvider",),
    "rocm": ("ROCMExecutionProvider", "MIGraphXExecutionProvider"),
}
GPU_BUILDS = {"cuda": "onnxruntime-gpu", "rocm": "onnxruntime-rocm or onnxruntime-migraphx"}


def execution_providers(device: Device, available: list[str], version: str) -> list[Any]:
    """The providers a session on DEVICE runs with (the device's own, then the CPU's for the
    nodes it lacks); EngineRefused with one line naming what is missing."""
    if device.kind == "cpu":
        return [CPU_PROVIDER]
    wanted = GPU_PROVIDERS.get(device.kind)
    if wanted is None:
        raise EngineRefused(
            f"the onnxruntime engine has no execution provider for {device.kind} devices (device {device.name}); "
            "use --engine native"
        )
    found = next((p for p in wanted if p in available), None)
    if found is None:
        raise EngineRefused(
            f"the onnxruntime engine on {device.name} needs onnxruntime's {' or '.join(wanted)}, which this "
            f"build (onnxruntime {version}: {', '.join(available)}) lacks; install {GPU_BUILDS[device.kind]}"
        )
    return [(found, {"device_id": device.index or 0}), CPU_PROVIDER]


def providers_for(device: Device) -> list[Any]:
    """`execution_providers` for DEVICE with this process's onnxruntime."""
    import onnxruntime as ort

    return execution_providers(device, list(ort.get_available_providers()), ort.__version__)


def session_options(threads: int | None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or 0  # 0: ONNX Runtime's default (the cores it sees)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return opts


def open_session(path: Path, threads: int | None, providers: list[Any] | None = None) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), session_options(threads), providers=providers or [CPU_PROVIDER])


def provider_name(provider: Any) -> str:
    return provider[0] if isinstance(provider, tuple) else str(provider)


class OnnxEncoder:
    name = "onnxruntime"
    accounting = Accounting.PADDED  # one session.run on right-padded rows
    kernel_switch_tokens: int | None = None  # one set of kernels at every size
    forward_threads = False  # the session's intra-op threads are fixed when it is built
    # ONNX Runtime's CPU kernels were not shown to give a row the same bits in any batch here
    determinism: Determinism | None = None

    def __init__(self, reference: ReferenceEncoder, session: Any, graph: str, threads: int | None) -> None:
        self.reference = reference
        self.session = session
        self.graph = graph
        self.threads = threads
        self.provider = session.get_providers()[0]
        self.inputs = {i.name: NUMPY_TYPES.get(i.type, np.int64) for i in session.get_inputs()}
        outputs = session.get_outputs()
        self.outputs = [o.name for o in outputs]
        hidden = [o.name for o in outputs if len(o.shape or ()) == 3]
        self.hidden_output = hidden[0] if hidden else None

    @classmethod
    def fits(cls, session: Any, needs_logits: bool) -> str | None:
        """Why SESSION cannot serve a model (None when it can): its inputs and outputs."""
        names = {i.name for i in session.get_inputs()}
        if "input_ids" not in names or not names <= set(INPUTS):
            return f"inputs {sorted(names)} are not a subset of {list(INPUTS)} with input_ids"
        outputs = {o.name: o for o in session.get_outputs()}
        if needs_logits and "logits" not in outputs:
            return "no `logits` output for the classification head"
        if "embeddings" not in outputs and not any(len(o.shape or ()) == 3 for o in outputs.values()):
            return "neither an `embeddings` output nor a [batch, tokens, hidden] one"
        return None

    def describe(self) -> dict[str, Any]:
        import onnxruntime as ort

        return {
            "kernels": {
                "runtime": f"onnxruntime {ort.__version__}",
                "provider": self.provider,
                "graph": self.graph,
                "intra_op_threads": self.threads,
            }
        }

    def _feed(self, batch: Sequence[Any]) -> tuple[dict[str, np.ndarray], torch.Tensor | None]:
        ids, mask, types = self.reference.tensors(batch, device="cpu")  # ONNX Runtime takes host arrays
        arrays = {
            "input_ids": ids.numpy(),
            "attention_mask": (mask if mask is not None else torch.ones_like(ids)).numpy(),
            "token_type_ids": (types if types is not None else torch.zeros_like(ids)).numpy(),
        }
        return {name: arrays[name].astype(kind, copy=False) for name, kind in self.inputs.items()}, mask

    def _run(self, name: str, feed: dict[str, np.ndarray]) -> np.ndarray:
        out = self.session.run([name], feed)[0]
        return np.ascontiguousarray(out, dtype=np.float32)

    def forward(self, batch: Batch) -> BatchOutputs:
        """The encoder port (`contracts/batch.py`): pooled and head rows through the session
        (`embed`, `classify_logits`), token rows through the reference's padded forward as on
        every engine (`ReferenceEncoder.token_states`), answers in row order."""
        return batch.answer(
            {Ask.EMBEDDING: self.embed, Ask.LOGITS: self.classify_logits, Ask.TOKENS: self.reference.token_states}
        )

    def embed(self, batch: Sequence[Any]) -> np.ndarray:
        feed, mask = self._feed(batch)
        if "embeddings" in self.outputs:
            return self._run("embeddings", feed)
        assert self.hidden_output is not None
        hidden = torch.from_numpy(self._run(self.hidden_output, feed))
        with torch.inference_mode():
            return self.reference.numpy(pool(hidden, mask, self.reference.pooling))

    def classify_logits(self, batch: Sequence[Any]) -> np.ndarray:
        if "logits" not in self.outputs:
            raise ValueError("this model has no sequence-classification head")
        feed, _ = self._feed(batch)
        return self._run("logits", feed)


def onnx_encoder(
    reference: ReferenceEncoder,
    *,
    device: Device,
    threads: int | None,
    progress: Progress,
    onnx_file: Path | None = None,
    cache_dir: Path | None = None,
    package_sha256: str | None = None,
) -> OnnxEncoder:
    """Serve REFERENCE's model with ONNX Runtime on DEVICE (module doc)."""
    computes = next(reference.encoder.parameters()).dtype
    if computes != torch.float32:  # dtype auto is float32 for encoders (domain/settings/dtypes.py PUBLISHED)
        spelled = str(computes).removeprefix("torch.")
        raise EngineRefused(f"the onnxruntime engine runs only dtype auto (this encoder computes in {spelled})")
    providers = providers_for(device)
    if onnx_file is not None:
        session = open_session(onnx_file, threads, providers)
        why_not = OnnxEncoder.fits(session, needs_logits=reference.head is not None)
        if why_not is None:
            progress(f"load: onnxruntime serving the package's {onnx_file.name}")
            return OnnxEncoder(reference, session, f"package {onnx_file.name}", threads)
        progress(f"load: the package's {onnx_file.name} does not fit ({why_not}); exporting ours")
    path, source = cached_export(reference.on_host(), cache_dir, package_sha256, progress)
    session = open_session(path, threads, providers)
    if source == "temporary":
        path.unlink(missing_ok=True)  # the session holds the graph in memory
        path.parent.rmdir()
    progress(f"load: onnxruntime serving our exported graph ({source}) on {provider_name(providers[0])}")
    return OnnxEncoder(reference, session, {"cached": "exported (cached)"}.get(source, "exported"), threads)
