"""The worker's OpenAPI 3.1 document (R-API-12), generated from the msgspec Structs the handlers
decode and the answers are built from: the POST routes from the surfaces' wire table
(`schemas/routes.py`), the GET routes from `schemas/models_list.py` and `schemas/health.py`, the
errors from the error table's `ErrorResponse`. A field added to any of those Structs is in the
document at once. `info.version` is the upstream contract's version these routes speak
(`API_VERSION`). Served as `GET /openapi.json` and, the same document, `GET /openapi.yaml`.

What it does not describe: the bytes the connection guard writes below the app (408, 431 and a
503 past `--max-connections`) are error bodies like the rest; a family's own card sections
(`kernels`, `decision`, …) are open fields of `ModelCard`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

from vllm_srun.adapters.http.errors import ErrorResponse
from vllm_srun.adapters.schemas.common import API_VERSION
from vllm_srun.adapters.schemas.health import Health, Liveness
from vllm_srun.adapters.schemas.models_list import ModelList
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS, SurfaceSchema

REF = "#/components/schemas/{name}"
YAML = "application/yaml"
SERVER_TIMING = {"$ref": "#/components/headers/ServerTiming"}
RETRY_AFTER = {"$ref": "#/components/headers/RetryAfter"}
# the error answers of a POST route (codes: docs/contract.md); 405 never happens there
POST_ERRORS = (
    ("400", "invalid_request or max_length_exceeded"),
    ("401", "unauthorized: no API key or a wrong one"),
    ("404", "model_not_found"),
    ("408", "request_timeout: the head or body did not arrive in time"),
    ("413", "request_too_large"),
    ("422", "unsupported_surface"),
    ("429", "overloaded or too_many_wrong_keys (Retry-After)"),
    ("431", "headers_too_large"),
    ("500", "internal_error"),
    ("503", "not_ready or too_many_connections (Retry-After)"),
    ("504", "deadline_exceeded"),
)
GET_ERRORS = (
    ("401", "unauthorized: no API key or a wrong one"),
    ("405", "invalid_request: the route takes GET"),
    ("429", "too_many_wrong_keys (Retry-After)"),
    ("500", "internal_error"),
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


def _json(schema: dict[str, Any], what: str, *, retry: bool = False) -> dict[str, Any]:
    headers = {"Server-Timing": SERVER_TIMING, **({"Retry-After": RETRY_AFTER} if retry else {})}
    return {"description": what, "headers": headers, "content": {"application/json": {"schema": schema}}}


def _errors(table: Iterable[tuple[str, str]]) -> dict[str, Any]:
    return {status: _json(_ref("ErrorResponse"), what, retry=status in ("429", "503")) for status, what in table}


def _post(route: SurfaceSchema, operation_id: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation_id,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(route.request_type.__name__)}},
            },
            "responses": {"200": _json(_ref(route.response_type.__name__), "OK"), **_errors(POST_ERRORS)},
        }
    }


def _get(operation_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"operationId": operation_id, "responses": {**responses, **_errors(GET_ERRORS)}}}


def _plain(media_type: str, what: str) -> dict[str, Any]:
    return {"description": what, "content": {media_type: {"schema": {"type": "string"}}}}


def openapi_document(routes: Iterable[SurfaceSchema] = SURFACE_SCHEMAS) -> dict[str, Any]:
    routes = list(routes)
    types: list[Any] = [ErrorResponse, ModelList, Health, Liveness]
    types += [t for r in routes for t in (r.request_type, r.response_type)]
    (_, components) = msgspec.json.schema_components(types, ref_template=REF)
    _one_surface_per_task(components)
    paths: dict[str, Any] = {}
    seen: set[str] = set()
    for r in routes:
        op = r.surface if r.surface not in seen else r.path.strip("/").replace("/", "_")  # unique ids
        seen.add(r.surface)
        paths[r.path] = _post(r, op)
    health_503 = {"anyOf": [_ref("Health"), _ref("ErrorResponse")]}  # not ready, or the connection cap
    paths["/v1/models"] = _get("list_models", {"200": _json(_ref("ModelList"), "the served models' cards")})
    paths["/health"] = _get(
        "health",
        {
            "200": _json(_ref("Health"), "every model is ready"),
            "503": _json(health_503, "not ready (a model is not, or the worker is at its connections)", retry=True),
        },
    )
    paths["/health/live"] = _get("live", {"200": _json(_ref("Liveness"), "the process answers HTTP")})
    paths["/metrics"] = _get("metrics", {"200": _plain("text/plain", "Prometheus text format 0.0.4")})
    paths["/openapi.json"] = _get(
        "openapi_json", {"200": _json({"type": "object"}, "this document (OpenAPI 3.1, JSON)")}
    )
    paths["/openapi.yaml"] = _get("openapi_yaml", {"200": _plain(YAML, "this document, as YAML")})
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "vllm-srun",
            "version": API_VERSION,
            "description": "The worker's routes: the upstream model-runtime contract (this version) and our "
            "extensions (docs/contract.md). Unknown routes answer 404 and known routes another method 405, "
            "both with an ErrorResponse of code invalid_request.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "headers": {
                "ServerTiming": {
                    "description": "The worker's time for the request in ms: parse, tokenize, queue, forward, "
                    "post, serialize, total (docs/serving.md)",
                    "schema": {"type": "string"},
                },
                "RetryAfter": {"description": "Seconds to wait before asking again", "schema": {"type": "string"}},
            },
        },
    }


def _one_surface_per_task(components: dict[str, Any]) -> None:
    """A bundle task holds its id and exactly one surface's body (`schemas/bundle.py` checks it
    when it decodes): the Struct's optional fields say "any of them", so the document says "one",
    and without `null` (a task naming a surface with null names none)."""
    task = components.get("BundleTask")
    if task is None:
        return
    surfaces = [name for name in task["properties"] if name != "id"]
    for name in surfaces:
        prop = task["properties"][name]
        prop.pop("default", None)
        options = [o for o in prop.pop("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            prop.update(options[0])
    task["oneOf"] = [{"required": ["id", name]} for name in surfaces]
    task["maxProperties"] = 2


@functools.cache
def openapi_json() -> bytes:
    """The document as JSON (built once: the Structs do not change while the process runs)."""
    return msgspec.json.encode(openapi_document())


@functools.cache
def openapi_yaml() -> bytes:
    """The same document as YAML."""
    document = msgspec.json.decode(openapi_json())
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()
