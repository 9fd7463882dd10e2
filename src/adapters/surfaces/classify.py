"""POST /v1/classify (R-API-2): texts or text pairs → one row each (or one per window) → the answer
of the model's head, as the upstream contract writes it (docs/classify.md, docs/contract.md).

A model has one head, named `classify` (`HEAD_NAME`; the card's `heads[0].name`), of one kind:
- `sequence` (single-label, softmax): `label` (the argmax) and `probabilities`;
- `scores` (multi-label, `problem_type: multi_label_classification`): a sigmoid per label in
  `scores`, and `selected`, every label at or above `options.threshold` (default 0.5), most
  probable first;
- `token`: every token labelled, answered as spans (`token_spans.py`).
`options.threshold` is the head's threshold: the labels a scores head selects, the spans a
token head keeps; a sequence head has none (400). Over-long inputs fail in their slot
(`max_length_exceeded`), are cut when `overflow: truncate`, or are read in windows when asked
(`overflow: window`, `window: {tokens, overlap}`); window probabilities (scores) are reduced by
max per label and every window is listed in the result's `windows`. A request without
`options.overflow` takes the deployment's `input.overflow`; `options.max_tokens` (at most the
deployment's `input.max_tokens`, at most the model's limit) caps each input and window.
Every item fails in its own slot (R-API-10): an unreadable input, an over-long one, one whose
rows had not started by `options.deadline_ms`.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.contracts import Encoded, LogitsRow, is_text_classifier
from vllm_srun.adapters.schemas.common import MAX_INPUTS
from vllm_srun.adapters.schemas.encoder import (
    ClassifyOptions,
    ClassifyRequest,
    ClassifyResponse,
    ClassifyResult,
    ClassifyWindow,
    EncoderUsage,
    InputUsage,
    WindowOptions,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces.classify_heads import HEAD_NAME, check_head, check_options, head_kind, with_head
from vllm_srun.adapters.surfaces.common import ItemFailure, Prepared, answer, any_expired, expired
from vllm_srun.adapters.surfaces.overflow import (
    Item,
    WindowedInput,
    encode_items,
    input_budget,
    overflow_mode,
    overflow_origin,
    split_overflow_windows,
    token_limit,
)
from vllm_srun.adapters.surfaces.token_spans import prepare_tokens
from vllm_srun.domain.errors import RequestTooLarge
from vllm_srun.domain.scheduling.rows import RowSpec

DEFAULT_THRESHOLD = 0.5


def _items(req: ClassifyRequest) -> list[Item | ItemFailure]:
    raw = [req.input] if isinstance(req.input, str) else req.input
    if len(raw) > MAX_INPUTS:
        raise RequestTooLarge(f"too many inputs: {len(raw)} (at most {MAX_INPUTS})")
    out: list[Item | ItemFailure] = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            out.append(item)
        elif item.context is not None or item.question is not None or item.answer is not None:
            out.append(
                ItemFailure(
                    "invalid_input",
                    f"input[{i}]: grounded inputs (context, question, answer) need a "
                    "grounded head; this model's head takes texts and {text, text_pair} pairs",
                )
            )
        elif item.text is None:
            out.append(ItemFailure("invalid_input", f"input[{i}] has no text"))
        else:
            out.append(item.text if item.text_pair is None else (item.text, item.text_pair))
    return out


def probabilities(logits: np.ndarray, multi_label: bool) -> np.ndarray:
    """[rows, labels] logits → probabilities (float64): sigmoid per label, or softmax per row."""
    x = logits.astype(np.float64)
    if multi_label:
        return 1.0 / (1.0 + np.exp(-x))
    x = x - x.max(axis=1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=1, keepdims=True)


def selected(p: np.ndarray, labels: list[str], threshold: float) -> list[str]:
    """The labels at or above THRESHOLD, most probable first (ties: label order)."""
    order = sorted(range(len(labels)), key=lambda j: (-p[j], j))
    return [labels[j] for j in order if p[j] >= threshold]


async def classify(served: ServedModel, req: ClassifyRequest, call: Call) -> ClassifyResponse:
    return await answer(await prepare_classify(served, req, call))


async def prepare_classify(served: ServedModel, req: ClassifyRequest, call: Call) -> Prepared[ClassifyResponse]:
    model = served.require_surface("classify", call)
    assert is_text_classifier(model)  # checked when the model loaded
    check_head(req.head)
    items = _items(req)
    options = req.options or ClassifyOptions()
    mode = overflow_mode(options, input_budget(served, call).overflow)
    limit = token_limit(served, call, model.max_input_tokens, options)
    kind = head_kind(model)
    check_options(options, kind)
    if kind == "token":  # token heads: token_spans.py
        return await prepare_tokens(served, call, model, req, items, options, mode, limit)
    threshold = DEFAULT_THRESHOLD if options.threshold is None else options.threshold
    budget = served.token_budget()
    windowed: list[WindowedInput | ItemFailure] = []
    if mode == "window":
        window = options.window or WindowOptions(tokens=limit.tokens)
        windowed = await served.prepare(
            call,
            partial(
                split_overflow_windows,
                model,
                items,
                window.tokens,
                window.overlap,
                budget,
                limit=limit,
                origin=overflow_origin(options),
            ),
        )
        groups = [[] if isinstance(s, ItemFailure) else [w.encoded for w in s.windows] for s in windowed]
        failures = [s if isinstance(s, ItemFailure) else None for s in windowed]
        full = [0 if isinstance(s, ItemFailure) else s.n_tokens for s in windowed]
    else:
        encoded = await served.prepare(
            call, partial(encode_items, model, items, truncate=mode == "truncate", budget=budget, limit=limit)
        )
        groups = [[e] if isinstance(e, Encoded) else [] for e in encoded]
        failures = [e if isinstance(e, ItemFailure) else None for e in encoded]
        full = [e.n_tokens if isinstance(e, Encoded) else 0 for e in encoded]

    rows = [RowSpec(len(e.ids), LogitsRow(e)) for group in groups for e in group]
    labels = list(model.labels)

    def result(i: int, part: np.ndarray) -> ClassifyResult:
        group = groups[i]
        reduced = part.max(axis=0)
        values = reduced.tolist()
        windows = None
        if mode == "window":
            split = windowed[i]
            assert isinstance(split, WindowedInput)
            windows = [
                ClassifyWindow(
                    start=w.first,
                    end=w.last,
                    probabilities=None if kind == "scores" else p.tolist(),
                    scores=p.tolist() if kind == "scores" else None,
                    char_start=w.start,
                    char_end=w.end,
                    tokens=len(w.encoded.ids),
                )
                for w, p in zip(split.windows, part)
            ]
        truncated = any(e.truncated for e in group)
        usage = InputUsage(
            tokens=full[i],
            processed_tokens=sum(len(e.ids) for e in group) if truncated else full[i],
            truncated=truncated,
            windows=len(group) if mode == "window" else None,
        )
        if kind == "scores":
            return ClassifyResult(
                index=i, scores=values, selected=selected(reduced, labels, threshold), windows=windows, input=usage
            )
        return ClassifyResult(
            index=i, label=labels[int(np.argmax(reduced))], probabilities=values, windows=windows, input=usage
        )

    def finish(stats: ForwardStats) -> ClassifyResponse:
        results, at, tokens = [], 0, 0
        for i, group in enumerate(groups):
            outputs = stats.outputs[at : at + len(group)]
            at += len(group)
            failure = failures[i]
            if failure is None and any_expired(outputs):
                failure = expired(i)
            else:
                tokens += sum(len(e.ids) for e in group)
            if failure is not None:
                results.append(ClassifyResult(index=i, error=failure.code, message=failure.message))
                continue
            results.append(result(i, probabilities(np.stack(outputs), model.multi_label)))
        return ClassifyResponse(
            model=served.name,
            head=HEAD_NAME,
            kind="scores" if kind == "scores" else "sequence",
            labels=labels,
            results=results,
            usage=EncoderUsage.of(tokens),
            multi_label=model.multi_label,
        )

    return Prepared(served, call, "classify", req, options, rows, finish, with_head, expires_rows=True)
