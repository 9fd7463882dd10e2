"""Every answer a test gets from a worker, checked against the worker's own OpenAPI document
(`src/adapters/http/openapi.py`, the one `GET /openapi.json` serves): its route and status are
documented, its content type is the documented one, and a JSON body validates against the
documented schema (jsonschema, draft 2020-12, as OpenAPI 3.1 uses). An unknown route's answer
must be an `ErrorResponse`.

    problems = response_problems("GET", "/v1/models", 200, "application/json", body)

`check(response)` raises AssertionError naming the problems of an `httpx.Response`. The
integration tests' in-process clients (`tests/integration/serving.py`) and every httpx request
to a worker the e2e tests start (`tests/e2e/conftest.py`) run it on each answer.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from vllm_srun.adapters.http.openapi import openapi_document

MAX_PROBLEMS = 5  # listed per answer


@functools.cache
def document() -> dict[str, Any]:
    return openapi_document()


@functools.cache
def _validator(pointer: str) -> Draft202012Validator:
    """A validator of the schema at POINTER (a JSON pointer into the document), its `$ref`s
    resolved within the document."""
    doc = document()
    schema: Any = doc
    for part in pointer.strip("/").split("/"):
        schema = schema[part.replace("~1", "/").replace("~0", "~")]
    return Draft202012Validator({**schema, "components": doc["components"]})


def _escape(path: str) -> str:
    return path.replace("~", "~0").replace("/", "~1")


def response_problems(method: str, path: str, status: int, content_type: str, body: bytes) -> list[str]:
    """How an answer departs from the document (empty: it conforms)."""
    doc = document()
    operation = doc["paths"].get(path, {}).get(method.lower())
    if operation is None:
        if status < 400:
            return [f"{method} {path}: {status} for a route the document does not list"]
        pointer = "/components/schemas/ErrorResponse"
        media = "application/json"
    else:
        responses = operation["responses"]
        if str(status) not in responses:
            return [f"{method} {path}: status {status} is not documented (documented: {sorted(responses)})"]
        content = responses[str(status)].get("content", {})
        media = next(iter(content), "")
        if not media:
            return []
        pointer = f"/paths/{_escape(path)}/{method.lower()}/responses/{status}/content/{_escape(media)}/schema"
    if content_type.split(";")[0].strip() != media:
        return [f"{method} {path} {status}: content type {content_type!r}, documented {media!r}"]
    if media != "application/json":
        return []
    try:
        value = json.loads(body)
    except ValueError as exc:
        return [f"{method} {path} {status}: not JSON ({exc})"]
    errors = sorted(_validator(pointer).iter_errors(value), key=lambda e: list(e.absolute_path))
    return [
        f"{method} {path} {status}: at {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:200]}"
        for e in errors[:MAX_PROBLEMS]
    ]


def check(response: httpx.Response) -> None:
    """AssertionError naming how RESPONSE (an httpx or httpx2 response) departs from the
    document; its body is read first."""
    response.read()
    request = response.request
    problems = response_problems(
        request.method,
        request.url.path,
        response.status_code,
        response.headers.get("content-type", ""),
        response.content,
    )
    assert not problems, "the answer departs from the worker's OpenAPI document:\n" + "\n".join(problems)
