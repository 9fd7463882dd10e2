"""The readiness (golden) check (R-GOLD-1).

A package's `golden.json` holds recorded requests (`{surface, body}`) and references: the
answers recorded at a device class (cpu|gpu) and dtype. Before a model is ready its requests
run twice through the serving path (the surface functions and the scheduler). The two answers
must be identical and, where a reference for this dtype exists, match it within the device
class's tolerance. `matched`: both hold; `unverified`: identical, but no reference applies
(no golden file, or none recorded at this dtype); `failed`: final, the model never serves.
They run with the replay's `Call` (`adapters/call.REPLAY`: `replay=True`), which lets a `warming`
model answer, bypasses the result cache and leaves out the deployment's input budget (`input:
{max_tokens, overflow}`): the requests were recorded without one, and a budget below a recorded
input changes what the model serves, not whether its weights answer as recorded.
Catalog models whose folder lacks a golden file use the one shipped in `families/golden/`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec

from vllm_srun.adapters.call import REPLAY
from vllm_srun.adapters.contracts import LoadedModel
from vllm_srun.adapters.readiness.probe import probe_model
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces.registry import SURFACE_ROUTES, SurfaceHandler
from vllm_srun.domain.settings.dtypes import device_class

GOLDEN_FILE = "golden.json"
FORMAT = "vllm-srun-golden/1"
TOLERANCE = {"cpu": 1e-3, "gpu": 2e-2}
IGNORED = frozenset({"model", "meta", "id", "object"})  # never part of an answer's content (`object` is a type tag)
SHIPPED = Path(__file__).resolve().parents[1] / "families" / "golden"


def shipped_golden(name: str) -> Path | None:
    from vllm_srun.adapters.catalog import CATALOG

    path = SHIPPED / f"{name}.json"
    return path if name in CATALOG and path.exists() else None


def find_golden(folder: Path, artifact: str | None = None, own: Path | None = None) -> Path | None:
    """The package's golden file (OWN, as its family found it, else FOLDER's), else the shipped
    one of a catalog model (by folder or name)."""
    own = own or Path(folder) / GOLDEN_FILE
    if own.exists():
        return own
    for name in (Path(folder).name, artifact):
        found = shipped_golden(name) if name else None
        if found is not None:
            return found
    return None


def project(response: Any) -> Any:
    """An answer's content: builtins, without name/meta/id/object; results in input order."""
    body = msgspec.to_builtins(response)
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in IGNORED}
        for key, value in body.items():
            if isinstance(value, list) and value and all(isinstance(v, dict) and "index" in v for v in value):
                body[key] = sorted(value, key=lambda v: v["index"])
    return body


def compare(expected: Any, got: Any, tol: float, path: str = "$") -> str | None:
    """None when GOT matches EXPECTED (floats within TOL), else where and how it differs."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return None if expected is got else f"{path}: {got!r} != {expected!r}"
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int) and isinstance(got, int):
            return None if expected == got else f"{path}: {got} != {expected}"
        ok = math.isfinite(got) and abs(got - expected) <= tol
        return None if ok else f"{path}: {got!r} differs from {expected!r} by more than {tol:g}"
    if isinstance(expected, dict) and isinstance(got, dict):
        if "error" in got and "error" not in expected:  # an item failed in its slot where the reference answered
            return f"{path}: {got['error']}: {got.get('message', '')}"
        # the reference's fields must all be there; a field answers gained since it was recorded
        # (e.g. an input's usage, R-API-10) is not part of what it vouches for
        if not expected.keys() <= got.keys():
            return f"{path}: keys {sorted(got)} lack {sorted(expected.keys() - got.keys())}"
        for key in expected:
            found = compare(expected[key], got[key], tol, f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return f"{path}: {len(got)} items != {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            found = compare(e, g, tol, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if expected == got else f"{path}: {got!r} != {expected!r}"


def pick_reference(golden: dict[str, Any], device: str, dtype: str) -> dict[str, Any] | None:
    """The reference recorded at this dtype, preferring this device class."""
    refs = [r for r in golden.get("references", []) if r.get("dtype") == dtype]
    refs.sort(key=lambda r: r.get("device") != device_class(device))
    return refs[0] if refs else None


def surface_table() -> dict[str, tuple[msgspec.json.Decoder[Any], SurfaceHandler[Any]]]:
    return {r.surface: (r.decoder, r.handler) for r in SURFACE_ROUTES}


async def run_requests(served: ServedModel, requests: list[dict[str, Any]]) -> list[Any]:
    """The recorded requests, one at a time, through the surfaces as the replay (`REPLAY`: result
    cache bypassed, no input budget: they were recorded without one)."""
    table = surface_table()
    out = []
    for item in requests:
        decoder, handler = table[item["surface"]]
        request = decoder.decode(json.dumps(item["body"]).encode())
        out.append(project(await handler(served, request, REPLAY)))
    return out


def _status(status: str, checked: int = 0, matched: int = 0, reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"status": status, "checked": checked, "matched": matched, "reason": reason, **extra}


async def check(served: ServedModel, path: Path | None, device: str) -> dict[str, Any]:
    """Run the check for SERVED (status `warming`) and return its card entry."""
    if path is None:
        return _status("unverified", reason="the package has no golden file")
    try:
        golden = json.loads(Path(path).read_text(encoding="utf-8"))  # noqa: ASYNC240 - a small file, read once at load
        requests = golden["requests"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _status("failed", reason=f"unreadable golden file {path.name}: {exc}")
    try:
        first = await run_requests(served, requests)
        second = await run_requests(served, requests)
    except Exception as exc:  # a recorded request that no longer runs is a failure, not a crash
        return _status("failed", reason=f"a recorded request failed: {type(exc).__name__}: {exc}")
    n = len(requests)
    for i, (a, b) in enumerate(zip(first, second)):
        if msgspec.json.encode(a) != msgspec.json.encode(b):
            return _status("failed", n, 0, f"request {i} answered differently when run twice")
    assert served.model is not None
    dtype = served.model.dtype
    ref = pick_reference(golden, device, dtype)
    if ref is None:
        recorded = sorted({r.get("dtype") for r in golden.get("references", [])})
        return _status(
            "unverified",
            n,
            0,
            f"no reference recorded at dtype {dtype} (recorded: {', '.join(map(str, recorded)) or 'none'})",
        )
    # a reference may widen it: an int8 package's answers move further with its FP32 kernels' rounding
    tol = max(TOLERANCE[device_class(device)], float(ref.get("tolerance") or 0.0))
    expected = ref.get("responses", [])
    if len(expected) != n:
        return _status("failed", n, 0, f"the golden file has {len(expected)} answers for {n} requests")
    matched = 0
    for i, (want, got) in enumerate(zip(expected, first)):
        diff = compare(want, got, tol)
        if diff:
            return _status(
                "failed",
                n,
                matched,
                f"request {i} ({requests[i]['surface']}) does not match the reference: {diff}"[:400],
            )
        matched += 1
    # the reference it matched: the device class it was recorded on and its dtype (`cpu/float32`)
    reference = f"{ref.get('device') or 'any'}/{dtype}"
    return _status("matched", n, matched, None, reference=reference, tolerance=tol)


class LoadTimeChecks:
    """The `ReadinessChecks` the runtime runs at load: the batch-invariance probe (R-BAT-5) and,
    unless turned off (recording a golden file), the golden check (R-GOLD-1)."""

    def __init__(self, check_golden: bool = True) -> None:
        self.check_golden = check_golden

    def probe(self, model: LoadedModel) -> bool | None:
        return probe_model(model)

    async def golden(self, served: ServedModel) -> dict[str, Any]:
        if not self.check_golden:
            return _status("unverified", reason="the golden check is turned off")
        assert served.model is not None and served.folder is not None
        return await check(served, find_golden(served.folder, served.artifact, served.model.golden_file), served.device)
