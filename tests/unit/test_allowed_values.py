"""A refused enum value's 400 names the values the field takes (issue 45): read from the request
Struct itself, through options, lists, dicts and unions."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from vllm_srun.adapters.http.allowed_values import with_allowed_values
from vllm_srun.adapters.http.request_body import decode_request
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS
from vllm_srun.domain.errors import InvalidRequest


class _Item(msgspec.Struct):
    format: Literal["wav", "flac"] = "wav"


class _Request(msgspec.Struct):
    items: list[_Item | str]
    by_name: dict[str, _Item] = {}


def test_the_values_are_found_through_lists_dicts_and_unions() -> None:
    decoder = msgspec.json.Decoder(_Request)
    for body in (b'{"items":[{"format":"mp3"}]}', b'{"items":[],"by_name":{"a":{"format":"mp3"}}}'):
        with pytest.raises(msgspec.ValidationError) as caught:
            decoder.decode(body)
        assert with_allowed_values(str(caught.value), _Request).endswith("(one of: flac, wav)")
    assert (
        with_allowed_values("Expected `int`, got `str` - at `$.x`", _Request) == "Expected `int`, got `str` - at `$.x`"
    )


def _route(path: str) -> msgspec.json.Decoder:
    return next(schema.decoder for schema in SURFACE_SCHEMAS if schema.path == path)


@pytest.mark.parametrize(
    ("path", "body", "values"),
    [
        ("/v1/classify", b'{"input":"x","options":{"aggregation":"max"}}', "simple"),
        ("/v1/embeddings", b'{"input":"x","options":{"priority":"urgent"}}', "interactive, batch"),
        ("/v2/embed", b'{"texts":["x"],"truncate":"MIDDLE"}', "END, NONE, START"),
        ("/v2/embed", b'{"texts":["x"],"input_type":"poem"}', "search_query"),
    ],
)
def test_a_refused_enum_value_names_the_allowed_ones(path: str, body: bytes, values: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_request(_route(path), body, None, 1 << 20)
    message = caught.value.message
    assert "(one of: " in message and values in message, message
