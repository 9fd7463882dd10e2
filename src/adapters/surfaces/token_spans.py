"""POST /v1/classify for token heads (`kind: token`, issue 24): every token's label, and the labelled
spans they make, as transformers' `pipeline("token-classification")` makes them.

Per token: softmax over the labels; special tokens ([CLS], [SEP] …) are left out. Offsets are the
tokenizer's, in code points of the input, end exclusive; a span's `text` is `input[start:end]`.
`options.aggregation`:
- `simple` (default): each token's argmax label; neighbours of the same entity type join (a `B-`
  label starts a new span; `B-`/`I-` prefixes are dropped), probability = the mean of theirs;
- `first`: as `simple`, but every token of a word takes the label and probability of the word's
  first token (a word: a token and the continuation pieces after it — `##` pieces for WordPiece,
  else no space before the token);
- `none`: one span per token, its full label (`B-PER`), probability its own.
Labels `O` make no span. `options.threshold` keeps the spans at or above it (default: every span).
`options.return_tokens` adds every token with the probability of each label (`tokens`: `start`,
`end`, `probabilities`, and ours: `token`, its most probable `label` and that `probability`).

Windows (`overflow: window`): each window is aggregated alone, then spans of the same label that
overlap (or touch the same characters) in different windows become one — their union — whose
probability is the highest of theirs; a token seen in two windows is listed once, from the window
where it was most probable; the result's `windows` list each window's content-token span and its
own spans. A text pair fails in its slot (`invalid_input`: a token head labels one text), as does
an over-long text under `reject` (`max_length_exceeded`) or one whose rows did not start before
`options.deadline_ms` (`deadline_exceeded`), R-API-10.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.contracts.token_heads import TokenLogitsRow
from vllm_srun.adapters.schemas.encoder import (
    ClassifyOptions,
    ClassifyRequest,
    ClassifyResponse,
    ClassifyResult,
    ClassifyWindow,
    EncoderUsage,
    InputUsage,
    TokenProbabilities,
    TokenSpan,
    WindowOptions,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel, TokenBudget
from vllm_srun.adapters.surfaces.classify_heads import HEAD_NAME, check_options, with_head
from vllm_srun.adapters.surfaces.common import ItemFailure, Prepared, any_expired, expired
from vllm_srun.adapters.surfaces.overflow import MAX_WINDOW_ROWS, Item, TokenLimit, too_long
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge
from vllm_srun.domain.scheduling.rows import RowSpec

AGGREGATIONS = ("simple", "first", "none")
OUTSIDE = "O"


@dataclass(frozen=True, slots=True)
class Window:
    """One row of a token head's input: its encoding and, per token, offsets, specialness, text."""

    encoded: Any  # contracts.Encoded
    offsets: list[tuple[int, int]]
    special: list[bool]
    tokens: list[str]
    first: int = 0  # its content tokens' span in the input's content tokens, end exclusive
    last: int = 0


@dataclass(frozen=True, slots=True)
class TokenInput:
    text: str
    windows: list[Window]
    n_tokens: int  # the whole input's length, special tokens included
    truncated: bool


@dataclass(frozen=True, slots=True)
class Entity:
    label: str
    probability: float
    start: int
    end: int


def _window(encoding: Any, first: int = 0) -> Window:
    from vllm_srun.adapters.contracts import Encoded

    ids = list(encoding.ids)
    special = [bool(m) for m in encoding.special_tokens_mask]
    return Window(
        Encoded(ids, list(encoding.type_ids), False, len(ids)),
        [(int(a), int(b)) for a, b in encoding.offsets],
        special,
        list(encoding.tokens),
        first,
        first + special.count(False),
    )


def _windows(encodings: Sequence[Any], overlap: int) -> list[Window]:
    """Consecutive overflow windows, each placed in the input's content tokens."""
    out, at = [], 0
    for encoding in encodings:
        window = _window(encoding, at)
        out.append(window)
        at = window.last - overlap  # the next window repeats this one's last OVERLAP content tokens
    return out


def encode_token_inputs(
    model: Any,
    texts: Sequence[str | ItemFailure],
    mode: str,
    window: WindowOptions | None,
    budget: TokenBudget,
    limit: TokenLimit,
) -> list[TokenInput | ItemFailure]:
    """Each text as one row (whole, or cut when MODE is `truncate`) or as windows (`window`), at
    most LIMIT tokens a row; an over-long text under `reject` fails in its slot (a failure given
    stays as it is)."""
    raw = model.tokenizer.tokenizer
    out: list[TokenInput | ItemFailure] = []
    rows = 0
    for i, text in enumerate(texts):
        if isinstance(text, ItemFailure):
            out.append(text)
            continue
        whole = raw.encode(text)
        n = len(whole.ids)
        if mode == "window":
            assert window is not None
            tok, lock = model.tokenizer.windowing(window.tokens, window.overlap, False)
            with lock:
                first = tok.encode(text)
            windows = _windows((first, *first.overflowing), window.overlap)
            truncated = False
        elif n <= limit.tokens:
            windows, truncated = [_window(whole)], False
        elif mode == "truncate":
            tok, lock = model.tokenizer.windowing(limit.tokens, 0, False)
            with lock:
                windows, truncated = [_window(tok.encode(text))], True
        else:
            budget.spend(n)  # it was read
            out.append(too_long(i, n, limit))
            continue
        rows += len(windows)
        if rows > MAX_WINDOW_ROWS:
            raise RequestTooLarge(f"the request makes more than {MAX_WINDOW_ROWS} windows")
        budget.spend(sum(len(w.encoded.ids) for w in windows))
        out.append(TokenInput(text, windows, n, truncated))
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True, slots=True)
class WordRule:
    """How a token is told to continue a word: the tokenizer's continuing-subword prefix (`##`),
    else the fallback (no space before it); an unknown token always starts a word."""

    prefix: str
    unk_id: int | None

    @classmethod
    def of(cls, raw: Any) -> WordRule:
        tmodel = raw.model
        prefix = getattr(tmodel, "continuing_subword_prefix", None) or ""
        unk = getattr(tmodel, "unk_token", None)
        return cls(prefix, raw.token_to_id(unk) if isinstance(unk, str) else None)

    def continues(self, text: str, token: str, token_id: int, start: int, end: int) -> bool:
        if token_id == self.unk_id:
            return False
        if self.prefix:
            return len(token) != end - start
        return start > 0 and " " not in text[start - 1 : start + 1]


def _tag(label: str) -> tuple[str, str]:
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _group(entities: list[Entity]) -> list[Entity]:
    """Neighbours of one entity type become one (a `B-` starts anew); probability: their mean."""
    groups: list[list[Entity]] = []
    for e in entities:
        bi, tag = _tag(e.label)
        if groups and bi != "B" and _tag(groups[-1][-1].label)[1] == tag:
            groups[-1].append(e)
        else:
            groups.append([e])
    return [
        Entity(g[0].label.split("-", 1)[-1], float(np.mean([e.probability for e in g])), g[0].start, g[-1].end)
        for g in groups
    ]


def token_entities(text: str, window: Window, probs: np.ndarray, labels: Sequence[str]) -> list[Entity]:
    """Each non-special token of WINDOW with its argmax label and probability."""
    out = []
    for j, special in enumerate(window.special):
        if special:
            continue
        k = int(np.argmax(probs[j]))
        start, end = window.offsets[j]
        out.append(Entity(labels[k], float(probs[j][k]), start, end))
    return out


def aggregate(
    text: str, window: Window, probs: np.ndarray, labels: Sequence[str], how: str, rule: WordRule
) -> list[Entity]:
    """WINDOW's spans (module doc), `O` left out."""
    if how == "first":
        words: list[Entity] = []
        last_end = 0
        for j, special in enumerate(window.special):
            if special:
                continue
            start, end = window.offsets[j]
            piece = rule.continues(text, window.tokens[j], window.encoded.ids[j], start, end)
            if words and piece:
                last_end = end
                words[-1] = Entity(words[-1].label, words[-1].probability, words[-1].start, last_end)
                continue
            k = int(np.argmax(probs[j]))
            words.append(Entity(labels[k], float(probs[j][k]), start, end))
        spans = _group(words)
    else:
        tokens = token_entities(text, window, probs, labels)
        spans = tokens if how == "none" else _group(tokens)
    return [s for s in spans if s.label != OUTSIDE]


def union(spans: list[Entity]) -> list[Entity]:
    """Spans of the same label that share characters become one (their union, the highest probability)."""
    merged: list[Entity] = []
    for s in sorted(spans, key=lambda e: (e.start, e.end, e.label)):
        for i, m in enumerate(merged):
            if m.label == s.label and s.start < m.end and m.start < s.end:
                merged[i] = Entity(m.label, max(m.probability, s.probability), min(m.start, s.start), max(m.end, s.end))
                break
        else:
            merged.append(s)
    return sorted(merged, key=lambda e: (e.start, e.end, e.label))


def _span(text: str, e: Entity) -> TokenSpan:
    return TokenSpan(e.label, e.start, e.end, text[e.start : e.end], e.probability)


def _tokens(inp: TokenInput, parts: Sequence[np.ndarray], labels: Sequence[str]) -> list[TokenProbabilities]:
    best: dict[tuple[int, int], tuple[float, TokenProbabilities]] = {}
    for window, probs in zip(inp.windows, parts):
        for j, special in enumerate(window.special):
            if special:
                continue
            k = int(np.argmax(probs[j]))
            start, end = window.offsets[j]
            found = best.get((start, end))
            if found is None or probs[j][k] > found[0]:
                token = TokenProbabilities(
                    start=start,
                    end=end,
                    probabilities=probs[j].tolist(),
                    token=window.tokens[j],
                    label=labels[k],
                    probability=float(probs[j][k]),
                )
                best[start, end] = (float(probs[j][k]), token)
    return [best[key][1] for key in sorted(best)]


def _settings(
    model: Any, items: Sequence[Item | ItemFailure], options: ClassifyOptions, mode: str, limit: TokenLimit
) -> tuple[list[str | ItemFailure], str, WindowOptions | None, list[str], WordRule]:
    """A token head's request checked (LIMIT: the most tokens a row may have): its texts (a pair
    fails in its slot), aggregation, window, the labels and the word rule."""
    texts: list[str | ItemFailure] = [
        ItemFailure("invalid_input", f"input[{i}]: a token head labels one text; text pairs are not taken")
        if isinstance(item, tuple)
        else item
        for i, item in enumerate(items)
    ]
    how = check_options(options, "token")
    window = None
    if mode == "window":
        window = options.window or WindowOptions(tokens=limit.tokens)
        if window.tokens > limit.tokens:
            raise InvalidRequest(f"options.window.tokens {window.tokens} is over {limit.text()}")
        room = window.tokens - model.tokenizer.tokenizer.num_special_tokens_to_add(False)
        if room < 1:
            raise InvalidRequest(f"a window of {window.tokens} tokens leaves no room for text")
        if window.overlap >= room:
            raise InvalidRequest(
                f"options.window.overlap {window.overlap} must be below the {room} text tokens a window holds"
            )
    labels = list(model.labels)
    rule = WordRule.of(model.tokenizer.tokenizer)
    return texts, how, window, labels, rule


def build(
    served: ServedModel,
    inputs: list[TokenInput | ItemFailure],
    how: str,
    labels: list[str],
    rule: WordRule,
    *,
    windowed: bool,
    return_tokens: bool,
    threshold: float | None,
) -> tuple[list[RowSpec], Any]:
    rows = [
        RowSpec(len(w.encoded.ids), TokenLogitsRow(w.encoded))
        for inp in inputs
        if isinstance(inp, TokenInput)
        for w in inp.windows
    ]

    def kept(text: str, spans: Sequence[Entity]) -> list[TokenSpan]:
        return [_span(text, e) for e in spans if threshold is None or e.probability >= threshold]

    def result(i: int, inp: TokenInput, outputs: Sequence[Any]) -> ClassifyResult:
        parts = [softmax(np.asarray(o)) for o in outputs]
        per_window = [aggregate(inp.text, w, p, labels, how, rule) for w, p in zip(inp.windows, parts)]
        spans = union([s for found in per_window for s in found]) if len(per_window) > 1 else per_window[0]
        windows = None
        if windowed:
            windows = [
                ClassifyWindow(
                    start=w.first,
                    end=w.last,
                    spans=kept(inp.text, found),
                    char_start=min((o[0] for o, sp in zip(w.offsets, w.special) if not sp), default=0),
                    char_end=max((o[1] for o, sp in zip(w.offsets, w.special) if not sp), default=0),
                    tokens=len(w.encoded.ids),
                )
                for w, found in zip(inp.windows, per_window)
            ]
        read = sum(len(w.encoded.ids) for w in inp.windows)
        usage = InputUsage(
            tokens=inp.n_tokens,
            processed_tokens=read if inp.truncated else inp.n_tokens,
            truncated=inp.truncated,
            windows=len(inp.windows) if windowed else None,
        )
        return ClassifyResult(
            index=i,
            spans=kept(inp.text, spans),
            tokens=_tokens(inp, parts, labels) if return_tokens else None,
            windows=windows,
            input=usage,
        )

    def finish(stats: ForwardStats) -> ClassifyResponse:
        results, at, tokens = [], 0, 0
        for i, inp in enumerate(inputs):
            if isinstance(inp, ItemFailure):
                results.append(ClassifyResult(index=i, error=inp.code, message=inp.message))
                continue
            outputs = stats.outputs[at : at + len(inp.windows)]
            at += len(inp.windows)
            if any_expired(outputs):
                failure = expired(i)
                results.append(ClassifyResult(index=i, error=failure.code, message=failure.message))
                continue
            tokens += sum(len(w.encoded.ids) for w in inp.windows)
            results.append(result(i, inp, outputs))
        return ClassifyResponse(
            model=served.name,
            head=HEAD_NAME,
            kind="token",
            labels=labels,
            results=results,
            usage=EncoderUsage.of(tokens),
            multi_label=False,
        )

    return rows, finish


async def prepare_tokens(
    served: ServedModel,
    call: Call,
    model: Any,
    req: ClassifyRequest,
    items: Sequence[Item | ItemFailure],
    options: ClassifyOptions,
    mode: str,
    limit: TokenLimit,
) -> Prepared[ClassifyResponse]:
    """A token head's classify request; LIMIT is the most tokens a row may have (the model's, the
    deployment's input budget or the request's `options.max_tokens` below it, R-PERF-5)."""
    texts, how, window, labels, rule = _settings(model, items, options, mode, limit)
    inputs = await served.prepare(call, encode_token_inputs, model, texts, mode, window, served.token_budget(), limit)
    rows, finish = build(
        served,
        inputs,
        how,
        labels,
        rule,
        windowed=mode == "window",
        return_tokens=bool(options.return_tokens),
        threshold=options.threshold,
    )
    return Prepared(served, call, "classify", req, options, rows, finish, with_head, expires_rows=True)
