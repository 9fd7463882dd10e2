"""What the front reads from and writes into request and response bodies, on any surface.

The front does not know the surfaces' schemas (the workers validate bodies): it reads only
`model` (which deployment), `options.deadline_ms` (the request's deadline) and
`options.return_meta`, rewrites `model` between the logical deployment name and the name a
worker knows, and keys its result cache on the rest of the content.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vllm_srun.domain.errors import InvalidRequest

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])

# fields that never change an answer (as in the worker's result cache)
_IGNORED_FIELDS = ("model", "user")
_IGNORED_OPTIONS = ("deadline_ms",)


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        doc = _decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the body is not JSON: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    return doc


def requested_model(doc: dict[str, Any]) -> str | None:
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("`model` must be a string")
    return model


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    options = doc.get("options")
    return options if isinstance(options, dict) else {}


def deadline_ms(doc: dict[str, Any]) -> float | None:
    """`options.deadline_ms` when it is a positive number (the worker validates it)."""
    value = _options(doc).get("deadline_ms")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def wants_meta(doc: dict[str, Any]) -> bool:
    return _options(doc).get("return_meta") is True


def for_worker(doc: dict[str, Any], body: bytes, worker_model: str | None, must_name: bool) -> bytes:
    """The body to send: `model` set to the worker's name when the client named one (or the
    worker serves several models), else the client's bytes unchanged."""
    if worker_model is None or doc.get("model") == worker_model:
        return body
    if "model" not in doc and not must_name:
        return body
    return _encode({**doc, "model": worker_model})


def for_client(payload: bytes, worker_model: str | None, logical: str) -> bytes:
    """The worker's answer with its top-level `model` renamed to the deployment's name.

    Only the top level is parsed (`Raw` values): nested data such as embeddings is copied
    byte for byte, never re-formatted, and costs a few microseconds instead of tens.
    """
    if worker_model is None or worker_model == logical or b'"model"' not in payload:
        return payload
    try:
        top = _top_level.decode(payload)
        named = top.get("model")
        if named is None or _decode(named) != worker_model:
            return payload
    except (msgspec.DecodeError, msgspec.ValidationError):
        return payload
    top["model"] = msgspec.Raw(_encode(logical))
    return _encode(top)


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
