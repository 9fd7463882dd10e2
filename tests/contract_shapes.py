"""The response shapes of the upstream model-runtime contract (vllm-project/semantic-router's
OpenAPI document, version 2.3.0), described in our own compact terms, and `check(kind, body)`,
which lists how a decoded JSON body departs from one of them.

What is checked: required fields, JSON types, enums, nullability and the nested types (objects,
lists of, maps of). Fields the contract does not name are allowed: its response objects are open,
and our extensions (docs/contract.md) live there. Only response types are described: a test
sends requests in the contract's shape and checks what comes back.

    from tests.contract_shapes import check
    assert check("ModelList", client.get("/v1/models").json()) == []

Shapes are written as:
    "str" | "int" | "num" | "bool" | "any"   a JSON scalar of that type ("num": int or float)
    Enum("a", "b")                           a string among these
    Nullable(shape)                          the shape or null
    ListOf(shape) / MapOf(shape)             a JSON array / object whose items or values have it
    Obj(required={...}, optional={...})      an object (field → shape)
    "Name"                                   another named shape of SHAPES
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATES = ("starting", "loading", "warming", "ready", "degraded", "failed")


@dataclass(frozen=True)
class Enum:
    values: tuple[str, ...]

    def __init__(self, *values: str) -> None:
        object.__setattr__(self, "values", values)


@dataclass(frozen=True)
class Nullable:
    shape: Any


@dataclass(frozen=True)
class ListOf:
    shape: Any


@dataclass(frozen=True)
class MapOf:
    shape: Any


@dataclass(frozen=True)
class Obj:
    required: dict[str, Any] = field(default_factory=dict)
    optional: dict[str, Any] = field(default_factory=dict)


ITEM_ERROR = Enum(
    "invalid_question",
    "invalid_input",
    "max_length_exceeded",
    "scan_budget_exceeded",
    "invalid_model_output",
    "deadline_exceeded",
    "unavailable",
)
NUMS = ListOf("num")
STRS = ListOf("str")

SHAPES: dict[str, Any] = {
    # --- shared pieces
    "Usage": Obj(required={"input_tokens": "int", "output_tokens": "int"}),
    "EmbeddingsUsage": Obj(required={"prompt_tokens": "int", "total_tokens": "int"}),
    "Representation": Obj(
        required={"model_sha256": "str", "layer": "int", "dimension": "int"},
        optional={"normalized": "bool", "modality": "str"},
    ),
    "ResponseMeta": Obj(
        optional={
            "model_id": "str",
            "revision": Nullable("str"),
            "model_sha256": "str",
            "profile": "str",
            "numerics": "str",
            "engine": "str",
            "accelerator": "str",
            "device": "str",
            "queue_ms": "num",
            "compute_ms": "num",
            "head": "str",
            "representation": "Representation",
        }
    ),
    "InputUsage": Obj(
        required={"tokens": "int", "processed_tokens": "int", "truncated": "bool"},
        optional={"tokens_lower_bound": "bool", "windows": "int"},
    ),
    "Span": Obj(required={"label": "str", "start": "int", "end": "int", "text": "str", "probability": "num"}),
    "ErrorBody": Obj(
        required={
            "code": Enum(
                "invalid_request",
                "model_not_found",
                "request_too_large",
                "unsupported_surface",
                "overloaded",
                "internal_error",
                "not_ready",
            ),
            "message": "str",
        }
    ),
    "ErrorResponse": Obj(required={"error": "ErrorBody"}),
    # --- health
    "ModelHealth": Obj(required={"status": Enum(*STATES)}, optional={"reason": Nullable("str")}),
    "Health": Obj(
        required={"status": Enum(*STATES), "api_version": "str"},
        optional={"reason": Nullable("str"), "model": Nullable("str"), "models": MapOf("ModelHealth")},
    ),
    "Liveness": Obj(required={"status": Enum("alive"), "api_version": "str"}),
    # --- models
    "ProcessLimits": Obj(required={"max_bundle_tasks": "int", "max_request_bytes": "int"}),
    "HeadWindow": Obj(required={"tokens": "int", "overlap": "int"}),
    "HeadCard": Obj(
        required={"name": "str", "kind": Enum("sequence", "scores", "token"), "labels": STRS},
        optional={
            "inputs": STRS,
            "default_threshold": Nullable("num"),
            "thresholds": Nullable(NUMS),
            "overflow": Enum("reject", "truncate", "window"),
            "window": Nullable("HeadWindow"),
            "reduction": Nullable(Enum("max", "span_union")),
            "operating_point_sha256": Nullable("str"),
        },
    ),
    "EmbeddingCard": Obj(
        required={
            "dimensions": ListOf("int"),
            "layers": ListOf("int"),
            "modalities": STRS,
            "normalized": "bool",
            "pooling": "str",
            "input_types": STRS,
        }
    ),
    "RerankExit": Obj(required={"layer": "int", "dimension": "int"}),
    "RerankCard": Obj(required={"exits": ListOf("RerankExit"), "default": "RerankExit"}),
    "ModelLimits": Obj(
        optional=dict.fromkeys(
            (
                "max_input_tokens",
                "max_scan_tokens",
                "truncate_tokens",
                "min_options",
                "max_options",
                "min_levels",
                "max_levels",
                "max_inputs",
                "image_max_pixels",
                "image_source_max_pixels",
                "image_max_bytes",
            ),
            "int",
        )
    ),
    "ProfileInfo": Obj(
        required={"name": "str", "numerics": Enum("exact", "approximate")}, optional={"description": "str"}
    ),
    "GoldenStatus": Obj(
        required={"status": Enum("pending", "matched", "unverified", "failed")},
        optional={"checked": "int", "matched": "int", "reference": Nullable("str")},
    ),
    "PluginInfo": Obj(
        required={"group": "str", "name": "str"},
        optional={"distribution": Nullable("str"), "version": Nullable("str"), "capabilities": MapOf("any")},
    ),
    "ModelCard": Obj(
        required={"id": "str", "object": "str", "family": "str", "surfaces": STRS, "ready": "bool"},
        optional={
            "owned_by": "str",
            "repo": Nullable("str"),
            "revision": Nullable("str"),
            "model_sha256": "str",
            "manifest_sha256": "str",
            "question_types": STRS,
            "presets": STRS,
            "modalities": STRS,
            "heads": ListOf("HeadCard"),
            "embedding": "EmbeddingCard",
            "rerank": "RerankCard",
            "limits": "ModelLimits",
            "licence": Nullable("str"),
            "profile": "str",
            "profiles": ListOf("ProfileInfo"),
            "engine": "str",
            "accelerator": "str",
            "accelerator_validated": "bool",
            "device": "str",
            "dtype": "str",
            "parameters": "int",
            "status": Enum(*STATES),
            "reason": Nullable("str"),
            "golden": "GoldenStatus",
            "plugins": ListOf("PluginInfo"),
        },
    ),
    "ModelList": Obj(
        required={"object": "str", "data": ListOf("ModelCard"), "api_version": "str", "limits": "ProcessLimits"}
    ),
    # --- classify
    "ClassifyWindow": Obj(required={"start": "int", "end": "int"}, optional={"probabilities": NUMS, "scores": NUMS}),
    "TokenProbabilities": Obj(required={"start": "int", "end": "int", "probabilities": NUMS}),
    "ClassifyResult": Obj(
        required={"index": "int"},
        optional={
            "label": "str",
            "probabilities": NUMS,
            "scores": NUMS,
            "selected": STRS,
            "spans": ListOf("Span"),
            "tokens": ListOf("TokenProbabilities"),
            "windows": ListOf("ClassifyWindow"),
            "input": "InputUsage",
            "error": ITEM_ERROR,
        },
    ),
    "ClassifyResponse": Obj(
        required={
            "model": "str",
            "head": "str",
            "kind": Enum("sequence", "scores", "token"),
            "labels": STRS,
            "results": ListOf("ClassifyResult"),
            "usage": "Usage",
        },
        optional={"meta": "ResponseMeta"},
    ),
    # --- embeddings
    "Embedding": Obj(
        required={"object": "str", "index": "int"},
        optional={"embedding": ("FloatVector", "str"), "input": "InputUsage", "error": ITEM_ERROR},
    ),
    "FloatVector": NUMS,
    "EmbeddingsResponse": Obj(
        required={"object": "str", "data": ListOf("Embedding"), "model": "str", "usage": "EmbeddingsUsage"},
        optional={"meta": "ResponseMeta"},
    ),
    # --- rerank
    "RerankResult": Obj(
        required={"index": "int"},
        optional={
            "relevance_score": "num",
            "logit": "num",
            "document": "str",
            "input": "InputUsage",
            "error": ITEM_ERROR,
        },
    ),
    "RerankResponse": Obj(
        required={"model": "str", "results": ListOf("RerankResult"), "usage": "Usage"},
        optional={"meta": "ResponseMeta"},
    ),
    # --- decisions
    "Answer": Obj(
        required={"type": Nullable("str")},
        optional={
            "input_coverage": Enum("complete"),
            "choice": "str",
            "noul": "num",
            "score": "num",
            "probabilities": MapOf("num"),
            "confidence": "num",
            "abstain_probability": "num",
            "legend": MapOf("str"),
            "error": ITEM_ERROR,
            "message": "str",
        },
    ),
    "SetAnswer": Obj(
        required={"selected": STRS, "probabilities": MapOf("num")},
        optional={"input_coverage": Enum("complete")},
    ),
    "DecisionStateResponse": Obj(
        required={"model": "str", "answers": MapOf("Answer"), "usage": "Usage"},
        optional={
            "spans": MapOf(ListOf("Span")),
            "sets": MapOf("SetAnswer"),
            "thresholds": MapOf("num"),
            "span_heads": MapOf("str"),
            "meta": "ResponseMeta",
        },
    ),
    "DecisionResponse": Obj(
        required={"model": "str", "answers": MapOf("Answer"), "usage": "Usage"},
        optional={
            "spans": MapOf(ListOf("Span")),
            "sets": MapOf("SetAnswer"),
            "thresholds": MapOf("num"),
            "span_heads": MapOf("str"),
            "states": MapOf("DecisionStateResponse"),
            "meta": "ResponseMeta",
        },
    ),
    # --- bundle
    "BundleResult": Obj(
        required={"id": "str", "status": "int"},
        optional={
            "decisions": "DecisionResponse",
            "classify": "ClassifyResponse",
            "embeddings": "EmbeddingsResponse",
            "rerank": "RerankResponse",
            "error": "ErrorBody",
        },
    ),
    "BundleResponse": Obj(required={"results": ListOf("BundleResult")}),
}

# the top-level kinds `check` is meant for (any name of SHAPES works)
KINDS = (
    "ModelList",
    "ModelCard",
    "Health",
    "Liveness",
    "ErrorResponse",
    "ClassifyResponse",
    "EmbeddingsResponse",
    "RerankResponse",
    "DecisionResponse",
    "BundleResponse",
)

_SCALARS: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "num": (int, float), "bool": (bool,)}


def check(kind: str, body: Any) -> list[str]:
    """How BODY (decoded JSON) departs from the contract's shape KIND: one line per violation,
    each naming its JSON path (`$.data[0].heads[0].kind`); empty when it conforms."""
    if kind not in SHAPES:
        raise KeyError(f"unknown contract shape {kind!r}; known: {', '.join(sorted(SHAPES))}")
    out: list[str] = []
    _check(kind, body, "$", out)
    return out


def _check(shape: Any, value: Any, path: str, out: list[str]) -> None:
    if isinstance(shape, str) and shape in SHAPES:
        _check(SHAPES[shape], value, path, out)
    elif isinstance(shape, tuple):  # one of several shapes
        trials = []
        for option in shape:
            found: list[str] = []
            _check(option, value, path, found)
            if not found:
                return
            trials.append(found)
        out.append(f"{path}: matches none of {shape}: {min(trials, key=len)[0]}")
    elif shape == "any":
        return
    elif isinstance(shape, str):
        kinds = _SCALARS[shape]
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            out.append(f"{path}: expected {shape}, got {_type(value)}")
    elif isinstance(shape, Nullable):
        if value is not None:
            _check(shape.shape, value, path, out)
    elif isinstance(shape, Enum):
        if value not in shape.values:
            out.append(f"{path}: {value!r} is not one of {list(shape.values)}")
    elif isinstance(shape, ListOf):
        if not isinstance(value, list):
            out.append(f"{path}: expected a list, got {_type(value)}")
            return
        for i, item in enumerate(value):
            _check(shape.shape, item, f"{path}[{i}]", out)
    elif isinstance(shape, MapOf):
        if not isinstance(value, dict):
            out.append(f"{path}: expected an object, got {_type(value)}")
            return
        for key, item in value.items():
            _check(shape.shape, item, f"{path}.{key}", out)
    elif isinstance(shape, Obj):
        if not isinstance(value, dict):
            out.append(f"{path}: expected an object, got {_type(value)}")
            return
        for name, inner in shape.required.items():
            if name not in value:
                out.append(f"{path}.{name}: required, missing")
            else:
                _check(inner, value[name], f"{path}.{name}", out)
        for name, inner in shape.optional.items():
            if name in value:
                _check(inner, value[name], f"{path}.{name}", out)
    else:  # a mistake in SHAPES
        raise TypeError(f"bad shape {shape!r} at {path}")


def _type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "num", str: "str", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )
