"""The readiness (golden) check (R-GOLD-1) and precision (R-DT-2) on fixture packages served
in-process: altered weights end `failed` and never serve; another dtype is `unverified`."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from tests.integration.serving import serving
from vllm_srun.adapters.readiness import golden
from vllm_srun.domain.settings.engine_args import EngineArgs


def _copy(src: Path, dst: Path, *, keep_golden: bool = True) -> Path:
    shutil.copytree(src, dst)
    if not keep_golden:
        (dst / "golden.json").unlink()
    return dst


@pytest.fixture(scope="module")
def checked(encoder_fixture, tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("golden")
    altered = _copy(encoder_fixture("classify"), root / "altered")
    weights = load_file(str(altered / "model.safetensors"))
    weights["classifier.bias"][0] += 0.5  # after the golden file was recorded
    save_file(weights, str(altered / "model.safetensors"))
    bf16 = _copy(encoder_fixture("classify"), root / "bf16")
    bare = _copy(encoder_fixture("rerank"), root / "no-golden", keep_golden=False)
    models = [altered, (bf16, EngineArgs(dtype="bfloat16")), bare]
    with serving(models) as (client, runtime):
        yield client, runtime


def test_altered_weights_fail_the_check_and_never_serve(checked) -> None:  # type: ignore[no-untyped-def]
    client, runtime = checked
    served = runtime.models["altered"]
    assert served.status == "failed" and served.golden["status"] == "failed"
    assert "does not match the reference" in served.golden["reason"] and served.golden["checked"] == 2
    forwards = {"model": "altered", "lane": "text", "outcome": "ok"}
    checked_forwards = runtime.metrics.forwards.get(forwards)  # the check's own forwards
    r = client.post("/v1/classify", json={"model": "altered", "input": "hello"})
    assert runtime.metrics.forwards.get(forwards) == checked_forwards  # the request cost no forward
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    assert "golden check failed" in r.json()["error"]["message"] and r.headers["retry-after"]
    health = client.get("/health")
    assert health.status_code == 503
    assert "golden check failed" in health.json()["models"]["altered"]["reason"]
    card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "altered")
    assert card["ready"] is False and card["golden"]["status"] == "failed" and card["golden"]["reason"]


def test_another_dtype_is_unverified_but_serves(checked) -> None:  # type: ignore[no-untyped-def]
    client, runtime = checked
    served = runtime.models["bf16"]
    assert served.ready and served.golden["status"] == "unverified" and served.golden["checked"] == 2
    assert "bfloat16" in served.golden["reason"]
    card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "bf16")
    assert card["dtype"] == "bfloat16" and card["engine_args"]["dtype"] == "bfloat16"
    assert next(p for p in served.model.reference.encoder.parameters()).dtype.is_floating_point
    assert str(next(served.model.reference.encoder.parameters()).dtype) == "torch.bfloat16"
    r = client.post("/v1/classify", json={"model": "bf16", "input": "hello", "options": {"return_meta": True}})
    assert r.status_code == 200 and r.json()["meta"]["dtype"] == "bfloat16"


def test_no_golden_file_is_unverified(checked) -> None:  # type: ignore[no-untyped-def]
    _, runtime = checked
    served = runtime.models["no-golden"]
    assert served.ready and served.golden == {
        "status": "unverified",
        "checked": 0,
        "matched": 0,
        "reason": "the package has no golden file",
    }


def test_catalog_store_copy_without_golden_uses_the_shipped_file(tmp_path: Path) -> None:
    shipped = golden.shipped_golden("all-MiniLM-L6-v2")
    assert shipped is not None and json.loads(shipped.read_text())["references"][0]["dtype"] == "float32"
    store_copy = tmp_path / "all-MiniLM-L6-v2"
    store_copy.mkdir()
    assert golden.find_golden(store_copy) == shipped
    assert golden.find_golden(tmp_path / "elsewhere", "all-MiniLM-L6-v2") == shipped
    assert golden.find_golden(tmp_path / "unknown-model") is None
    (store_copy / "golden.json").write_text("{}")
    assert golden.find_golden(store_copy) == store_copy / "golden.json"  # the package's own file wins


def test_answers_that_differ_between_the_two_runs_fail(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "golden.json"
    path.write_text(json.dumps({"requests": [{"surface": "classify", "body": {"input": "x"}}], "references": []}))
    answers = iter([[{"p": 0.5}], [{"p": 0.5000001}]])

    async def fake_run(served, requests):  # type: ignore[no-untyped-def]
        return next(answers)

    monkeypatch.setattr(golden, "run_requests", fake_run)
    status = asyncio.run(golden.check(object(), path, "cpu"))  # type: ignore[arg-type]
    assert status["status"] == "failed" and "differently when run twice" in status["reason"]
