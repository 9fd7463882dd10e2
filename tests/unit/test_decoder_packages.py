"""What a decoder package is (`families/decoder_packages.py`): read from config.json, modules.json
and srun.json alone (no weights, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_srun.adapters.families.decoder_packages import (
    decoder_role,
    describe_package,
    is_decoder_encoder,
    role_by_architectures,
    serves_decisions,
)


@pytest.mark.parametrize(
    ("architectures", "role"),
    [
        (["Qwen3ForSequenceClassification"], "encoder"),
        (["Qwen3_5TextForSequenceClassification"], "encoder"),
        (["Qwen3_5ForTokenClassification"], "encoder"),
        (["LlamaModel"], "encoder"),
        (["Qwen3_5TextModel"], "encoder"),
        (["Qwen3ForCausalLM"], "decision"),
        (["Qwen3_5ForConditionalGeneration"], "decision"),
        ([], "decision"),
        (["Qwen3ForQuestionAnswering"], None),
        (["Qwen3Model", "Qwen3ForQuestionAnswering"], None),
        (["Qwen3ForCausalLM", "Qwen3ForSequenceClassification"], "encoder"),  # a head over the backbone wins
    ],
)
def test_architectures_say_what_a_package_is(architectures: list[str], role: str | None) -> None:
    assert role_by_architectures(architectures) == role


def _package(folder: Path, config: dict, manifest: dict | None = None, modules: bool = False) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if manifest is not None:
        (folder / "srun.json").write_text(json.dumps(manifest))
    if modules:
        (folder / "modules.json").write_text("[]")
    return folder


def test_srun_json_then_modules_json_then_architectures(tmp_path: Path) -> None:
    causal = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    classifier = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForSequenceClassification"]}
    cases = [
        (causal, None, False, "decision"),
        (causal, None, True, "encoder"),  # Qwen3-Embedding: a causal LM saved by sentence-transformers
        (causal, {"rerank": {}}, False, "encoder"),  # the Qwen3-Reranker recipe
        (causal, {"surfaces": ["embeddings"]}, False, "encoder"),
        (classifier, None, False, "encoder"),
        (classifier, {"surfaces": ["decisions"]}, False, "decision"),
        (classifier, "not json", False, "encoder"),  # an unreadable srun.json: the registry refuses it first
    ]
    for i, (config, manifest, modules, role) in enumerate(cases):
        folder = _package(tmp_path / str(i), config, None if manifest == "not json" else manifest, modules)
        if manifest == "not json":
            (folder / "srun.json").write_text("{")
        assert decoder_role(folder) == role, (config, manifest, modules)
        assert serves_decisions(folder) is (role == "decision")
        assert is_decoder_encoder(folder) is (role == "encoder")


def test_an_encoder_model_type_is_not_a_decoder_encoder(tmp_path: Path) -> None:
    folder = _package(tmp_path / "bert", {"model_type": "bert", "architectures": ["BertModel"]})
    assert decoder_role(folder) == "encoder" and not is_decoder_encoder(folder)


def test_describe_package_names_what_config_json_says(tmp_path: Path) -> None:
    qa = _package(tmp_path / "qa", {"model_type": "qwen3", "architectures": ["Qwen3ForQuestionAnswering"]})
    assert describe_package(qa) == "model_type 'qwen3', architectures Qwen3ForQuestionAnswering"
    bare = _package(tmp_path / "bare", {"architectures": ["Foo"]})
    assert describe_package(bare) == "no model_type, architectures Foo"
    kind_only = _package(tmp_path / "kind", {"model_type": "mistral"})
    assert describe_package(kind_only) == "model_type 'mistral'"
    (tmp_path / "none").mkdir()
    assert describe_package(tmp_path / "none") == "no config.json"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("[1, 2]")
    assert describe_package(broken) == "config.json is not a JSON object"
