"""Upstream's spellings beside ours (issue 27 item 3): `served_name`, models-file `model`, the
`input` budget; one canonical form in the dump; both spellings that disagree: one line."""

from __future__ import annotations

import pytest

from vllm_srun.adapters.config.loader import ConfigError, dump_config, load_config_text
from vllm_srun.adapters.config.spellings import canonical_models_file

ATTACHED = """\
global:
  model_catalog:
    deployments:
      remote:
        replicas: [{endpoint: "http://h:8100", served_name: minilm}]
        input: {max_tokens: 64, overflow: truncate}
"""


def test_served_name_and_an_attached_deployment_without_artifact_load_in_the_canonical_form() -> None:
    config = load_config_text(ATTACHED.replace("        input: {max_tokens: 64, overflow: truncate}\n", ""))
    remote = config.deployments["remote"]
    assert remote.placement()[0].model == "minilm" and remote.artifact == "minilm"
    dumped = dump_config(config)
    assert "served_name" not in dumped and "model: minilm" in dumped
    assert load_config_text(dumped) == config


def test_both_spellings_that_disagree_are_one_line_naming_both() -> None:
    text = ATTACHED.replace("served_name: minilm", "served_name: minilm, model: other")
    with pytest.raises(ConfigError) as refused:
        load_config_text(text.replace("        input: {max_tokens: 64, overflow: truncate}\n", ""))
    assert refused.value.problems == [
        "deployments.remote.replicas[0]: 'served_name' (minilm) and 'model' (other) name one field and disagree; keep one"
    ]


def test_the_input_budget_is_read_nested_and_dumped_nested() -> None:
    config = load_config_text(
        ATTACHED.replace('endpoint: "http://h:8100", served_name: minilm', "device: cpu").replace(
            "remote:\n", "remote:\n        artifact: a\n"
        )
    )
    deployment = config.deployments["remote"]
    assert (deployment.input_max_tokens, deployment.input_overflow) == (64, "truncate")
    assert "input:\n          max_tokens: 64\n          overflow: truncate" in dump_config(config)
    with pytest.raises(ConfigError) as refused:
        load_config_text(ATTACHED.replace("overflow: truncate", "overflow: drop"))
    assert "deployments.remote.input.overflow: expected one of reject, truncate, window, got 'drop'" in (
        refused.value.problems
    )


def test_a_models_file_entry_may_name_its_model_with_model() -> None:
    data, problems = canonical_models_file({"models": [{"model": "m", "input": {"max_tokens": 8}}]})
    assert problems == [] and data == {"models": [{"artifact": "m", "input_max_tokens": 8}]}
    _, problems = canonical_models_file({"models": [{"model": "m", "artifact": "n"}]})
    assert problems == ["models[0]: 'model' (m) and 'artifact' (n) name one field and disagree; keep one"]
