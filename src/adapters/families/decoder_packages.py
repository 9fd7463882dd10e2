"""What a decoder package is (Qwen3 / Qwen2 / Llama / Qwen3.5 backbones), and so who serves it:
the encoder family or the decision family (R-PKG-2).

A decoder checkpoint is read by what it says it is, in this order, with no file of ours needed:
1. `srun.json`, when it has one: a `rerank` section (the Qwen3-Reranker recipe) or `surfaces` naming
   an encoder surface (embeddings, classify, rerank) → encoder; `surfaces` naming `decisions` →
   decision. (A `family` there wins over all of this: the registry reads it first.)
2. a sentence-transformers package (`modules.json`: Qwen3-Embedding, gte-Qwen2 …) → encoder
   (embeddings, whatever head its config names);
3. config.json's `architectures`: a head transformers defines over the backbone —
   `…ForSequenceClassification` (classify; rerank with one label) or `…ForTokenClassification`
   (token heads) → encoder; only bare backbones (`…Model`: `Qwen3Model`, `Qwen3_5TextModel`) →
   encoder (embeddings); a language-model head (`…ForCausalLM`, `…ForConditionalGeneration`) or
   no `architectures` at all → decision.
Anything else (`…ForQuestionAnswering` …) is served by neither: the registry refuses it in one line
naming its model_type and architectures (`describe_package`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from vllm_srun.adapters.models.encoders import DECODER_TYPES
from vllm_srun.adapters.models.manifest import asks_for_yes_no, read_config, read_manifest

ENCODER_SURFACES = frozenset({"embeddings", "classify", "rerank"})
DECISION_SURFACES = frozenset({"decisions"})
HEAD_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification")
LM_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")
Role = Literal["encoder", "decision"]


def _config(folder: Path) -> dict[str, Any]:
    """config.json, or nothing when it is missing or unreadable (detection then says no)."""
    try:
        config = read_config(folder)
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def architectures(config: dict[str, Any]) -> list[str]:
    raw = config.get("architectures") or []
    return [str(a) for a in raw] if isinstance(raw, list) else []


def role_by_architectures(names: list[str]) -> Role | None:
    """Step 3 of the module doc: what config.json's ARCHITECTURES make of a decoder package."""
    if not names:
        return "decision"  # a config without the field: the causal LM it has always been taken for
    if any(a.endswith(HEAD_SUFFIXES) for a in names):
        return "encoder"
    if any(a.endswith(LM_SUFFIXES) for a in names):
        return "decision"
    if all(a.endswith("Model") for a in names):
        return "encoder"
    return None


def decoder_role(folder: Path) -> Role | None:
    """Who serves the decoder package in FOLDER (module doc); None: neither family can read it."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError:
        manifest = {}  # the registry refuses an unreadable srun.json before asking any family
    surfaces = set(manifest.get("surfaces") or ())
    if asks_for_yes_no(manifest) or ENCODER_SURFACES & surfaces:
        return "encoder"
    if DECISION_SURFACES & surfaces:
        return "decision"
    if (folder / "modules.json").is_file():
        return "encoder"
    return role_by_architectures(architectures(_config(folder)))


def serves_encoder_surfaces(folder: Path) -> bool:
    """Whether the decoder package in FOLDER is an embedder, a reranker or a classifier (module doc)."""
    return decoder_role(folder) == "encoder"


def serves_decisions(folder: Path) -> bool:
    """Whether the decoder package in FOLDER is a causal LM the decision family serves (module doc)."""
    return decoder_role(folder) == "decision"


def is_decoder_encoder(folder: Path) -> bool:
    """A decoder-backbone package the encoder family serves."""
    kind = str(_config(folder).get("model_type", "")).lower()
    return kind in DECODER_TYPES and serves_encoder_surfaces(folder)


def describe_package(folder: Path) -> str:
    """What config.json says a package is, for a refusal: `model_type 'x', architectures A, B`."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return "no config.json"
    config = _config(folder)
    if not config:
        return "config.json is not a JSON object"
    kind = config.get("model_type")
    names = architectures(config)
    described = f"model_type {kind!r}" if kind else "no model_type"
    return f"{described}, architectures {', '.join(names)}" if names else described
