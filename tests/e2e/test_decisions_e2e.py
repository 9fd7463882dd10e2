"""Decision models end to end (R-API-4/5, R-LEN-1): a real `vllm-srun serve` process and the
official `typesafe-sdk` client, unmodified (it posts to /v1/systemone, the contract's alias of
/v1/decisions)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.contract_shapes import check
from tests.e2e.server import running_server
from vllm_srun.adapters.surfaces.decision_layout import confidence

typesafe_sdk = pytest.importorskip("typesafe_sdk")
from typesafe_sdk import (  # noqa: E402
    Choice,
    Noul,
    Score,
    TypeSafeAPIResponseValidationError,
    TypeSafeBadRequestError,
    TypeSafeClient,
)

pytestmark = pytest.mark.slow
LIMIT = 200


@pytest.fixture(scope="module")
def decision_server(decision_fixture) -> Iterator[str]:
    folder = decision_fixture("llama")
    with running_server(str(folder), "--max-model-len", str(LIMIT), "--result-cache-entries", "0") as base:
        yield base


@pytest.fixture()
def client(decision_server: str) -> Iterator[TypeSafeClient]:
    with TypeSafeClient(api_key="unused", base_url=decision_server, model="tiny-decision-llama") as c:
        yield c


def test_sdk_noul_choice_score(client: TypeSafeClient) -> None:
    result = client.system_one(
        state="I was charged twice. Please help.",
        questions={
            "billing": Noul(instructions="Is this about billing?"),
            "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": "An upset message"}),
            "urgency": Score(instructions="How urgent is it?", criteria=["Can wait", "This week", "Today"]),
        },
    )
    assert result.model == "tiny-decision-llama"
    assert 0 <= result.nouls["billing"].noul <= 1
    tone = result.choices["tone"]
    assert tone.choice in {"calm", "angry"} and set(tone.probabilities) == {"calm", "angry"}
    assert tone.confidence == pytest.approx(confidence(list(tone.probabilities.values())), abs=1e-12)
    urgency = result.scores["urgency"]
    assert urgency.legend == {0: "Can wait", 1: "This week", 2: "Today"}
    assert set(urgency.probabilities) == {0, 1, 2} and 0 <= urgency.score <= 2
    assert result.usage.input_tokens > 0 and result.usage.output_tokens == 0


def test_sdk_dict_questions_and_object_state(client: TypeSafeClient) -> None:
    result = client.system_one(
        state={"message": "I was charged twice. Please help.", "subject": "Duplicate charge"},
        questions={
            "spam": {"type": "noul", "criteria": {"true": "Unsolicited advertising", "false": None}},
            "team": {"type": "choice", "criteria": {"billing team": None, "shipping team": None, "other": None}},
        },
    )
    assert 0 <= result.nouls["spam"].noul <= 1
    assert result.choices["team"].choice in {"billing team", "shipping team", "other"}


def test_sdk_compressed_body(client: TypeSafeClient) -> None:
    """With zstd available the client compresses bodies of 1 KiB and more (Content-Encoding: zstd)."""
    from typesafe_sdk._core.compression import COMPRESSORS

    if "zstd" not in COMPRESSORS:
        pytest.skip("this typesafe-sdk sends plain bodies here (no zstd available)")
    state = "charged twice " + "x" * 1500  # over 1 KiB, few tokens (max_model_len is small here)
    result = client.system_one(state=state, questions={"billing": Noul(instructions="Is this about billing?")})
    assert 0 <= result.nouls["billing"].noul <= 1


def test_docs_example_runs(decision_server: str) -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "systemone_client.py"
    done = subprocess.run(
        [sys.executable, str(example), decision_server, "tiny-decision-llama"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "billing: P(yes) =" in done.stdout and "tone:" in done.stdout


def test_sdk_with_a_failed_question(client: TypeSafeClient) -> None:
    """/v1/systemone answers a failed question in its slot (the contract); the SDK's answer models
    have no error form, so it raises its response validation error (a TypeSafeAPIError) naming the
    slot, with our answer in its body. No valid question at all is a 400 it raises as such."""
    with pytest.raises(TypeSafeAPIResponseValidationError) as info:
        client.system_one(
            state="a short state",
            questions={"ok": Noul(instructions="Is this short?"), "long": Noul(instructions="is it good " * 100)},
        )
    error = info.value
    assert error.status == 200 and error.field_path == "answers.long.noul"
    assert error.body["answers"]["long"]["error"] == "max_length_exceeded" and error.body["answers"]["ok"]["noul"] >= 0
    with pytest.raises(TypeSafeBadRequestError) as bad:
        client.system_one(state="x", questions={"q": {"type": "set", "labels": ["a"], "colour": "red"}})
    assert bad.value.body["error"]["code"] == "invalid_request"
    assert "q: set questions do not take ['colour']" in str(bad.value)


def test_decisions_keeps_the_error_in_place_and_batches(decision_server: str) -> None:
    qs = {
        "ok": {"type": "noul", "instructions": "Is this short?"},
        "long": {"type": "noul", "instructions": "good " * 300},
    }
    r = httpx.post(f"{decision_server}/v1/decisions", json={"state": "a short state", "questions": qs}, timeout=60)
    assert r.status_code == 200 and "server-timing" in r.headers
    assert check("DecisionResponse", r.json()) == []
    answers = r.json()["answers"]
    assert answers["long"]["error"] == "max_length_exceeded" and 0 <= answers["ok"]["noul"] <= 1
    r = httpx.post(
        f"{decision_server}/v1/systemone/batches",
        timeout=60,
        json={"states": [{"id": "a", "state": "one"}, {"id": "b", "state": "two"}], "questions": qs},
    )
    assert [x["id"] for x in r.json()["results"]] == ["a", "b"]
    card = httpx.get(f"{decision_server}/v1/models", timeout=10).json()["data"][0]
    assert card["limits"]["max_input_tokens"] == LIMIT and card["engine_args"]["max_model_len"] == LIMIT
    assert card["family"] == "decision" and card["golden"]["status"] == "matched"


def test_states_answer_each_state_in_one_call(decision_server: str) -> None:
    body = {
        "state": "I was charged twice.",
        "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}},
        "states": {
            "reply": {
                "state": {"request": "Where is my parcel?", "answer": "It ships tomorrow."},
                "questions": {"kind": {"type": "choice", "choices": [{"key": "billing"}, {"key": "shipping"}]}},
            }
        },
    }
    r = httpx.post(f"{decision_server}/v1/decisions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert check("DecisionResponse", got) == []
    assert set(got["answers"]) == {"billing"} and set(got["states"]["reply"]["answers"]) == {"kind"}
    alone = httpx.post(f"{decision_server}/v1/decisions", json=body["states"]["reply"], timeout=60).json()
    assert abs(alone["answers"]["kind"]["confidence"] - got["states"]["reply"]["answers"]["kind"]["confidence"]) < 1e-4
    assert alone["usage"] == got["states"]["reply"]["usage"]


def _smollm2_available() -> bool:
    from tests.stores import session_store
    from vllm_srun.domain.errors import ModelNotFound

    try:
        session_store().resolve("SmolLM2-135M-Instruct", progress=lambda _m: None)
    except ModelNotFound:
        return False
    return True


def test_sdk_against_smollm2() -> None:
    """The real catalog decoder (converted from its GGUF), its shipped golden file matched."""
    if not _smollm2_available():
        pytest.skip("SmolLM2-135M-Instruct is not in the model store: `vllm-srun pull SmolLM2-135M-Instruct`")
    with running_server("SmolLM2-135M-Instruct", ready_timeout=300) as base:
        with TypeSafeClient(api_key="unused", base_url=base, model="SmolLM2-135M-Instruct", timeout=120) as c:
            result = c.system_one(
                state="I was charged twice for my order. Please refund me.",
                questions={
                    "billing": Noul(instructions="Is this message about billing?"),
                    "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": None}),
                },
            )
        card = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]
    assert 0 <= result.nouls["billing"].noul <= 1 and result.choices["tone"].choice in {"calm", "angry"}
    assert card["golden"]["status"] == "matched", card["golden"]
    assert card["dtype"] == "float32" and card["limits"]["max_input_tokens"] == 8192


def test_sdk_default_model_name_and_models_list(decision_server: str) -> None:
    """With one decision model served, the SDK works without naming one (it sends its default,
    `jev-latest`), and `models.list()` parses our /v1/models."""
    from typesafe_sdk.constants import DEFAULT_MODEL

    with TypeSafeClient(api_key="unused", base_url=decision_server) as plain:
        result = plain.system_one(state="I was charged twice.", questions={"billing": Noul(instructions="Billing?")})
        assert 0 <= result.nouls["billing"].noul <= 1
        listed = plain.models.list()
    names = [m.name for m in listed.models]
    assert names == ["tiny-decision-llama", DEFAULT_MODEL]
    assert all(len(m.release_date) == 10 and m.description for m in listed.models)
