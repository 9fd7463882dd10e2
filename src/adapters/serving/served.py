"""One served model: its package, status, scheduler loop and card (R-API-6)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from vllm_srun.adapters.families.base import LoadedModel
from vllm_srun.adapters.serving.scheduler_loop import SchedulerLoop, ForwardStats
from vllm_srun.domain.engine_args import EngineArgs, BatchingLimits
from vllm_srun.domain.errors import Cancelled, DeadlineExceeded, NotReady, UnsupportedSurface
from vllm_srun.domain.rows import RowSpec


# set while the readiness (golden) check runs a model's recorded requests through its surfaces:
# the model may answer while `warming`, and the result cache is bypassed (R-GOLD-1)
GOLDEN_CHECK: ContextVar[bool] = ContextVar("srun_golden_check", default=False)


def weights_sha256(folder: Path) -> str:
    """Hash of the files that decide the model's answers (weights, config, tokenizer)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in {".safetensors", ".onnx"} or path.name in {"config.json", "tokenizer.json"}):
            digest.update(path.name.encode())
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


@dataclass
class ServedModel:
    name: str
    artifact: str
    args: EngineArgs
    device: str
    status: str = "starting"  # starting | loading | warming | ready | failed
    reason: str | None = None
    folder: Path | None = None
    model: LoadedModel | None = None
    scheduler_loop: SchedulerLoop | None = None
    limits: BatchingLimits | None = None
    sha256: str | None = None
    golden: dict[str, Any] = field(default_factory=lambda: {"status": "pending", "checked": 0, "matched": 0, "reason": None})
    extra_card: dict[str, Any] = field(default_factory=dict)
    cache: Any = None  # the worker's ResultCache (R-PERF-3), shared by its models

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def require_surface(self, surface: str) -> Any:
        checking = self.status == "warming" and GOLDEN_CHECK.get()
        if self.model is None or not (self.ready or checking):
            raise NotReady(f"model {self.name!r} is {self.status}" + (f": {self.reason}" if self.reason else ""))
        if surface not in self.model.surfaces:
            raise UnsupportedSurface(f"model {self.name!r} does not serve {surface} (it serves {', '.join(sorted(self.model.surfaces))})")
        return self.model

    async def run(
        self,
        rows: Sequence[RowSpec],
        deadline_ms: float | None,
        timing: Any,
        disconnected: Callable[[], Awaitable[Any]] | None = None,
    ) -> ForwardStats:
        assert self.scheduler_loop is not None
        work = asyncio.ensure_future(self.scheduler_loop.submit(rows))
        waits: set[asyncio.Future] = {work}
        watcher = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        if watcher is not None:
            waits.add(watcher)
        timeout = deadline_ms / 1000 if deadline_ms is not None else None
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if watcher is not None:
                watcher.cancel()
        if work not in done:
            work.cancel()  # drops its rows that have not reached the device
            try:
                await work
            except (asyncio.CancelledError, Exception):
                pass
            if watcher is not None and watcher in done:
                raise Cancelled("the client went away")
            raise DeadlineExceeded(f"no answer within options.deadline_ms={deadline_ms:g}")
        outcome = work.result()
        if timing is not None:
            timing.queue_ms = outcome.queue_s * 1000
            timing.forward_ms = outcome.forward_s * 1000
        return outcome

    def meta(self, outcome: ForwardStats, rows: int) -> Any:
        from vllm_srun.adapters.schemas.common import ResponseMeta

        model = self.model
        assert model is not None
        return ResponseMeta(
            numerics=model.numerics,
            dtype=model.dtype,
            device=model.device,
            engine=model.engine,
            queue_ms=round(outcome.queue_s * 1000, 3),
            forward_ms=round(outcome.forward_s * 1000, 3),
            forwards=outcome.forwards,
            rows=rows,
            padded_tokens=outcome.padded_tokens,
        )

    def card(self) -> dict[str, Any]:
        model = self.model
        limits = self.limits
        card: dict[str, Any] = {
            "id": self.name,
            "object": "model",
            "owned_by": "vllm-srun",
            "artifact": self.artifact,
            "family": model.family if model else None,
            "surfaces": sorted(model.surfaces) if model else [],
            "revision": None,
            "sha256": self.sha256,
            "dtype": model.dtype if model else self.args.dtype,
            "device": self.device,
            "engine": model.engine if model else None,
            "numerics": model.numerics if model else None,
            "engine_args": {
                "max_num_seqs": limits.max_num_seqs if limits else self.args.max_num_seqs,
                "max_num_seqs_source": limits.seqs_source if limits else None,
                "max_num_batched_tokens": limits.max_num_batched_tokens if limits else self.args.max_num_batched_tokens,
                "max_num_batched_tokens_source": limits.tokens_source if limits else None,
                "batch_window_ms": self.args.batch_window_ms,
                "dtype": self.args.dtype,
                # the value in force: a decision model's (family default on), False for families without the path
                "enable_shared_context": getattr(model, "enable_shared_context", False) if model else self.args.enable_shared_context,
                "max_model_len": self.args.max_model_len,
            },
            "limits": {"max_input_tokens": model.max_input_tokens if model else None, "max_inputs": 2048},
            "caps": [
                {"lane": lane.name, "accounting": lane.accounting.value, "cap_tokens": lane.cap_tokens, "cap_seconds": lane.cap_seconds}
                for lane in (model.lanes if model else ())
            ],
            "golden": dict(self.golden),
            "status": self.status,
            "reason": self.reason,
            "ready": self.ready,
            "created": int(time.time()),
        }
        if model is not None:
            card.update(model.describe())
        card.update(self.extra_card)
        return card
