"""Writes a decision package's own files (config.json, model.safetensors, srun.json with its prompt
template): the last step of every decision fixture writer and of the benches' random packages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_srun.adapters.families.decision_prompts import DEFAULT_SYSTEM, TEMPLATES
from vllm_srun.adapters.models.manifest import write_manifest


def write_decision_package(
    out: Path,
    config: dict[str, Any],
    tensors: dict[str, Any],
    *,
    template: str,
    max_input_tokens: int,
    dtype: str = "bfloat16",
    fixture: dict[str, Any] | None = None,
) -> None:
    """CONFIG and TENSORS (numpy arrays by checkpoint name) into OUT, and our manifest: the decision
    family, the named prompt TEMPLATE with the default system prompt, DTYPE (what the package was
    published in), MAX_INPUT_TOKENS, and FIXTURE (variant and seed) where a fixture writer wrote it."""
    from safetensors.numpy import save_file

    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    chosen = TEMPLATES[template]
    manifest: dict[str, Any] = {
        "family": "decision",
        "surfaces": ["decisions"],
        "dtype": dtype,
        "max_input_tokens": max_input_tokens,
        "prompt_template": {
            "state": chosen["state"],
            "question": chosen["question"],
            "system": DEFAULT_SYSTEM,
            "answer_prefix": chosen.get("answer_prefix", ""),
        },
    }
    if fixture is not None:
        manifest["fixture"] = fixture
    write_manifest(out, manifest)
