"""A fake decision model that reads images and videos (no torch): the `MediaQuestionAnswerer`
contract served the way a vision-language family serves it, with our real prompt side
(`families/decision_vision.MediaPrompt`, Qwen3.5's placeholders), the package's real
`VisionPreprocess` (`media/qwen_vision.py`: the media workers decode and preprocess with it) and a
hashed forward: a row's answer is decided by its token ids and its media's pixels alone, so
answers are deterministic, batch-invariant, and shared and unshared layouts agree exactly.

`FakeVisionFamily` reads packages whose `srun.json` names family `fake_vision` (its
`write_fixture` writes one: a word-level tokenizer with the vision tokens, a tiny
`preprocessor_config.json`). Its lanes are `text`, `shared` and `media`; `forwards` records every
forward's lane and row count (tests read it to see what ran where). Registered as a plugin with
the fake engine (`tests/plugin_dist.py`).
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

from tests.fake_family import WORDS, FakeForward
from vllm_srun.adapters.contracts import (
    MEDIA_LANE,
    AskedQuestion,
    Family,
    LoadContext,
    LoadedModel,
    PackageInfo,
    PreparedState,
    QuestionRow,
    SharedRow,
    StateMedium,
)
from vllm_srun.adapters.families.decision_prompts import choose_template
from vllm_srun.adapters.families.decision_rows import PromptTokens, prepare
from vllm_srun.adapters.families.decision_vision import (
    MODALITIES,
    RESERVED,
    MediaPrompt,
    image_limits,
    media_limits_card,
    video_limits,
)
from vllm_srun.adapters.families.fixtures.wordpiece_fixture import write_tiny_wordpiece_tokenizer
from vllm_srun.adapters.media.qwen_vision import VisionPreprocess
from vllm_srun.adapters.models.manifest import read_manifest, write_manifest
from vllm_srun.domain.inputs import media as rules
from vllm_srun.domain.inputs.input_budget import InputBudget
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.scheduling.shared_context import SHARED_LANE, should_share

FAMILY = "fake_vision"
ENGINE = "fake"  # the fake engine plugin serves it (`tests/fake_family.FakeEnginePlugin`)
MAX_INPUT_TOKENS = 512
# a tiny processor: patches of 4 pixels, 2 × 2 of them one token (8 × 8 pixels a token)
PREPROCESSOR = {
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 64,
    "max_pixels": 32 * 32,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
VIDEO_PREPROCESSOR = {**PREPROCESSOR, "min_pixels": 128, "max_pixels": 8 * 16 * 16}


def signature(media: Sequence[StateMedium]) -> list[int]:
    """What a row's media add to its hashed ids: each medium's kind and pixels (not its bytes)."""
    out = []
    for m in media:
        digest = hashlib.sha256(m.kind.encode() + np.ascontiguousarray(m.pixels).tobytes()).digest()
        out += [-2, int.from_bytes(digest[:4], "little")]
    return out


class FakeVisionModel(LoadedModel):
    family = FAMILY
    surfaces = frozenset({"decisions"})
    modalities = MODALITIES
    media_lane = MEDIA_LANE
    enable_shared_context = True

    def __init__(self, folder: Path, context: LoadContext) -> None:
        manifest = read_manifest(folder)
        self.device = context.device
        self.dtype = "float32"
        engine = context.build_engine(ENGINE, None)
        assert isinstance(engine, FakeForward)
        self.engine = self.fake = engine
        self.max_input_tokens = int(manifest["max_input_tokens"])
        raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
        template = choose_template(manifest.get("prompt_template"), lambda t: raw.token_to_id(t) is not None)
        self.tokens = PromptTokens(raw, template)
        self.preprocess = VisionPreprocess.from_folder(folder)
        self.prompt = MediaPrompt(self.tokens, self.preprocess)
        self.image_limits = image_limits()
        self.video_limits = video_limits(self.preprocess)
        self.max_video_tokens = int(manifest.get("max_video_tokens") or rules.DECISION_VIDEO_MAX_TOKENS)
        self.cache_tag = hashlib.sha256(json.dumps(template.as_dict(), sort_keys=True).encode()).hexdigest()[:16]
        cap = int(manifest.get("cap_tokens") or 4096)
        self.lanes = (
            Lane(DEFAULT_LANE, Accounting.PACKED, cap_tokens=cap),
            Lane(SHARED_LANE, Accounting.PACKED, cap_tokens=cap),
            Lane(MEDIA_LANE, Accounting.PACKED, cap_tokens=cap),
        )
        self.share_all = bool(manifest.get("share_all", True))
        self.media_seconds = float(manifest.get("media_seconds") or 0.0)  # a slow media forward (bench)
        self.forwards: list[tuple[str, int]] = []
        golden = folder / "golden.json"
        self.golden_file = golden if golden.is_file() else None

    # MediaQuestionAnswerer
    def media_tokens(self, kind: str, shape: tuple[int, ...]) -> int:
        return self.prompt.media_tokens(kind, shape)

    def min_media_tokens(self, kind: str) -> int:
        return self.prompt.min_media_tokens(kind)

    def max_media_tokens(self, kind: str) -> int:
        return self.prompt.max_media_tokens(kind)

    def prepare(
        self,
        state: Any,
        questions: Sequence[AskedQuestion],
        overflow: str | None = None,
        media: Sequence[StateMedium] = (),
        replay: bool = False,  # no deployment budget of its own: it changes nothing
    ) -> PreparedState:
        text = self.prompt.text(media)
        prepared = prepare(
            self.tokens,
            state,
            questions,
            self.max_input_tokens,
            lambda total: f"over the model's limit of {self.max_input_tokens} input tokens",
            InputBudget(None, overflow or "reject"),
            media,
            text,
        )
        return self.prompt.check(prepared, text)

    def share(self, prepared: PreparedState, allowed: bool = True) -> bool:
        lengths = [len(q.ids) for q in prepared.answerable]
        return should_share(len(prepared.state_ids), lengths, 0, allowed and self.share_all)

    # forwards
    def run(self, lane: str, payloads: Sequence[Any]) -> list[Any]:
        self.forwards.append((lane, len(payloads)))
        if lane == MEDIA_LANE and self.media_seconds:
            import time

            time.sleep(self.media_seconds * len(payloads))
        out: list[Any] = []
        for p in payloads:
            if (lane == MEDIA_LANE) != bool(p.media):
                raise AssertionError(f"a row {'with' if p.media else 'without'} media in the {lane} lane")
            if isinstance(p, SharedRow):
                out.append(
                    [
                        self.fake.answer(p.state_ids + q.ids + tuple(signature(p.media)), q.answer_ids)
                        for q in p.questions
                    ]
                )
            else:
                assert isinstance(p, QuestionRow)
                out.append(self.fake.answer(p.ids + tuple(signature(p.media)), p.answer_ids))
        return out

    def probe_payloads(self) -> list[Any]:
        return [QuestionRow(tuple(range(5, 5 + n)), (5, 6)) for n in (3, 7, 12)]

    def card_section(self) -> dict[str, Any]:
        return {
            **self.fake.describe(),
            "question_types": ["noul", "choice", "score", "set", "span"],
            "modalities": sorted(self.modalities),
            "limits": media_limits_card(self.preprocess, self.image_limits, self.video_limits),
            "media": {"lane": MEDIA_LANE},
            "fake": {"torch_loaded": "torch" in sys.modules},
        }


class FakeVisionFamily(Family):
    """Entry point of group `vllm_srun.families`."""

    name = FAMILY
    fixture_variants = ("all",)

    def detect(self, folder: Path) -> bool:
        return read_manifest(folder).get("family") == FAMILY

    def describe(self, folder: Path) -> PackageInfo:
        limit = int(read_manifest(folder)["max_input_tokens"])
        return PackageInfo(FAMILY, frozenset({"decisions"}), limit, engine_args=frozenset({"enable_shared_context"}))

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        return FakeVisionModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        write_fake_vision(out)
        return []


def write_fake_vision(out: Path, **manifest: Any) -> Path:
    """A fake_vision package in OUT (MANIFEST: srun.json fields to add or change)."""
    write_tiny_wordpiece_tokenizer(out, WORDS)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens(list(RESERVED))
    tok.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps({"model_type": "fake_vision"}) + "\n", encoding="utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR) + "\n", encoding="utf-8")
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR) + "\n", encoding="utf-8")
    write_manifest(
        out,
        {"family": FAMILY, "max_input_tokens": MAX_INPUT_TOKENS, "prompt_template": "plain", **manifest},
    )
    return out
