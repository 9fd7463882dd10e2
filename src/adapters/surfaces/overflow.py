"""Overflow handling for encoder inputs (R-PERF-5): reject, truncate, or split into windows.

Windows are asked for, never implied: by the request, or by the deployment's input budget
(`input: {max_tokens, overflow}`, `domain/inputs/input_budget.py`), whose `overflow` is the default of a
request that sets none and whose `max_tokens` caps every input (and every window) below the
model's own limit; a request's `options.max_tokens` may lower that cap further (never raise it:
400). A window holds `tokens` tokens (special tokens included) and shares `overlap` content
tokens with the one before it. A text pair keeps its `text` whole in every window and slides
over its `text_pair` (the document). Each window is one row.

An input that cannot be read this way fails in its own slot (R-API-10) and takes no row: longer
than the limit under `reject` (`max_length_exceeded`), or a pair whose `text` leaves a window no
room (`invalid_input`). The tokens it was read for still count against the request's token
budget (`--max-request-tokens`): the budget bounds the tokenizing work, answered or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.contracts import Encoded, PairScorer
from vllm_srun.adapters.schemas.embeddings import EmbeddingsOptions
from vllm_srun.adapters.schemas.encoder import ClassifyOptions, RerankOptions
from vllm_srun.adapters.serving.served import ServedModel, TokenBudget
from vllm_srun.adapters.surfaces.common import TOKENIZE_CHUNK, ItemFailure, input_budget
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge
from vllm_srun.domain.inputs.input_budget import SOURCE

__all__ = ["input_budget"]  # the surfaces read the budget from here, beside the overflow rules

Item = str | tuple[str, str]


MAX_WINDOW_ROWS = 8192  # windows of one request, all inputs together
CUT_HINT = 'set options.overflow to "truncate" to cut it or to "window" to read it in windows'


@dataclass(frozen=True, slots=True)
class TokenLimit:
    """The most tokens one input (one row) of a request may have, and why (for messages)."""

    tokens: int
    why: str = ""  # "" (the model's own limit), the deployment's input.max_tokens, options.max_tokens

    def text(self) -> str:
        return f"the limit of {self.tokens}" + (f" ({self.why})" if self.why else "")


def token_limit(
    served: ServedModel, call: Call, model_limit: int, options: ClassifyOptions | RerankOptions | EmbeddingsOptions
) -> TokenLimit:
    """The request's per-input limit: `options.max_tokens`, at most the deployment's input budget
    in force for CALL and the model's limit (400 above either: a request may lower the limit,
    never raise it)."""
    budget = input_budget(served, call)
    ceiling = TokenLimit(model_limit)
    if budget.capped(model_limit):
        ceiling = TokenLimit(budget.limit(model_limit), "the deployment's input.max_tokens")
    asked = options.max_tokens
    if asked is None:
        return ceiling
    if asked > ceiling.tokens:
        whose = ceiling.why or "the model's limit"
        raise InvalidRequest(f"options.max_tokens {asked} is over {whose} of {ceiling.tokens}")
    return TokenLimit(asked, "options.max_tokens") if asked < ceiling.tokens else ceiling


def too_long(index: int, tokens: int, limit: TokenLimit, hint: str = CUT_HINT) -> ItemFailure:
    return ItemFailure("max_length_exceeded", f"input[{index}] has {tokens} tokens, over {limit.text()}; {hint}")


@dataclass(frozen=True, slots=True)
class OverflowWindow:
    encoded: Encoded
    start: int  # character span of the windowed text that this window covers
    end: int
    first: int  # its content tokens' span in the windowed text's content tokens, end exclusive
    last: int


@dataclass(frozen=True, slots=True)
class WindowedInput:
    windows: list[OverflowWindow]
    n_tokens: int  # the whole input's length, special tokens included


def overflow_origin(options: ClassifyOptions | RerankOptions) -> str:
    """Where the request's overflow mode comes from, for a message that refuses it."""
    if options.overflow is not None or options.window is not None:
        return "options.overflow"
    return f"{SOURCE} (the default of a request that sets no options.overflow)"


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
    model: PairScorer,
    items: Sequence[Item | ItemFailure],
    *,
    truncate: bool,
    budget: TokenBudget,
    limit: TokenLimit,
) -> list[Encoded | ItemFailure]:
    """One row per input (texts and pairs may mix; a failure stays as it is), tokenized a chunk at
    a time; an over-long input fails in its slot unless TRUNCATE, and the work stops as soon as
    the request passes its BUDGET."""
    rows: list[Encoded | ItemFailure] = []
    for start in range(0, len(items), TOKENIZE_CHUNK):
        part = _encode_chunk(model, items[start : start + TOKENIZE_CHUNK], truncate, limit.tokens)
        budget.spend(sum(len(row.ids) for row in part if isinstance(row, Encoded)))  # a refused input was read too
        rows.extend(
            too_long(i, row.n_tokens, limit) if isinstance(row, Encoded) and len(row.ids) > limit.tokens else row
            for i, row in enumerate(part, start)
        )
    return rows


def _encode_chunk(
    model: PairScorer, items: Sequence[Item | ItemFailure], truncate: bool, limit: int
) -> list[Encoded | ItemFailure]:
    out: list[Encoded | ItemFailure | None] = [it if isinstance(it, ItemFailure) else None for it in items]
    singles: list[int] = []
    texts: list[str] = []
    pairs: list[int] = []
    text_pairs: list[tuple[str, str]] = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            singles.append(i)
            texts.append(it)
        elif isinstance(it, tuple):
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
    assert all(row is not None for row in out)
    return [row for row in out if row is not None]


def split_overflow_windows(
    model: PairScorer,
    items: Sequence[Item | ItemFailure],
    tokens: int,
    overlap: int,
    budget: TokenBudget,
    *,
    limit: TokenLimit | None = None,
    origin: str = "options.overflow",
) -> list[WindowedInput | ItemFailure]:
    """Every input as one or more windows of at most TOKENS tokens (at most LIMIT, the request's
    limit; None: the model's), within the request's BUDGET; ORIGIN names where the window mode
    came from in a refusal. A pair whose `text` leaves a window no room fails in its slot."""
    most = limit or TokenLimit(model.max_input_tokens)
    if tokens > most.tokens:
        raise InvalidRequest(f"options.window.tokens {tokens} is over {most.text()}")
    if not model.tokenizer.windows_pairs and any(isinstance(item, tuple) for item in items):
        raise InvalidRequest(
            f"overflow \"window\" ({origin}) is not supported by this model's pairs (a yes/no reranker's prompt "
            'template); set options.overflow to "truncate"'
        )
    raw = model.tokenizer.tokenizer
    room_single = tokens - raw.num_special_tokens_to_add(False)
    if any(isinstance(item, str) for item in items):
        _check_room(room_single, overlap, tokens)
    out: list[WindowedInput | ItemFailure] = []
    rows = 0
    for i, item in enumerate(items):
        if isinstance(item, ItemFailure):
            out.append(item)
            continue
        pair = isinstance(item, tuple)
        if isinstance(item, tuple):
            room = tokens - raw.num_special_tokens_to_add(True) - len(raw.encode(item[0], add_special_tokens=False).ids)
            if room < 1 or overlap >= room:
                why = "no room for text after `text`" if room < 1 else f"{room} text tokens, not above the overlap"
                out.append(ItemFailure("invalid_input", f"input[{i}]: a window of {tokens} tokens leaves {why}"))
                continue
        tok, lock = model.tokenizer.windowing(tokens, overlap, pair)
        with lock:
            first = tok.encode(*item) if pair else tok.encode(item)
        read = 1 if pair else 0  # the sequence the windows slide over
        windows, at = [], 0
        for enc in (first, *first.overflowing):
            spans = [
                off
                for off, seq, special in zip(enc.offsets, enc.sequence_ids, enc.special_tokens_mask)
                if not special and seq == read
            ]
            start, end = (spans[0][0], spans[-1][1]) if spans else (0, 0)
            windows.append(
                OverflowWindow(Encoded(enc.ids, enc.type_ids, False, len(enc.ids)), start, end, at, at + len(spans))
            )
            at += len(spans) - overlap  # the next window repeats this one's last OVERLAP content tokens
        whole = raw.encode(*item) if pair else raw.encode(item)
        rows += len(windows)
        if rows > MAX_WINDOW_ROWS:
            raise RequestTooLarge(f"the request makes more than {MAX_WINDOW_ROWS} windows")
        budget.spend(sum(len(w.encoded.ids) for w in windows))
        out.append(WindowedInput(windows, len(whole.ids)))
    return out


def _check_room(room: int, overlap: int, tokens: int) -> None:
    """400 for a window setting that leaves a single text no room (the same for every input)."""
    if room < 1:
        raise InvalidRequest(f"a window of {tokens} tokens leaves no room for text")
    if overlap >= room:
        raise InvalidRequest(f"options.window.overlap {overlap} must be below the {room} text tokens a window holds")
