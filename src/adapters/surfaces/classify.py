"""POST /v1/classify (R-API-2): texts or text pairs → one row each (or one per window) → label
probabilities from the sequence-classification head.

Single-label heads: softmax; `label` is the argmax. Multi-label heads (`problem_type:
multi_label_classification`): sigmoid per label; `label` lists every label at or above
`options.threshold` (default 0.5), most probable first. Over-long inputs are rejected, cut when
`overflow: truncate`, or read in windows when asked (`overflow: window`, `window: {tokens,
overlap}`); window probabilities are reduced by max per label. A request without
`options.overflow` takes the deployment's `input.overflow`, and its `input.max_tokens` caps each
input (and window) below the model's limit (`overflow.py`). A token head (`kind: token`)
labels every token and answers spans instead: `token_spans.py`.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from vllm_srun.adapters.contracts import LogitsRow, is_text_classifier
from vllm_srun.adapters.contracts.token_heads import is_token_classifier
from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.schemas.common import MAX_INPUTS
from vllm_srun.adapters.schemas.encoder import (
    ClassifyOptions,
    ClassifyRequest,
    ClassifyResponse,
    ClassifyResult,
    InputInfo,
    Usage,
    WindowOptions,
    WindowSpan,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import Disconnected, ServedModel
from vllm_srun.adapters.surfaces.common import Prepared, answer
from vllm_srun.adapters.surfaces.overflow import (
    Item,
    encode_items,
    input_budget,
    overflow_mode,
    overflow_origin,
    split_overflow_windows,
)
from vllm_srun.adapters.surfaces.token_spans import check_options, prepare_tokens
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge
from vllm_srun.domain.rows import RowSpec

DEFAULT_THRESHOLD = 0.5


def _items(req: ClassifyRequest) -> list[Item]:
    raw = [req.input] if isinstance(req.input, str) else req.input
    if len(raw) > MAX_INPUTS:
        raise RequestTooLarge(f"too many inputs: {len(raw)} (at most {MAX_INPUTS})")
    return [item if isinstance(item, str) else (item.text, item.text_pair) for item in raw]


def probabilities(logits: np.ndarray, multi_label: bool) -> np.ndarray:
    """[rows, labels] logits → probabilities (float64): sigmoid per label, or softmax per row."""
    x = logits.astype(np.float64)
    if multi_label:
        return 1.0 / (1.0 + np.exp(-x))
    x = x - x.max(axis=1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=1, keepdims=True)


def _label(p: np.ndarray, labels: list[str], multi_label: bool, threshold: float) -> str | list[str]:
    if not multi_label:
        return labels[int(np.argmax(p))]
    order = sorted(range(len(labels)), key=lambda j: (-p[j], j))
    return [labels[j] for j in order if p[j] >= threshold]


async def classify(
    served: ServedModel, req: ClassifyRequest, timing: RequestTiming | None, disconnected: Disconnected | None = None
) -> ClassifyResponse:
    return await answer(await prepare_classify(served, req), timing, disconnected)


async def prepare_classify(served: ServedModel, req: ClassifyRequest) -> Prepared[ClassifyResponse]:
    model = served.require_surface("classify")
    assert is_text_classifier(model)  # checked when the model loaded
    items = _items(req)
    options = req.options or ClassifyOptions()
    limits = input_budget(served)  # the deployment's input budget (none under the golden check)
    mode = overflow_mode(options, limits.overflow)
    if is_token_classifier(heads := model) and heads.classify_kind == "token":  # token heads: token_spans.py
        return await prepare_tokens(served, model, req, items, options, mode, limits.limit(model.max_input_tokens))
    check_options(options, token_head=False)
    if options.threshold is not None and not model.multi_label:
        raise InvalidRequest(
            "options.threshold applies to multi-label heads; this model's head is single-label (softmax)"
        )
    threshold = DEFAULT_THRESHOLD if options.threshold is None else options.threshold
    budget = served.token_budget()
    if mode == "window":
        most = limits.limit(model.max_input_tokens)
        window = options.window or WindowOptions(tokens=most)
        split = await served.prepare(
            partial(
                split_overflow_windows,
                model,
                items,
                window.tokens,
                window.overlap,
                budget,
                limit=most,
                origin=overflow_origin(options),
            )
        )
        groups = [[w.encoded for w in s.windows] for s in split]
        full = [s.n_tokens for s in split]
    else:
        encoded = await served.prepare(
            partial(
                encode_items,
                model,
                items,
                truncate=mode == "truncate",
                budget=budget,
                max_length=limits.max_tokens,  # the deployment's input budget, if any
            )
        )
        groups = [[e] for e in encoded]
        full = [e.n_tokens for e in encoded]

    rows = [RowSpec(len(e.ids), LogitsRow(e)) for group in groups for e in group]

    def finish(stats: ForwardStats) -> ClassifyResponse:
        probs = probabilities(np.stack(stats.outputs), model.multi_label)
        results, at = [], 0
        for i, group in enumerate(groups):
            part = probs[at : at + len(group)]
            at += len(group)
            reduced = part.max(axis=0)
            spans = None
            if mode == "window":
                spans = [
                    WindowSpan(w.start, w.end, len(w.encoded.ids), p.tolist()) for w, p in zip(split[i].windows, part)
                ]
            info = InputInfo(tokens=full[i], truncated=any(e.truncated for e in group), windows=spans)
            results.append(
                ClassifyResult(
                    index=i,
                    label=_label(reduced, model.labels, model.multi_label, threshold),
                    probabilities=reduced.tolist(),
                    input=info,
                )
            )
        tokens = sum(r.tokens for r in rows)
        return ClassifyResponse(
            model=served.name,
            labels=list(model.labels),
            results=results,
            usage=Usage(tokens, tokens),
            multi_label=model.multi_label,
        )

    return Prepared(served, "classify", req, options, rows, finish)
