"""The OpenAPI 3.1 document, generated from the same msgspec Structs the handlers decode."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from vllm_srun.adapters.http.errors import ErrorResponse
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS, SurfaceSchema

REF = "#/components/schemas/{name}"


def _error_responses() -> dict[str, Any]:
    ref = {"$ref": REF.format(name="ErrorResponse")}
    out = {}
    for status, what in (
        ("400", "invalid_request"),
        ("404", "model_not_found"),
        ("408", "request_timeout"),
        ("413", "request_too_large"),
        ("422", "unsupported_surface"),
        ("429", "overloaded"),
        ("431", "headers_too_large"),
        ("500", "internal_error"),
        ("503", "not_ready or too_many_connections"),
        ("504", "deadline_exceeded"),
    ):
        out[status] = {"description": what, "content": {"application/json": {"schema": ref}}}
    return out


def openapi_document(routes: Iterable[SurfaceSchema] = SURFACE_SCHEMAS) -> dict[str, Any]:
    routes = list(routes)
    types = [ErrorResponse] + [t for r in routes for t in (r.request_type, r.response_type)]
    (_, components) = msgspec.json.schema_components(types, ref_template=REF)
    paths: dict[str, Any] = {}
    seen: set[str] = set()
    for r in routes:
        op = r.surface if r.surface not in seen else r.path.strip("/").replace("/", "_")  # unique ids
        seen.add(r.surface)
        paths[r.path] = {
            "post": {
                "operationId": op,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": REF.format(name=r.request_type.__name__)}}},
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {
                            "application/json": {"schema": {"$ref": REF.format(name=r.response_type.__name__)}}
                        },
                    },
                    **_error_responses(),
                },
            }
        }
    plain = {"200": {"description": "OK"}}
    paths["/v1/models"] = {"get": {"operationId": "list_models", "responses": plain}}
    paths["/health"] = {"get": {"operationId": "health", "responses": {**plain, "503": {"description": "not ready"}}}}
    paths["/health/live"] = {"get": {"operationId": "live", "responses": plain}}
    paths["/metrics"] = {"get": {"operationId": "metrics", "responses": plain}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "vllm-srun", "version": "0.1.0"},
        "paths": paths,
        "components": {"schemas": components},
    }
