"""Serve packages in-process: the real Runtime and litestar app behind litestar's TestClient."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from litestar.testing import TestClient

from vllm_srun.adapters.http.app import create_app
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.domain.engine_args import EngineArgs


@contextmanager
def serving(models: list[Path | tuple[Path, EngineArgs]], **runtime: Any) -> Iterator[tuple[TestClient, Runtime]]:
    """Yield (client, runtime) once every model finished loading (ready or failed)."""
    pairs = [m if isinstance(m, tuple) else (m, EngineArgs()) for m in models]
    rt = Runtime([(str(f), a) for f, a in pairs], progress=lambda _msg: None, **runtime)
    with TestClient(create_app(rt), timeout=60) as client:
        deadline = time.monotonic() + 120
        while not rt.loaded.is_set():
            assert time.monotonic() < deadline, "models did not load in 120 s"
            time.sleep(0.05)
        yield client, rt
