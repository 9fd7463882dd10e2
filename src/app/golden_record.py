"""Record a golden file (R-GOLD-1): run requests twice through the same serving path the check
uses (a Runtime, the surfaces, the scheduler) and store the answers as the reference for this
device class and dtype. A golden file keeps one reference per (device class, dtype)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.contracts import ModelStore
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.readiness import golden
from vllm_srun.app.bootstrap import bootstrap_worker
from vllm_srun.domain.settings.dtypes import device_class


async def _answers(
    folder: Path,
    requests: list[dict[str, Any]],
    device: str,
    dtype: str,
    engine: str,
    families: FamilyRegistry | None,
    engines: EngineRegistry | None,
    store: ModelStore | None,
) -> tuple[list[Any], dict[str, Any]]:
    settings = WorkerSettings(
        models=(str(folder),),
        device=device,
        engine=engine,
        batch_window_ms=0.0,
        dtype=dtype,
        result_cache_entries=0,
        media_workers=0,  # the same pixels as media workers give (R-MEDIA), without starting any
    )
    given: dict[str, Any] = {"families": families, "engines": engines, "store": store}
    container = bootstrap_worker(
        settings.normalized(), check_golden=False, **{name: value for name, value in given.items() if value is not None}
    )
    runtime = container.runtime()
    loop = asyncio.get_running_loop()
    runtime.start_loading(loop)
    await loop.run_in_executor(None, runtime.loaded.wait)
    try:
        served = next(iter(runtime.models.values()))
        if not served.ready:
            raise RuntimeError(f"{folder} did not load: {served.reason}")
        first = await golden.run_requests(served, requests)
        second = await golden.run_requests(served, requests)
        if msgspec.json.encode(first) != msgspec.json.encode(second):
            raise RuntimeError(f"{folder}: the same requests answered differently twice; not recording")
        assert served.model is not None
        ref = {"device": device_class(device), "dtype": served.model.dtype, "engine": served.model.engine.name}
        return first, ref
    finally:
        await runtime.stop()


def record_golden(
    folder: Path,
    requests: list[dict[str, Any]],
    *,
    out: Path | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    engine: str = "auto",
    progress: Callable[[str], None] | None = None,
    families: FamilyRegistry | None = None,
    engines: EngineRegistry | None = None,
    store: ModelStore | None = None,
) -> Path:
    """Write (or update) the golden file of FOLDER (or OUT) with answers computed here."""
    folder = Path(folder)
    out = Path(out) if out is not None else folder / golden.GOLDEN_FILE
    answers, ref = asyncio.run(_answers(folder, requests, device, dtype, engine, families, engines, store))
    doc: dict[str, Any] = {"format": golden.FORMAT, "requests": requests, "references": []}
    if out.exists():
        old = json.loads(out.read_text(encoding="utf-8"))
        if old.get("requests") == requests:  # same requests: keep the other references
            doc["references"] = [
                r
                for r in old.get("references", [])
                if (r.get("device"), r.get("dtype")) != (ref["device"], ref["dtype"])
            ]
    doc["references"].append({**ref, "responses": answers})
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if progress is not None:
        progress(f"golden: recorded {len(requests)} requests at {ref['device']}/{ref['dtype']} into {out}")
    return out


MINILM_REQUESTS: list[dict[str, Any]] = [
    {
        "surface": "embeddings",
        "body": {"input": ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]},
    },
    {"surface": "embeddings", "body": {"input": "Route this request to the billing team, please.", "dimensions": 64}},
]


def main(argv: list[str] | None = None) -> int:
    """python -m vllm_srun.app.golden_record MODEL OUT [--requests FILE] [--dtype D]

    How `families/golden/all-MiniLM-L6-v2.json` was made: MODEL all-MiniLM-L6-v2 with the default
    requests (MINILM_REQUESTS). Re-recording an existing OUT keeps its requests unless given.
    """
    import argparse

    from vllm_srun.adapters.model_store import LocalModelStore

    parser = argparse.ArgumentParser(prog="golden_record", allow_abbrev=False)
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=Path, default=None)
    parser.add_argument("--dtype", default="auto")
    ns = parser.parse_args(argv)
    if ns.requests is not None:
        requests = json.loads(ns.requests.read_text(encoding="utf-8"))
    elif ns.out.exists():
        requests = json.loads(ns.out.read_text(encoding="utf-8"))["requests"]
    else:
        requests = MINILM_REQUESTS
    record_golden(LocalModelStore.from_env().resolve(ns.model), requests, out=ns.out, dtype=ns.dtype, progress=print)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
