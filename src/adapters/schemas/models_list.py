"""`GET /v1/models` of the worker and the front (R-API-6): one card per model in OpenAI's shape
(`{object: "list", data: [card]}`) with the contract's `api_version` and process `limits`, plus
the `models` list the `typesafe-sdk` client's `models.list()` reads
(`[{name, description, release_date}]`).

The Structs below describe a card as the worker sends it (the OpenAPI document is generated from
them, `http/openapi.py`); the cards themselves are built as dicts (`model_card.model_card`, the
families' `card_section`), so a family's own sections (`kernels`, `decision`, `media`, …) ride
along as fields the Structs leave open. Tests check every card against these schemas.

The typesafe-sdk sends `model: "jev-latest"` when its user names none (`TYPESAFE_DEFAULT_MODEL`).
Where exactly one decision model is served, that name addresses it and is listed as its alias.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from msgspec import Struct

from vllm_srun.adapters.schemas.common import API_VERSION

TYPESAFE_DEFAULT_MODEL = "jev-latest"  # typesafe_sdk.constants.DEFAULT_MODEL

ModelStatus = Literal["starting", "loading", "warming", "ready", "degraded", "failed"]


class ProcessLimits(Struct):
    """What one request to this process may hold (larger: 413 as a whole)."""

    max_bundle_tasks: int  # tasks of one POST /v1/bundle (--max-bundle-tasks)
    max_request_bytes: int  # a request body's bytes (--max-request-bytes)


class HeadWindow(Struct):
    tokens: int  # special tokens included
    overlap: int  # content tokens shared by neighbouring windows


class HeadCard(Struct):
    """A classify head: `sequence` (softmax), `scores` (multi-label sigmoid scores) or `token`."""

    name: str
    kind: Literal["sequence", "scores", "token"]
    labels: list[str]
    inputs: list[str]  # text, pair
    default_threshold: float | None  # scores heads: `selected` at this threshold when a request sets none
    thresholds: list[float] | None  # a packaged per-label operating point (none of ours has one)
    overflow: Literal["reject", "truncate", "window"]  # a request's overflow when it sets none
    window: HeadWindow | None
    reduction: Literal["max", "span_union"] | None  # how the windows of one input are joined
    operating_point_sha256: str | None
    aggregation: list[str] | None = None  # token heads: options.aggregation choices
    default_aggregation: str | None = None


class EmbeddingCard(Struct):
    dimensions: list[int]  # the dense vector's size ([] for a sparse-only model)
    layers: list[int]  # the layer embeddings come from (no early exits)
    modalities: list[str]
    normalized: bool
    pooling: str
    input_types: list[str]  # query, document: where the model has prompts
    outputs: list[str] | None = None  # dense, sparse, multi_vector
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    architecture: str | None = None


class RerankExit(Struct):
    layer: int
    dimension: int


class RerankCard(Struct):
    exits: list[RerankExit]
    default: RerankExit
    relevance: str  # how a relevance score is made


class ModelLimits(Struct):
    max_input_tokens: int | None  # None until the model is loaded
    max_inputs: int
    max_request_tokens: int
    min_options: int | None = None  # decision models: choice options and score levels
    max_options: int | None = None
    min_levels: int | None = None
    max_levels: int | None = None
    image_max_pixels: int | None = None  # image models: what the model reads of one image
    image_source_max_pixels: int | None = None
    image_max_bytes: int | None = None


class ProfileInfo(Struct):
    name: str
    numerics: Literal["exact", "approximate"]
    description: str | None = None


class GoldenStatus(Struct):
    status: Literal["pending", "matched", "unverified", "failed"]
    checked: int
    matched: int
    reason: str | None
    reference: str | None = None  # the reference matched: `<device class>/<dtype>`
    tolerance: float | None = None


class PluginInfo(Struct):
    group: str
    name: str
    distribution: str | None
    version: str | None


class EngineArgsCard(Struct):
    max_num_seqs: int | None
    max_num_seqs_source: str | None
    max_num_batched_tokens: int | None
    max_num_batched_tokens_source: str | None
    memory_class: str | None
    calibration: dict[str, Any] | None
    batch_window_ms: float
    dtype: str
    enable_shared_context: bool | None
    max_model_len: int | None


class InputCard(Struct):
    max_tokens: int | None
    overflow: str


class CapCard(Struct):
    lane: str
    accounting: str
    cap_tokens: int | None
    cap_seconds: float | None


class AdmissionCard(Struct):
    max_queue: int
    max_queued_tokens: int


class ModelCard(Struct):
    """One served model (R-API-6): the contract's fields, then ours. A family adds sections of
    its own (`kernels`, `decision`, `shared_context`, `classify`, `media`, …), left open here."""

    id: str
    object: str
    owned_by: str
    family: str | None  # None until the package is read
    surfaces: list[str]
    repo: str | None  # the Hub repository; None for a local folder
    revision: str | None  # its 40-hex commit; None for a local folder
    model_sha256: str | None  # the weights hash (what answers); None until the package is read
    manifest_sha256: str | None  # the package's manifest and file list
    parameters: int | None  # weights in the package's safetensors files
    licence: str | None  # what srun.json declares; None: unknown
    dtype: str
    device: str
    accelerator: str | None  # cpu, cuda, rocm or mps
    accelerator_validated: bool  # the project's test suite runs every model on it
    engine: str | None
    profile: str
    profiles: list[ProfileInfo]
    limits: ModelLimits
    golden: GoldenStatus
    plugins: list[PluginInfo]
    status: ModelStatus
    reason: str | None
    ready: bool
    # ours
    artifact: str
    package_date: str | None
    numerics: str | None  # exact, approximate or deterministic
    merged_forward_tokens: int | None
    engine_args: EngineArgsCard
    input: InputCard
    caps: list[CapCard]
    admission: AdmissionCard | None
    created: int
    # by family
    question_types: list[str] | None = None  # decision models
    modalities: list[str] | None = None  # decision models: what a request may carry
    heads: list[HeadCard] | None = None  # classifiers
    embedding: EmbeddingCard | None = None  # embedders
    rerank: RerankCard | None = None  # rerankers
    threads: dict[str, Any] | None = None
    deterministic: dict[str, str] | None = None
    media: dict[str, Any] | None = None


class ListedModel(Struct):
    """An entry of `models` (typesafe-sdk's `models.list()`)."""

    name: str
    description: str
    release_date: str


class ModelList(Struct):
    object: str
    api_version: str
    data: list[ModelCard]
    limits: ProcessLimits
    models: list[ListedModel]


def is_decision_card(card: dict[str, Any]) -> bool:
    return "decisions" in (card.get("surfaces") or [])


def models_list(cards: Sequence[dict[str, Any]], limits: ProcessLimits | None = None) -> dict[str, Any]:
    """The answer of `GET /v1/models` for CARDS; LIMITS: the process's (a front sends none)."""
    entries = [_entry(card["id"], card) for card in cards]
    decision = [card for card in cards if is_decision_card(card)]
    if len(decision) == 1 and all(card["id"] != TYPESAFE_DEFAULT_MODEL for card in cards):
        entries.append(_entry(TYPESAFE_DEFAULT_MODEL, decision[0], alias_of=decision[0]["id"]))
    body: dict[str, Any] = {"object": "list", "api_version": API_VERSION, "data": list(cards), "models": entries}
    if limits is not None:
        body["limits"] = {"max_bundle_tasks": limits.max_bundle_tasks, "max_request_bytes": limits.max_request_bytes}
    return body


def _entry(name: str, card: dict[str, Any], alias_of: str | None = None) -> dict[str, str]:
    surfaces = ", ".join(card.get("surfaces") or []) or "no surface yet"
    what = f"{card.get('family') or 'a'} model serving {surfaces} ({card.get('status') or 'unknown'})"
    if alias_of is not None:
        what = f"the typesafe-sdk's default name for {alias_of}: {what}"
    return {"name": name, "description": what, "release_date": card.get("package_date") or ""}
