"""Overflow handling for encoder inputs (R-PERF-5): reject, truncate, or split into windows.

Windows are asked for, never implied: by the request, or by the deployment's input budget
(`input: {max_tokens, overflow}`, `domain/input_budget.py`), whose `overflow` is the default of a
request that sets none and whose `max_tokens` caps every input (and every window) below the
model's own limit. A window holds `tokens` tokens (special tokens included) and shares `overlap`
content tokens with the one before it. A text pair keeps its `text` whole in every window and
slides over its `text_pair` (the document). Each window is one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_srun.adapters.contracts import Encoded, PairScorer
from vllm_srun.adapters.schemas.encoder import ClassifyOptions, RerankOptions
from vllm_srun.adapters.serving.served import TokenBudget
from vllm_srun.adapters.surfaces.common import TOKENIZE_CHUNK, input_budget
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge
from vllm_srun.domain.input_budget import SOURCE

__all__ = ["input_budget"]  # the surfaces read the budget from here, beside the overflow rules

Item = str | tuple[str, str]


MAX_WINDOW_ROWS = 8192  # windows of one request, all inputs together


@dataclass(frozen=True, slots=True)
class OverflowWindow:
    encoded: Encoded
    start: int  # character span of the windowed text that this window covers
    end: int


@dataclass(frozen=True, slots=True)
class WindowedInput:
    windows: list[OverflowWindow]
    n_tokens: int  # the whole input's length, special tokens included


def overflow_origin(options: ClassifyOptions | RerankOptions) -> str:
    """Where the request's overflow mode comes from, for a message that refuses it."""
    if options.overflow is not None or options.window is not None:
        return "options.overflow"
    return f"{SOURCE} (the default of a request that sets no options.overflow)"


def limit_text(limit: int, model_limit: int) -> str:
    """How a refusal names LIMIT: the model's, or the deployment's input.max_tokens below it."""
    return f"the limit of {limit}" + (" (the deployment's input.max_tokens)" if limit < model_limit else "")


def overflow_mode(options: ClassifyOptions | RerankOptions, default: str = "reject") -> str:
    """The request's overflow mode; `window` settings imply (and need) `overflow: window`; else
    DEFAULT (the model's input budget, `input.overflow`, R-PERF-5)."""
    mode, window = options.overflow, options.window
    if mode is None:
        return "window" if window is not None else default
    if window is not None and mode != "window":
        raise InvalidRequest(f'options.window is set but options.overflow is "{mode}"; use "window"')
    return mode


def encode_items(
    model: PairScorer, items: Sequence[Item], *, truncate: bool, budget: TokenBudget, max_length: int | None = None
) -> list[Encoded]:
    """One row per input (texts and pairs may mix), tokenized a chunk at a time; over-long inputs
    are rejected unless TRUNCATE, and the work stops as soon as the request passes its BUDGET."""
    rows: list[Encoded] = []
    for start in range(0, len(items), TOKENIZE_CHUNK):
        part = _encode_chunk(model, items[start : start + TOKENIZE_CHUNK], start, truncate, max_length)
        budget.spend(sum(len(row.ids) for row in part))
        rows.extend(part)
    return rows


def _encode_chunk(
    model: PairScorer, items: Sequence[Item], first: int, truncate: bool, max_length: int | None
) -> list[Encoded]:
    limit = min(max_length or model.max_input_tokens, model.max_input_tokens)
    out: list[Encoded | None] = [None] * len(items)
    singles: list[int] = []
    texts: list[str] = []
    pairs: list[int] = []
    text_pairs: list[tuple[str, str]] = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            singles.append(i)
            texts.append(it)
        else:
            pairs.append(i)
            text_pairs.append(it)
    try:
        if singles:
            for i, enc in zip(singles, model.tokenizer.encode(texts, max_length=limit, truncate=truncate)):
                out[i] = enc
        if pairs:
            for i, enc in zip(pairs, model.tokenizer.encode_pairs(text_pairs, max_length=limit, truncate=truncate)):
                out[i] = enc
    except ValueError as exc:  # e.g. a limit that leaves no room after the special tokens
        raise InvalidRequest(str(exc)) from None
    rows: list[Encoded] = []
    for i, row in enumerate(out, first):
        assert row is not None
        if len(row.ids) > limit:
            raise InvalidRequest(
                f"input[{i}] has {row.n_tokens} tokens, over {limit_text(limit, model.max_input_tokens)}; "
                'set options.overflow to "truncate" to cut it or to "window" to read it in windows'
            )
        rows.append(row)
    return rows


def split_overflow_windows(
    model: PairScorer,
    items: Sequence[Item],
    tokens: int,
    overlap: int,
    budget: TokenBudget,
    *,
    limit: int | None = None,
    origin: str = "options.overflow",
) -> list[WindowedInput]:
    """Every input as one or more windows of at most TOKENS tokens (at most LIMIT, the input
    budget; None: the model's limit), within the request's BUDGET; ORIGIN names where the
    window mode came from in a refusal."""
    most = model.max_input_tokens if limit is None else min(limit, model.max_input_tokens)
    if tokens > most:
        raise InvalidRequest(f"options.window.tokens {tokens} is over {limit_text(most, model.max_input_tokens)}")
    if not model.tokenizer.windows_pairs and any(not isinstance(item, str) for item in items):
        raise InvalidRequest(
            f"overflow \"window\" ({origin}) is not supported by this model's pairs (a yes/no reranker's prompt "
            'template); set options.overflow to "truncate"'
        )
    raw = model.tokenizer.tokenizer
    out: list[WindowedInput] = []
    rows = 0
    for i, item in enumerate(items):
        pair = not isinstance(item, str)
        room = tokens - raw.num_special_tokens_to_add(pair)
        if pair:
            room -= len(raw.encode(item[0], add_special_tokens=False).ids)
        if room < 1:
            raise InvalidRequest(
                f"input[{i}]: a window of {tokens} tokens leaves no room for text" + (" after `text`" if pair else "")
            )
        if overlap >= room:
            raise InvalidRequest(
                f"input[{i}]: options.window.overlap {overlap} must be below the {room} text tokens a window holds"
            )
        tok, lock = model.tokenizer.windowing(tokens, overlap, pair)
        with lock:
            first = tok.encode(*item) if pair else tok.encode(item)
        windows = []
        for enc in (first, *first.overflowing):
            spans = [
                off
                for off, seq, special in zip(enc.offsets, enc.sequence_ids, enc.special_tokens_mask)
                if not special and seq == (1 if pair else 0)
            ]
            start, end = (spans[0][0], spans[-1][1]) if spans else (0, 0)
            windows.append(OverflowWindow(Encoded(enc.ids, enc.type_ids, False, len(enc.ids)), start, end))
        rows += len(windows)
        if rows > MAX_WINDOW_ROWS:
            raise RequestTooLarge(f"the request makes more than {MAX_WINDOW_ROWS} windows")
        budget.spend(sum(len(w.encoded.ids) for w in windows))
        whole = raw.encode(*item) if pair else raw.encode(item)
        out.append(WindowedInput(windows, len(whole.ids)))
    return out
