"""The decision family's loaded model (`DecisionModel`, R-PKG-2, R-SC, R-BAT-6/7): a decoder-only
LM read from its package (`load_lm`), its prompts, its lanes (`text`, `shared`) and forwards, the
shared-context break-even it measures at load, and its card section. `decision.py` is the family
that loads it (or, for a package that reads images and videos, `decision_vision.VisionDecisionModel`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import (
    CalibrationForward,
    LoadContext,
    LoadedModel,
    StateMedium,
    as_decoder_engine,
)
from vllm_srun.adapters.families.decision_prompts import (
    MAX_LEVELS,
    MAX_OPTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    choose_template,
)
from vllm_srun.adapters.families.decision_rows import (
    AskedQuestion,
    PreparedState,
    PromptTokens,
    QuestionRow,
    SharedRow,
    prepare,
)
from vllm_srun.adapters.models.answer_logits import pick
from vllm_srun.adapters.models.manifest import read_manifest
from vllm_srun.adapters.models.qwen3_5_config import MODEL_TYPES as QWEN3_5_TYPES
from vllm_srun.adapters.models.qwen3_5_config import text_fields
from vllm_srun.domain.inputs.input_budget import InputBudget, in_force
from vllm_srun.domain.scheduling.lanes import Accounting, Lane, forward_tokens
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.scheduling.shared_context import SHARED_LANE, BreakEven, break_even_tokens, should_share
from vllm_srun.domain.settings.dtypes import auto_dtype, dtype_refusal, resolve_dtype
from vllm_srun.domain.settings.profiles import precision_is_published, serving_profile
from vllm_srun.domain.worker.calibration import TIME_CAP_S

DECODER_MODEL_TYPES = frozenset({"llama", "smollm", "smollm2", "qwen2", "qwen3"}) | QWEN3_5_TYPES
CPU_CAP_TOKENS = 4096  # R-BAT-7: merged forwards on a CPU stay within this many counted tokens
BRANCH_CHUNK = 64  # questions of one shared row run this many at a time (memory)
CALIBRATION_ROW_TOKENS = 512  # calibration forwards are prompts of this many tokens (or the input limit)
SURFACES = frozenset({"decisions"})


def read_config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def package_limit(folder: Path) -> int:
    """The package's own input limit: srun.json `max_input_tokens`, at most the model's positions."""
    config = text_fields(read_config(folder))  # a multimodal Qwen3.5's text model says it
    positions = int(config.get("max_position_embeddings") or 2048)
    declared = read_manifest(folder).get("max_input_tokens")
    return min(int(declared), positions) if declared else positions


def load_lm(folder: Path, dtype: Any, device: Any) -> Any:
    """Our LM for FOLDER by its config: `Qwen35VisionLM` for a Qwen3.5 package with its vision tower
    and image processor config, `Qwen35LM` for another Qwen3.5 package, else `DecoderLM`."""
    if str(read_config(folder).get("model_type", "")).lower() in QWEN3_5_TYPES:
        from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
        from vllm_srun.adapters.models.qwen3_5_mm import Qwen35VisionLM, reads_media

        if reads_media(folder):
            return Qwen35VisionLM.from_pretrained(folder, dtype=dtype, device=device)

        return Qwen35LM.from_pretrained(folder, dtype=dtype, device=device)
    from vllm_srun.adapters.models.decoder import DecoderLM

    return DecoderLM.from_pretrained(folder, dtype=dtype, device=device)


def _bos(folder: Path) -> str:
    """The BOS token text when the tokenizer config says to add one (`{bos}` in templates)."""
    path = Path(folder) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    bos = config.get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    return str(bos) if config.get("add_bos_token") and bos else ""


def _break_even_option(options: Mapping[str, Any]) -> int | None:
    """`options: {break_even_tokens: N}`: the shared-context break-even pinned instead of measured
    (R-SC-2); ValueError (one line) for anything but an integer >= 0."""
    value = options.get("break_even_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"options.break_even_tokens must be an integer >= 0 (got {value!r})")
    return value


class DecisionModel(LoadedModel):
    family = "decision"
    surfaces = SURFACES

    def __init__(self, folder: Path, context: LoadContext) -> None:
        import torch
        from tokenizers import Tokenizer

        manifest = read_manifest(folder)
        args = context.args
        device = context.device
        self.device = device
        self.dtype = resolve_dtype(args.dtype, "decision", device.name, device.native_dtypes)
        refusal = dtype_refusal(args.dtype, device.name, device.native_dtypes)
        if refusal:
            raise ValueError(refusal)
        self.package_limit = package_limit(folder)
        if args.max_model_len is not None and args.max_model_len > self.package_limit:
            raise ValueError(
                f"max_model_len {args.max_model_len} is above the package's limit of {self.package_limit} tokens"
            )
        self.max_model_len = args.max_model_len
        self.max_input_tokens = min(self.package_limit, args.max_model_len or self.package_limit)
        # the deployment's `input: {max_tokens, overflow}`: caps each prompt below that (decision_rows.py)
        self.input_budget = InputBudget(args.input_max_tokens, args.input_overflow)
        context.progress(f"load: reading decoder weights of {folder.name} ({self.dtype}, {device.name})")
        lm = load_lm(folder, getattr(torch, self.dtype), device.torch_device)
        self.decoder_engine = as_decoder_engine(context.build_engine("decoder", lm))
        self.engine = self.decoder_engine
        tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        template = choose_template(manifest.get("prompt_template"), lambda t: tokenizer.token_to_id(t) is not None)
        self.tokens = PromptTokens(tokenizer, template, _bos(folder))
        cap = CPU_CAP_TOKENS if device.kind == "cpu" else None
        seconds = None if device.kind == "cpu" else TIME_CAP_S
        self.lanes = (
            # packed where the engine runs rows back to back (a CPU in FP32, Qwen3.5), else padded
            Lane(DEFAULT_LANE, self.decoder_engine.accounting, cap_tokens=cap, cap_seconds=seconds),
            Lane(SHARED_LANE, Accounting.PACKED, cap_tokens=cap, cap_seconds=seconds),
        )
        pinned, source = _break_even_option(context.options), "option"  # the models file's, else the manifest's
        if pinned is None:
            pinned, source = (manifest.get("shared_context") or {}).get("break_even_tokens"), "manifest"
        # R-PROF-3: the profile it serves decides whether it ever shares (ValueError: a contradiction)
        published = auto_dtype(self.family, device.name, device.native_dtypes)
        other = not precision_is_published(args.dtype, self.dtype, published)
        self.enable_shared_context = serving_profile(
            args.profile, args.enable_shared_context, other_precision=other
        ).shares_context
        self.break_even = BreakEven(int(pinned), source) if pinned is not None else None
        if self.break_even is None and context.deterministic:
            # a break-even timed at load would make the path a request takes (shared or not, whose
            # answers agree only up to rounding) depend on the machine's load at start
            self.break_even = BreakEven(0, "deterministic")
        self.cache_tag = self._cache_tag()
        golden = Path(folder) / "golden.json"
        self.golden_file = golden if golden.is_file() else None

    # ---- requests ---------------------------------------------------------------------------
    def limit_message(self, total: int) -> str:
        if self.max_model_len is not None and self.max_model_len < self.package_limit:
            return f"over max_model_len={self.max_model_len}"
        return f"over the model's limit of {self.max_input_tokens} input tokens"

    def prepare(
        self,
        state: Any,
        questions: Sequence[AskedQuestion],
        overflow: str | None = None,
        media: Sequence[StateMedium] = (),
        replay: bool = False,
    ) -> PreparedState:
        if media:
            raise ValueError("this model reads text only")  # the surface never gives it media
        return self._prepare(state, questions, overflow, replay=replay)

    def _prepare(
        self,
        state: Any,
        questions: Sequence[AskedQuestion],
        overflow: str | None,
        media: Sequence[StateMedium] = (),
        media_text: str = "",
        *,
        replay: bool = False,
    ) -> PreparedState:
        budget = in_force(self.input_budget, replay)  # none for the golden check's replay of its recorded requests
        if overflow is not None:  # the questions' own (require_full_input: reject; overflow: truncate)
            budget = InputBudget(budget.max_tokens, overflow)
        return prepare(
            self.tokens, state, questions, self.max_input_tokens, self.limit_message, budget, media, media_text
        )

    def _cache_tag(self) -> str:
        """What besides the weights decides an answer: the prompt template and the input limit."""
        import hashlib

        spec = json.dumps([self.tokens.template.as_dict(), self.tokens.bos, self.max_input_tokens], sort_keys=True)
        return hashlib.sha256(spec.encode()).hexdigest()[:16]

    def share(self, prepared: PreparedState, allowed: bool = True) -> bool:
        """R-SC-2: run this state once for all its questions? (pure domain decision) Never when the
        request's profile does not share (ALLOWED, R-PROF-1) or the serving one does not."""
        threshold = self.break_even.tokens if self.break_even is not None else 0
        lengths = [len(q.ids) for q in prepared.answerable]
        return should_share(len(prepared.state_ids), lengths, threshold, self.enable_shared_context and allowed)

    # ---- forwards (device thread) -----------------------------------------------------------
    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        if lane == SHARED_LANE:
            return [self._shared(p) for p in payloads]
        return self._unshared(payloads)

    def _unshared(self, rows: Sequence[QuestionRow]) -> list[np.ndarray]:
        # the engine lays the rows out as its accounting says (padded or back to back)
        answers = [r.answer_ids for r in rows]
        return _softmax_each(self.decoder_engine.answer_logits([r.ids for r in rows], answers), answers)

    def _shared(self, row: SharedRow) -> list[np.ndarray]:
        state = self.decoder_engine.prefix_kv(row.state_ids)
        logits = self.decoder_engine.branch_logits(state, [q.ids for q in row.questions], chunk=BRANCH_CHUNK)
        return _restricted(logits, [q.answer_ids for q in row.questions])

    def probe_payloads(self) -> list[QuestionRow]:
        """Rows of mixed lengths for the batch-invariance probe (R-BAT-5)."""
        vocab = self.decoder_engine.vocab_size
        return [QuestionRow(tuple((7 * i + 3) % vocab for i in range(n)), (0, 1)) for n in (3, 7, 12, 20, 33)]

    def calibration_forward(self, tokens: int) -> CalibrationForward:
        """Prompts of the input limit's length (at most 512 tokens) adding up to TOKENS padded
        tokens in the `text` lane (R-DEV-2)."""
        length = max(1, min(self.max_input_tokens, CALIBRATION_ROW_TOKENS))
        vocab = self.decoder_engine.vocab_size
        rows = [
            QuestionRow(tuple((613 * r + 7 * i + 3) % vocab for i in range(length)), (0, 1))
            for r in range(max(1, tokens // length))
        ]
        return CalibrationForward(DEFAULT_LANE, rows, forward_tokens([length] * len(rows), self.lanes[0].accounting))

    def warm_up(self) -> None:
        """One forward of each lane, then the shared-context break-even on this backbone and device."""
        state, questions = self._timing_case(8, 2, 4)
        self.run(DEFAULT_LANE, [QuestionRow(state + q, (0, 1)) for q in questions])
        self.run(SHARED_LANE, [SharedRow(state, tuple(QuestionRow(q, (0, 1)) for q in questions))])
        if self.break_even is None and self.enable_shared_context:
            self.break_even = self.measure_break_even()

    def _timing_case(
        self, state_len: int, count: int, question_len: int
    ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        vocab = self.decoder_engine.vocab_size
        state = tuple((31 * i + 5) % vocab for i in range(state_len))
        return state, [tuple((17 * i + 11 * j + 2) % vocab for i in range(question_len)) for j in range(count)]

    def measure_break_even(
        self, state_len: int = 32, count: int = 4, question_len: int = 8, repeats: int = 2
    ) -> BreakEven:
        """Time one request both ways (best of REPEATS) and keep the shared path's overhead in tokens."""
        state_len = max(1, min(state_len, self.max_input_tokens - question_len))
        state, questions = self._timing_case(state_len, count, question_len)
        unshared = [QuestionRow(state + q, (0, 1)) for q in questions]
        shared = [SharedRow(state, tuple(QuestionRow(q, (0, 1)) for q in questions))]
        t_unshared = min(_seconds(lambda: self.run(DEFAULT_LANE, unshared)) for _ in range(repeats))
        t_shared = min(_seconds(lambda: self.run(SHARED_LANE, shared)) for _ in range(repeats))
        tokens = break_even_tokens(
            t_unshared, count * (state_len + question_len), t_shared, state_len + count * question_len
        )
        return BreakEven(tokens, "measured")

    def card_section(self) -> dict[str, Any]:
        be = self.break_even
        question_types = ["noul", "choice", "score", "set", "span"]
        return {
            **self.decoder_engine.describe(),
            "question_types": question_types,  # the contract's place; `decision` keeps its copy
            "modalities": ["text"],  # what a decisions request may carry: text states only
            "limits": {  # merged into the card's limits
                "min_options": MIN_OPTIONS,
                "max_options": MAX_OPTIONS,
                "min_levels": MIN_LEVELS,
                "max_levels": MAX_LEVELS,
            },
            "decision": {
                "question_types": question_types,
                "labels": [1, 255],  # set and span questions
                "choice_options": [MIN_OPTIONS, MAX_OPTIONS],
                "score_levels": [MIN_LEVELS, MAX_LEVELS],
                "prompt_template": self.tokens.template.as_dict(),
                "package_max_input_tokens": self.package_limit,
            },
            "shared_context": {
                "enabled": self.enable_shared_context,
                "layout": "branch",
                "break_even_tokens": be.tokens if be else None,
                "break_even_source": be.source if be else None,
                "lane": SHARED_LANE,
            },
        }


def _seconds(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _restricted(logits: Any, answer_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per row of full LOGITS [R, V], the softmax (FP64) over only that row's answer tokens, in
    the order given: one gather on the device, one copy to the host."""
    return _softmax_each(pick(logits, answer_ids), answer_ids)


def _softmax_each(picked: Any, answer_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The answer logits PICKED flat (`models/answer_logits.py`), one softmax (FP64) per row
    over its own answer tokens."""
    picked = picked.double().cpu().numpy()
    out, start = [], 0
    for ids in answer_ids:
        x = picked[start : start + len(ids)]
        start += len(ids)
        e = np.exp(x - x.max())
        out.append(e / e.sum())
    return out
