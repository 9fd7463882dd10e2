"""docs/serving.md's bundle example runs as written: docs/examples/bundle_models.yaml (read by
the CLI's own models-file path) serves the models docs/examples/bundle.json names, with tiny
fixtures in place of the folders it points to, and every task of the body is answered 200."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.serving import serving
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.app.cli import model_specs

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_the_bundle_example_is_answered_by_the_models_it_names(
    tmp_path: Path,
    encoder_fixture: Any,
    decision_fixture: Any,
) -> None:
    text = (EXAMPLES / "bundle_models.yaml").read_text()
    folders = {  # the doc's artifacts, each a fixture of the same kind
        "artifact: all-MiniLM-L6-v2": encoder_fixture("embed"),
        "artifact: /tmp/topics": encoder_fixture("classify"),
        "artifact: /tmp/judge": decision_fixture(),
    }
    for line, folder in folders.items():
        assert line in text, line
        text = text.replace(line, f"artifact: {folder}")
    models = tmp_path / "models.yaml"
    models.write_text(text)
    specs = model_specs(WorkerSettings(models_file=str(models)).normalized(), "cpu")
    assert sorted(spec.served_name for spec in specs) == ["judge", "minilm", "topics"]

    body = json.loads((EXAMPLES / "bundle.json").read_text())
    with serving(specs, result_cache_entries=0) as (client, _runtime):
        r = client.post("/v1/bundle", json=body)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [(x["id"], x["status"]) for x in results] == [("vec", 200), ("topic", 200), ("ask", 200)], results
        answer = results[2]["decisions"]["answers"]["billing"]
        assert "error" not in answer and 0.0 <= answer["noul"] <= 1.0, answer
