"""Issue 9, class 3: about 1,000 levels of nesting in a field typed as any JSON value (`state`,
`instructions`, object documents) raised a recursion error answered 500 by the worker, and the
front answered 500 for any such body. Now both answer 400 past 64 levels, whatever the depth."""

from __future__ import annotations

import json

import pytest

from tests.hostile.clients import Server, model_name, post

pytestmark = pytest.mark.slow
HOLE = '"__deep__"'


def nested(levels: int) -> str:
    return "[" * levels + '"x"' + "]" * levels


@pytest.mark.parametrize("levels", [65, 1000, 200_000])
@pytest.mark.parametrize("where", ["state", "instructions", "document", "bundle"])
def test_deep_json_is_a_400(target: Server, where: str, levels: int) -> None:
    if where == "bundle":  # a task's state: the bundle's body is read like any other
        path = "/v1/bundle"
        task = {"model": model_name(target, "decide"), "state": "__deep__", "questions": {"q": {"type": "noul"}}}
        body = {"tasks": [{"id": "t", "decisions": task}]}
    elif where == "document":
        path = "/v1/rerank"
        body = {"model": model_name(target, "embed"), "query": "q", "documents": [{"text": "t", "meta": "__deep__"}]}
    else:
        path = "/v1/decisions"
        question = {"type": "noul", "instructions": "__deep__" if where == "instructions" else "is it?"}
        state = "__deep__" if where == "state" else "s"
        body = {"model": model_name(target, "decide"), "state": state, "questions": {"q": question}}
    raw = json.dumps(body).replace(HOLE, nested(levels)).encode()
    answer = post(target, path, raw)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["code"] == "invalid_request"
    assert "deeper than 64 levels" in answer.json()["error"]["message"]
