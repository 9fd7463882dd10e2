"""What the front reads from and writes into request and response bodies, on any surface.

The front does not know the surfaces' schemas (the workers validate fields): it decodes a body
the way a worker does (`adapters/http/request_body.py`), then reads only `model` (which
deployment), `options.deadline_ms` (the request's deadline) and `options.return_meta`, rewrites `model` between the logical deployment name and the name a
worker knows, and keys its result cache on the rest of the content.

A bundle (`/v1/bundle`, R-PERF-1) is dispatched as one unit to one deployment: its tasks may
name that deployment (or none); the front rewrites each task's `model` on the way in and each
result's `model` on the way out.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vllm_srun.domain.errors import InvalidRequest, quoted

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])

# fields that never change an answer (as in the worker's result cache)
_IGNORED_FIELDS = ("model", "user")
_IGNORED_OPTIONS = ("deadline_ms",)


BUNDLE_PATH = "/v1/bundle"
TASK_SURFACES = ("embeddings", "classify", "rerank", "decisions")


def requested_model(doc: dict[str, Any], path: str = "") -> str | None:
    """The model (deployment) a request names; for a bundle, the one its tasks name."""
    if path == BUNDLE_PATH:
        return _bundle_model(doc)
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest(f"`model` must be a string (got {quoted(model)})")
    return model


def _task_bodies(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The surface bodies of a bundle's tasks (what is not a mapping is left to the worker)."""
    tasks = doc.get("tasks")
    bodies = []
    for task in tasks if isinstance(tasks, list) else []:
        if isinstance(task, dict):
            bodies += [task[name] for name in TASK_SURFACES if isinstance(task.get(name), dict)]
    return bodies


def _bundle_model(doc: dict[str, Any]) -> str | None:
    named = {body.get("model") for body in _task_bodies(doc)} - {None}
    if any(not isinstance(model, str) for model in named):
        raise InvalidRequest("a task's `model` must be a string")
    if len(named) > 1:
        raise InvalidRequest(
            f"a bundle is dispatched to one deployment; its tasks name {', '.join(sorted(map(quoted, named)))}"
        )
    return next(iter(named), None)


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    options = doc.get("options")
    return options if isinstance(options, dict) else {}


def deadline_ms(doc: dict[str, Any]) -> float | None:
    """`options.deadline_ms` when it is a positive number (the worker validates it)."""
    value = _options(doc).get("deadline_ms")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def wants_meta(doc: dict[str, Any], path: str = "") -> bool:
    """Whether the request (or, for a bundle, any of its tasks) asks for `meta`."""
    if path == BUNDLE_PATH:
        return any(_options(body).get("return_meta") is True for body in _task_bodies(doc))
    return _options(doc).get("return_meta") is True


def for_worker(doc: dict[str, Any], body: bytes, worker_model: str | None, must_name: bool, path: str = "") -> bytes:
    """The body to send: `model` set to the worker's name when the client named one (or the
    worker serves several models), else the client's bytes unchanged."""
    if path == BUNDLE_PATH:
        return _bundle_for_worker(doc, body, worker_model, must_name)
    if worker_model is None or doc.get("model") == worker_model:
        return body
    if "model" not in doc and not must_name:
        return body
    return _encode({**doc, "model": worker_model})


def _bundle_for_worker(doc: dict[str, Any], body: bytes, worker_model: str | None, must_name: bool) -> bytes:
    bodies = _task_bodies(doc)
    if worker_model is None or all(
        b.get("model") == worker_model or ("model" not in b and not must_name) for b in bodies
    ):
        return body
    for task_body in bodies:  # `doc` is this request's own parse: rewriting it in place is safe
        if "model" in task_body or must_name:
            task_body["model"] = worker_model
    return _encode(doc)


def for_client(payload: bytes, worker_model: str | None, logical: str, path: str = "") -> bytes:
    """The worker's answer with its top-level `model` (and each of a decisions answer's `states`)
    renamed to the deployment's name.

    Only the top level is parsed (`Raw` values): nested data such as embeddings is copied
    byte for byte, never re-formatted, and costs a few microseconds instead of tens.
    """
    if worker_model is None or worker_model == logical or b'"model"' not in payload:
        return payload
    if path == BUNDLE_PATH:
        return _bundle_for_client(payload, worker_model, logical)
    try:
        top = _top_level.decode(payload)
        named = top.get("model")
        if named is None or _decode(named) != worker_model:
            return payload
    except (msgspec.DecodeError, msgspec.ValidationError):
        return payload
    top["model"] = msgspec.Raw(_encode(logical))
    states = top.get("states")  # a decisions answer's further states each name the model too
    if states is not None:
        try:
            entries = _decode(states)
        except msgspec.DecodeError:
            entries = None
        if isinstance(entries, dict):
            for entry in entries.values():
                if isinstance(entry, dict) and entry.get("model") == worker_model:
                    entry["model"] = logical
            top["states"] = msgspec.Raw(_encode(entries))
    return _encode(top)


def _bundle_for_client(payload: bytes, worker_model: str, logical: str) -> bytes:
    """A bundle's answer with every result's `model` renamed (results are parsed in full)."""
    try:
        doc = _decode(payload)
    except msgspec.DecodeError:
        return payload
    results = doc.get("results") if isinstance(doc, dict) else None
    for result in results if isinstance(results, list) else []:
        for name in TASK_SURFACES:
            answer = result.get(name) if isinstance(result, dict) else None
            if isinstance(answer, dict) and answer.get("model") == worker_model:
                answer["model"] = logical
    return _encode(doc)


def cache_key(path: str, doc: dict[str, Any]) -> bytes:
    """The request's content without answer-neutral fields, keys sorted (R-PERF-3)."""
    content = {key: value for key, value in doc.items() if key not in _IGNORED_FIELDS}
    options = content.pop("options", None)
    if isinstance(options, dict):
        kept = {key: value for key, value in options.items() if key not in _IGNORED_OPTIONS}
        if kept:
            content["options"] = kept
    elif options is not None:
        content["options"] = options
    return path.encode() + b"\0" + _encode(content, order="sorted")
