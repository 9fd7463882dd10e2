"""The worker's OpenAPI document (R-API-12) is generated from the Structs, lists every route the
app serves with the answer Struct it encodes, carries the contract version, is served as JSON
and YAML alike; and the tests' answer checker (`tests/openapi_check.py`) catches departures."""

from __future__ import annotations

import json

import msgspec
import yaml
from litestar.exceptions import MethodNotAllowedException, NotFoundException

from tests.openapi_check import response_problems
from vllm_srun.adapters.http import app as worker_app
from vllm_srun.adapters.http.errors import error_parts
from vllm_srun.adapters.http.openapi import openapi_document, openapi_json, openapi_yaml
from vllm_srun.adapters.schemas.common import API_VERSION
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS, SurfaceSchema
from vllm_srun.adapters.surfaces.registry import SURFACE_ROUTES

GET_HANDLERS = ("list_models", "health", "live", "metrics", "openapi", "openapi_yaml_route")


def test_every_route_the_app_serves_is_documented_with_its_answer() -> None:
    doc = openapi_document()
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"] == API_VERSION == "2.3.0"
    for route in SURFACE_ROUTES:
        ok = doc["paths"][route.path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{route.schema.response_type.__name__}"}
    served = {path for name in GET_HANDLERS for path in getattr(worker_app, name).paths}
    assert served == {"/v1/models", "/health", "/health/live", "/metrics", "/openapi.json", "/openapi.yaml"}
    for path in served:
        assert "get" in doc["paths"][path], path
    assert doc["paths"]["/v1/bundle"]["post"]["responses"]["200"]["headers"]["Server-Timing"]


def test_a_field_added_to_a_struct_is_in_the_document() -> None:
    class Grown(msgspec.Struct):
        model: str
        added_by_a_helper: list[int]

    extra = SurfaceSchema("/v1/grown", "grown", msgspec.json.Decoder(Grown), Grown, Grown)
    doc = openapi_document((*SURFACE_SCHEMAS, extra))
    assert doc["components"]["schemas"]["Grown"]["properties"]["added_by_a_helper"]["type"] == "array"


def test_json_and_yaml_are_one_document() -> None:
    assert yaml.safe_load(openapi_yaml()) == json.loads(openapi_json()) == json.loads(json.dumps(openapi_document()))


def test_unknown_routes_and_methods_answer_invalid_request_with_their_status() -> None:
    for exc, status in ((NotFoundException(), 404), (MethodNotAllowedException(), 405)):
        got, body, _ = error_parts(exc)
        error = json.loads(body)["error"]
        assert got == status and error["code"] == "invalid_request" and "openapi.json" in error["message"]


def test_the_checker_catches_departures() -> None:
    def problems(method: str, path: str, status: int, body: object, media: str = "application/json") -> list[str]:
        return response_problems(method, path, status, media, json.dumps(body).encode())

    live = {"api_version": API_VERSION, "status": "alive"}
    assert problems("GET", "/health/live", 200, live) == []
    assert "'api_version' is a required property" in problems("GET", "/health/live", 200, {"status": "alive"})[0]
    assert "'dead' is not one of ['alive']" in problems("GET", "/health/live", 200, {**live, "status": "dead"})[0]
    assert "status 418 is not documented" in problems("GET", "/health/live", 418, live)[0]
    assert "content type" in problems("GET", "/health/live", 200, live, "text/plain")[0]
    assert "does not list" in problems("GET", "/v1/elsewhere", 200, live)[0]
    error = {"error": {"code": "invalid_request", "message": "no such route"}}
    assert problems("GET", "/v1/elsewhere", 404, error) == []
    assert problems("GET", "/v1/elsewhere", 404, {"detail": "Not Found"})
    health = {"api_version": API_VERSION, "status": "loading", "reason": None, "model": "m", "models": {}}
    assert problems("GET", "/health", 503, health) == [] and problems("GET", "/health", 503, error) == []
    usage = {"prompt_tokens": "1", "total_tokens": 1}
    found = problems("POST", "/v1/embeddings", 200, {"object": "list", "data": [], "model": "m", "usage": usage})
    assert any("usage/prompt_tokens" in p for p in found), found
