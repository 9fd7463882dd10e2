"""A Qwen3.5 package in the decision family (R-PKG-2), through HTTP: the `qwen3_5` (text-only) and
`qwen3_5_mm` (text part of a multimodal checkpoint) fixtures answer noul, choice, score, set and
span questions; every forward's probabilities equal `transformers`' reference model read on the
same ids (every logit within 1e-4, so every answer too), with the ids our tokenizer made equal to transformers' tokenizer's; the
shared layout (R-SC) equals the unshared one; the card says what runs (FP32 on a CPU, R-DT-1, on
the C++ delta rule and layer stack where a compiler is here) and the batch-invariance probe's
verdict (R-BAT-5)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.serving import serving
from tests.integration.test_decisions_shared import assert_close, questions
from vllm_srun.adapters.engines.cpp_ops import compiler
from vllm_srun.adapters.models.answer_logits import pick
from vllm_srun.adapters.readiness.probe import probe_model
from vllm_srun.domain.settings.engine_args import EngineArgs

TOL = 1e-4
STATE = {"review": "the movie was great fun and the music was good", "stars": [4, 5]}
MIXED = {
    "n": {"type": "noul", "instructions": "is the review positive"},
    "c": {"type": "choice", "instructions": "what is the tone", "criteria": {"positive": None, "negative": "bad"}},
    "s": {"type": "score", "instructions": "how good is the movie", "criteria": ["bad", "boring", "good", "great"]},
    "t": {"type": "set", "instructions": "which topics", "labels": ["music", {"key": "plot", "description": "story"}]},
    "w": {"type": "span", "labels": ["movie"], "threshold": 0.0},
}


@pytest.fixture(scope="module")
def served(decision_fixture, tmp_path_factory) -> Iterator[tuple[Any, Any, dict[str, Path]]]:
    """qwen3_5 always shared (break-even pinned to 0), qwen3_5 never shared, and qwen3_5_mm
    sharing by its measured break-even."""
    text, mm = decision_fixture("qwen3_5"), decision_fixture("qwen3_5_mm")
    shared = tmp_path_factory.mktemp("q35") / "tiny-q35-shared"
    shutil.copytree(text, shared)
    manifest = json.loads((shared / "srun.json").read_text())
    manifest["shared_context"] = {"break_even_tokens": 0}
    (shared / "srun.json").write_text(json.dumps(manifest))
    models = [
        (shared, EngineArgs(batch_window_ms=0, enable_shared_context=True)),
        (text, EngineArgs(batch_window_ms=0, enable_shared_context=False)),
        (mm, EngineArgs(batch_window_ms=0, enable_shared_context=True)),
    ]
    with serving(models, result_cache_entries=0) as (client, rt):
        assert all(m.ready for m in rt.models.values()), {n: m.reason for n, m in rt.models.items()}
        yield client, rt, {"shared": shared, "text": text, "mm": mm}


def ask(client: Any, model: str, qs: dict[str, Any], state: Any = STATE) -> dict[str, Any]:
    r = client.post("/v1/decisions", json={"model": model, "state": state, "questions": qs})
    assert r.status_code == 200, r.text
    return r.json()


class Recorder:
    """The model's decoder engine, keeping every (prompt ids, next-token logits) it computes."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: list[tuple[list[int], torch.Tensor]] = []
        self.states: dict[int, list[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def logits_at(self, rows: Any) -> Any:
        out = self.engine.logits_at(rows)
        for row, logits in zip(rows, out, strict=True):
            self.seen.append((list(row), logits))
        return out

    def answer_logits(self, rows: Any, tokens: Any) -> Any:
        return pick(self.logits_at(rows), tokens)

    def prefix_kv(self, state_ids: Any) -> Any:
        state = self.engine.prefix_kv(state_ids)
        self.states[id(state)] = list(state_ids)
        return state

    def branch_logits(self, state: Any, branches: Any, *, chunk: int) -> Any:
        out = self.engine.branch_logits(state, branches, chunk=chunk)
        for branch, logits in zip(branches, out, strict=True):
            self.seen.append((self.states[id(state)] + list(branch), logits))
        return out


def _reference(folder: Path):
    transformers = pytest.importorskip("transformers")
    config = json.loads((folder / "config.json").read_text())
    cls = (
        transformers.Qwen3_5ForConditionalGeneration
        if config["model_type"] == "qwen3_5"
        else transformers.Qwen3_5ForCausalLM
    )
    return cls.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize(("name", "folder"), [("tiny-decision-qwen3_5", "text"), ("tiny-decision-qwen3_5_mm", "mm")])
def test_every_forward_equals_the_transformers_reference(served, name: str, folder: str) -> None:
    client, rt, folders = served
    model = rt.models[name].model
    recorder = model.decoder_engine = Recorder(model.decoder_engine)
    try:
        body = ask(client, name, MIXED)
    finally:
        model.decoder_engine = recorder.engine
    assert set(body["answers"]) == {"n", "c", "s", "t.music", "t.plot", "w"} and "error" not in json.dumps(body)
    assert body["sets"]["t"]["probabilities"] and body["spans"]["w"]
    reference = _reference(folders[folder])
    for ids, logits in recorder.seen:  # every logit of the vocabulary, not only the answers'
        with torch.no_grad():
            expected = reference(input_ids=torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(logits, expected, atol=TOL, rtol=0)
    # noul, choice, score, two set labels, the span's presence row and its word rows
    assert len(recorder.seen) >= 8


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_5_mm"])
def test_our_tokenizer_gives_transformers_ids(served, variant: str) -> None:
    transformers = pytest.importorskip("transformers")
    _client, rt, folders = served
    folder = folders["text" if variant == "qwen3_5" else "mm"]
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = rt.models[f"tiny-decision-{variant}"].model
    template = model.tokens.template
    texts = [
        template.state_part(json.dumps(STATE)),
        template.question_part("Is the review positive?\nAnswer with Yes or No."),
        "Ünïcödé naïve café — 1234 tokens, émojis 🙂 and\ttabs\n\nnewlines",
    ]
    for text in texts:
        assert list(model.tokens.encode([text])[0]) == theirs(text, add_special_tokens=False)["input_ids"], text


@pytest.mark.parametrize("n", [1, 2, 16, 128])
def test_shared_answers_equal_unshared(served, n: int) -> None:
    client, _, _ = served
    qs = questions(n)
    shared = ask(client, "tiny-q35-shared", qs)
    alone = ask(client, "tiny-decision-qwen3_5", qs)
    assert list(shared["answers"]) == list(qs)
    assert_close(shared["answers"], alone["answers"], TOL)
    assert shared["usage"] == alone["usage"]


def test_shared_set_and_span_equal_unshared(served) -> None:
    client, _, _ = served
    labels = {"t": MIXED["t"], "w": MIXED["w"]}
    shared, alone = ask(client, "tiny-q35-shared", labels), ask(client, "tiny-decision-qwen3_5", labels)
    for key, a in alone["answers"].items():
        assert abs(shared["answers"][key]["noul"] - a["noul"]) < TOL
    for a, b in zip(shared["spans"]["w"], alone["spans"]["w"], strict=True):
        assert (a["start"], a["end"]) == (b["start"], b["end"]) and abs(a["probability"] - b["probability"]) < TOL


def test_card_says_what_runs(served) -> None:
    client, rt, _ = served
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    for name in ("tiny-q35-shared", "tiny-decision-qwen3_5", "tiny-decision-qwen3_5_mm"):
        card = cards[name]
        assert card["family"] == "decision" and card["dtype"] == "float32"  # published BF16, on a CPU
        assert card["backbone"] == {"architecture": "qwen3_5", "linear_attention_layers": 3, "full_attention_layers": 1}
        if compiler(os.environ) is not None:  # the C++ kernels and layer stack of a CPU in FP32 (cpu_hybrid.py)
            kernels = card["kernels"]
            assert kernels["delta_rule"].startswith("C++") and kernels["conv"].startswith("C++"), kernels
            assert kernels["layers"].startswith("every layer and the final norm in one C++ call"), kernels
        # the card says what the probe finds (eager forwards: a row's last bits move with its company)
        served_model = rt.models[name]
        found = bool(probe_model(served_model.model))
        assert served_model.serving.batch_invariant is found
        assert card["numerics"] == ("exact" if found else "approximate")
        assert served_model.model.engine.determinism == "rows_alone"
    sc = cards["tiny-decision-qwen3_5_mm"]["shared_context"]
    assert sc["enabled"] is True and sc["break_even_source"] == "measured" and sc["break_even_tokens"] >= 0
    assert cards["tiny-q35-shared"]["shared_context"]["break_even_source"] == "manifest"
    assert cards["tiny-decision-qwen3_5"]["shared_context"]["enabled"] is False


@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_5_mm"])
def test_fixtures_are_deterministic_by_seed_and_decision_packages(tmp_path: Path, variant: str) -> None:
    from vllm_srun.adapters.families.registry import FamilyRegistry
    from vllm_srun.app.fixtures import write_fixture

    a = write_fixture(tmp_path / "a", "decision", variant, 3, golden=False)
    b = write_fixture(tmp_path / "b", "decision", variant, 3, golden=False)
    c = write_fixture(tmp_path / "c", "decision", variant, 4, golden=False)
    files = sorted(p.name for p in a.iterdir())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert {"vocab.json", "merges.txt", "tokenizer.json", "srun.json"} <= set(files)
    assert FamilyRegistry().family_for(a).name == "decision"
    (b / "srun.json").unlink()  # as transformers saved it: a causal LM of a Qwen3.5 model_type
    assert FamilyRegistry().family_for(b).name == "decision"
    config = json.loads((a / "config.json").read_text())
    assert config["model_type"] == ("qwen3_5" if variant.endswith("mm") else "qwen3_5_text")
