"""`vllm-srun quantize MODEL OUT --int8`: an int8 package of an FP32 encoder package, with its own
golden file (docs/quantization.md).

MODEL is what `serve` takes (a folder, a store name or a built-in name). The package is written
into a hidden folder beside OUT (`models/quantize_package.py`), its golden file recorded there
through the serving path at int8 (`golden_record.py`: the package's readiness check then compares
its int8 answers with int8 answers, within `quantize.GOLDEN_TOLERANCE`), and the folder renamed to
OUT only when all of it worked.
The golden requests are the source package's (its own golden file, or a catalog model's shipped
one), else a few of each surface it serves. Refused in one line: a MODEL that is not one of our
encoders, an int8 package already, an OUT that exists and is not an empty folder, a CPU that cannot
run int8 packages (the golden answers are recorded here).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import ModelStore
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.app.preflight import with_article
from vllm_srun.domain.errors import DomainError

Progress = Callable[[str], None]
TEXTS = ["A man is eating food.", "The new movie is awesome.", "Route this request to the billing team, please."]


def default_requests(surfaces: frozenset[str]) -> list[dict[str, Any]]:
    """A few requests of every surface a package serves (when it has no golden file to take them from)."""
    requests: list[dict[str, Any]] = []
    if "embeddings" in surfaces:
        requests.append({"surface": "embeddings", "body": {"input": TEXTS}})
    if "classify" in surfaces:
        requests.append({"surface": "classify", "body": {"input": TEXTS}})
    if "rerank" in surfaces:
        requests.append({"surface": "rerank", "body": {"query": "who is eating?", "documents": TEXTS}})
    return requests


def golden_requests(folder: Path, artifact: str, surfaces: frozenset[str]) -> list[dict[str, Any]]:
    """The source package's recorded requests (its golden file or the shipped one), else `default_requests`."""
    from vllm_srun.adapters.readiness.golden import find_golden

    path = find_golden(folder, artifact)
    if path is not None:
        try:
            requests = json.loads(path.read_text(encoding="utf-8"))["requests"]
            if isinstance(requests, list) and requests:
                return requests
        except (OSError, ValueError, KeyError, TypeError):
            pass  # an unreadable golden file: record the default requests
    return default_requests(surfaces)


def widen_golden_tolerance(path: Path) -> None:
    """Give every reference of the golden file at PATH the int8 tolerance (`quantize.GOLDEN_TOLERANCE`)."""
    from vllm_srun.adapters.models.quantize import GOLDEN_TOLERANCE

    doc = json.loads(path.read_text(encoding="utf-8"))
    for reference in doc.get("references", []):
        reference["tolerance"] = GOLDEN_TOLERANCE
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def quantize(
    model: str,
    out: Path,
    *,
    progress: Progress,
    store: ModelStore | None = None,
    families: FamilyRegistry | None = None,
    cpu_flags: frozenset[str] | None = None,
) -> Path:
    """Write OUT, the int8 package of MODEL (module doc); ValueError with one line when refused.
    STORE, FAMILIES and CPU_FLAGS replace the model store, the installed families and /proc/cpuinfo's
    flags (tests)."""
    import torch

    from vllm_srun.adapters.engines.cpu_int8 import int8_unsupported
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.adapters.models.quantize import read_quantization
    from vllm_srun.adapters.models.quantize_package import write_int8_package
    from vllm_srun.app.golden_record import record_golden

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder")
    try:
        folder = (store or LocalModelStore.from_env()).resolve(model, progress)
        family = (families or FamilyRegistry()).family_for(folder)
    except DomainError as exc:
        raise ValueError(exc.message) from None
    if family.name != "encoder":
        raise ValueError(
            f"{model} is {with_article(family.name)} model: only encoder packages (embedders, classifiers, rerankers) are quantized"
        )
    if read_quantization(folder) is not None:
        raise ValueError(f"{model} is already an int8 package")
    why = int8_unsupported("cpu", torch.float32, cpu_flags)
    if why:
        raise ValueError(f"cannot record the int8 package's golden answers on this machine: {why}")
    requests = golden_requests(folder, model, family.describe(folder).surfaces)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        written = write_int8_package(folder, staging, progress)
        progress(f"quantize: recording the golden answers of {len(requests)} requests at int8 (the serving path)")
        golden = record_golden(staging, requests, families=families, store=store)
        widen_golden_tolerance(golden)
        if out.exists():  # an empty folder
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(
        f"quantize: {out}: {written.tensors} tensors int8 ({written.linears} block linears), checkpoint "
        f"{written.bytes_before / 2**20:.1f} → {written.bytes_after / 2**20:.1f} MiB"
    )
    return out
