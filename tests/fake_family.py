"""A fake model family and engine: the contracts of `adapters/contracts/` implemented without
torch, the way a third-party package would (it registers through entry points; see
`tests/plugin_dist.py`).

`FakeFamily` reads packages whose `srun.json` names family `fake` (its `write_fixture` writes
one) and serves every surface from one model: embeddings, classify, rerank and decisions. Its
engine (`FakeForward`, built by `FakeEnginePlugin` for the `fake` kind) answers each row from a
hash of the row's token ids, so answers are deterministic and batch-invariant, and the shared
and unshared layouts of a decision request agree exactly. The card reports whether torch is
loaded in the process (`fake.torch_loaded`), which end-to-end tests assert is never the case.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tests.fakes import FakeDevice
from vllm_srun.adapters.contracts import (
    CalibrationForward,
    EngineRefused,
    EngineRequest,
    Family,
    LoadContext,
    LoadedModel,
    LogitsRow,
    PackageInfo,
    Progress,
)
from vllm_srun.adapters.families.decision_prompts import choose_template
from vllm_srun.adapters.families.decision_rows import (
    AskedQuestion,
    PreparedState,
    PromptTokens,
    QuestionRow,
    SharedRow,
    prepare,
)
from vllm_srun.adapters.families.fixtures.wordpiece_fixture import write_tiny_wordpiece_tokenizer
from vllm_srun.adapters.models.manifest import read_manifest, write_manifest
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.domain.inputs.input_budget import InputBudget
from vllm_srun.domain.scheduling.lanes import Accounting, Lane, forward_tokens
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.scheduling.shared_context import SHARED_LANE, should_share

FAMILY = "fake"
DIMENSIONS = 8
LABELS = ["calm", "urgent", "spam"]
MAX_INPUT_TOKENS = 96
WORDS = [
    "the",
    "a",
    "is",
    "of",
    "to",
    "and",
    "in",
    "on",
    "for",
    "yes",
    "no",
    "cat",
    "dog",
    "bird",
    "red",
    "blue",
    "movie",
    "great",
    "fun",
    "boring",
    "music",
    "plot",
    "review",
    "good",
    "bad",
    "order",
    "refund",
    "team",
    "billing",
    "shipping",
    "today",
    "week",
    "help",
    "please",
    "paris",
    "france",
    "capital",
]


def _values(ids: Sequence[int], salt: str, n: int) -> np.ndarray:
    """N floats in [-1, 1) decided by IDS alone (never by the batch a row is in)."""
    digest = hashlib.sha256((salt + ",".join(map(str, ids))).encode()).digest()
    seed = int.from_bytes(digest[:8], "little")
    return np.random.default_rng(seed).uniform(-1.0, 1.0, n)


class FakeForward:
    name = "fake"
    accounting = Accounting.PACKED
    kernel_switch_tokens: int | None = None
    forward_threads = False  # no threads to vary: a hash of the ids
    determinism = "batch_invariant"  # a row's answer is decided by its ids alone

    def describe(self) -> dict[str, Any]:
        return {"kernels": {"fake": "sha256 of the token ids"}}

    def vector(self, ids: Sequence[int]) -> np.ndarray:
        v = _values(ids, "embed", DIMENSIONS).astype(np.float32)
        return v / np.float32(np.linalg.norm(v))

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        return (4 * _values(ids, "logits", len(LABELS))).astype(np.float32)

    def answer(self, ids: Sequence[int], answer_ids: Sequence[int]) -> np.ndarray:
        x = 3 * _values([*ids, -1, *answer_ids], "answer", len(answer_ids))
        e = np.exp(x - x.max())
        return e / e.sum()


class FakeEnginePlugin:
    """Entry point of group `vllm_srun.engines`: serves the `fake` kind only."""

    name = "fake"

    def build(self, request: EngineRequest, progress: Progress) -> FakeForward:
        if request.kind != FAMILY:
            raise EngineRefused(f"the fake engine serves fake models only (this is a {request.kind} model)")
        return FakeForward()


class FakeModel(LoadedModel):
    family = FAMILY
    dimensions = DIMENSIONS
    normalized = True
    multi_label = False
    enable_shared_context = True

    def __init__(self, folder: Path, context: LoadContext) -> None:
        manifest = read_manifest(folder)
        self.surfaces = frozenset(manifest["surfaces"])
        self.device = context.device
        self.dtype = "float32"
        engine = context.build_engine(FAMILY, None)
        assert isinstance(engine, FakeForward)
        self.engine = self.fake = engine
        self.max_input_tokens = int(manifest["max_input_tokens"])
        self.labels = list(LABELS)
        self.tokenizer = TextTokenizer.from_folder(folder)
        raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
        template = choose_template(manifest.get("prompt_template"), lambda t: raw.token_to_id(t) is not None)
        self.tokens = PromptTokens(raw, template)
        self.cache_tag = hashlib.sha256(json.dumps(template.as_dict(), sort_keys=True).encode()).hexdigest()[:16]
        self.lanes = (Lane(DEFAULT_LANE, Accounting.PACKED), Lane(SHARED_LANE, Accounting.PACKED))
        golden = folder / "golden.json"
        self.golden_file = golden if golden.is_file() else None

    # TextEmbedder, TextClassifier, PairScorer
    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Encoded]:
        limit = min(max_length or self.max_input_tokens, self.max_input_tokens)
        return self.tokenizer.encode(list(texts), max_length=limit, truncate=truncate)

    # QuestionAnswerer
    def prepare(
        self, state: Any, questions: Sequence[AskedQuestion], overflow: str | None = None, replay: bool = False
    ) -> PreparedState:  # no deployment budget of its own: REPLAY changes nothing
        return prepare(
            self.tokens,
            state,
            questions,
            self.max_input_tokens,
            lambda total: f"over the model's limit of {self.max_input_tokens} input tokens",
            InputBudget(None, overflow or "reject"),
        )

    def share(self, prepared: PreparedState, allowed: bool = True) -> bool:
        return should_share(len(prepared.state_ids), [len(q.ids) for q in prepared.answerable], 0, allowed)

    # forwards
    def run(self, lane: str, payloads: Sequence[Any]) -> list[Any]:
        if isinstance(self.device, FakeDevice):  # a fake GPU: its clock and memory see the forward
            self.device.ran(forward_tokens((_row_tokens(p) for p in payloads), Accounting.PACKED))
        out: list[Any] = []
        for p in payloads:
            if isinstance(p, SharedRow):
                out.append([self.fake.answer(p.state_ids + q.ids, q.answer_ids) for q in p.questions])
            elif isinstance(p, QuestionRow):
                out.append(self.fake.answer(p.ids, p.answer_ids))
            elif isinstance(p, LogitsRow):
                out.append(self.fake.logits(p.encoded.ids))
            else:
                out.append(self.fake.vector(p.ids))
        return out

    def calibration_forward(self, tokens: int) -> CalibrationForward:
        """Rows of the input limit's length adding up to about TOKENS (R-DEV-2)."""
        n = self.max_input_tokens
        lengths = [n] * max(1, tokens // n) + ([tokens % n] if tokens > n and tokens % n >= 8 else [])
        rows = [Encoded([1 + (r + i) % 30 for i in range(k)], [0] * k, False, k) for r, k in enumerate(lengths)]
        return CalibrationForward(DEFAULT_LANE, rows, forward_tokens(lengths, Accounting.PACKED))

    def probe_payloads(self) -> list[Encoded]:
        return self.tokenize(
            ["cat", "the dog is red", "a great movie with good music and a boring plot"], truncate=True
        )

    def card_section(self) -> dict[str, Any]:
        return {**self.fake.describe(), "fake": {"torch_loaded": "torch" in sys.modules}}


def _row_tokens(payload: Any) -> int:
    if isinstance(payload, SharedRow):
        return len(payload.state_ids) + sum(len(q.ids) for q in payload.questions)
    if isinstance(payload, QuestionRow):
        return len(payload.ids)
    if isinstance(payload, LogitsRow):
        return len(payload.encoded.ids)
    return len(payload.ids)


def golden_requests() -> list[dict[str, Any]]:
    return [
        {"surface": "embeddings", "body": {"input": ["the cat", "a great movie"]}},
        {"surface": "classify", "body": {"input": ["please help with my order today"]}},
        {"surface": "rerank", "body": {"query": "capital of france", "documents": ["paris", "a red bird"]}},
        {
            "surface": "decisions",
            "body": {
                "state": "the movie was great fun",
                "questions": {
                    "good": {"type": "noul", "instructions": "is the review good"},
                    "stars": {"type": "score", "criteria": ["bad", "good", "great"]},
                },
            },
        },
    ]


class FakeFamily(Family):
    """Entry point of group `vllm_srun.families`."""

    name = FAMILY
    fixture_variants = ("all",)

    def detect(self, folder: Path) -> bool:
        return read_manifest(folder).get("family") == FAMILY

    def describe(self, folder: Path) -> PackageInfo:
        manifest = read_manifest(folder)
        return PackageInfo(FAMILY, frozenset(manifest["surfaces"]), int(manifest["max_input_tokens"]))

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        return FakeModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        write_tiny_wordpiece_tokenizer(out, WORDS)
        (out / "config.json").write_text(json.dumps({"model_type": "fake", "seed": seed}) + "\n", encoding="utf-8")
        write_manifest(
            out,
            {
                "family": FAMILY,
                "surfaces": ["embeddings", "classify", "rerank", "decisions"],
                "max_input_tokens": MAX_INPUT_TOKENS,
                "prompt_template": "plain",
            },
        )
        return golden_requests()
