"""POST /v1/rerank and /v2/rerank (R-API-3): one (query, document) row per document through a
cross-encoder (`num_labels == 1`); relevance = sigmoid(logit). Cohere (v1 and v2 clients) and
Jina request/response shapes: results sorted by relevance, highest first, cut to `top_n`.

Over-long pairs are rejected unless the request asks otherwise: `options.overflow: truncate`,
Cohere's `max_tokens_per_doc` (cuts each document to that many tokens), or `options.overflow:
window` (the query is kept whole in every window of the document; the best window scores).
A request without `options.overflow` takes the deployment's `input.overflow`, whose
`input.max_tokens` caps each pair (and window) below the model's limit. A multi-vector model
without a classification head scores by MaxSim instead (`maxsim.py`); it has no windows.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import numpy as np

from vllm_srun.adapters.contracts import Encoded, LogitsRow, PairScorer, is_pair_scorer, is_text_embedder
from vllm_srun.adapters.contracts.outputs import is_maxsim_scorer
from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.schemas.common import MAX_INPUTS
from vllm_srun.adapters.schemas.encoder import (
    RerankOptions,
    RerankRequest,
    RerankResponse,
    RerankResult,
    Usage,
    WindowOptions,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import Disconnected, ServedModel, TokenBudget
from vllm_srun.adapters.surfaces.common import Prepared, answer
from vllm_srun.adapters.surfaces.maxsim import maxsim_rows, maxsim_scores
from vllm_srun.adapters.surfaces.overflow import (
    encode_items,
    input_budget,
    overflow_mode,
    overflow_origin,
    split_overflow_windows,
)
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge, quoted
from vllm_srun.domain.input_budget import InputBudget
from vllm_srun.domain.rows import RowSpec


def _text(doc: str | dict[str, Any], rank_fields: list[str] | None, i: int) -> str:
    if isinstance(doc, str):
        return doc
    fields = rank_fields or ["text"]
    missing = [f for f in fields if not isinstance(doc.get(f), str)]
    if missing:
        raise InvalidRequest(
            f'documents[{i}] has no text field {quoted(missing[0])} (a document is a string or {{"text": ...}})'
        )
    if rank_fields is None:
        return doc["text"]
    return "\n".join(f"{f}: {doc[f]}" for f in fields)


def _cut(model: PairScorer, text: str, max_tokens: int) -> str:
    """TEXT cut after its first MAX_TOKENS tokens (Cohere's max_tokens_per_doc)."""
    enc = model.tokenizer.tokenizer.encode(text, add_special_tokens=False)
    return text if len(enc.ids) <= max_tokens else text[: enc.offsets[max_tokens - 1][1]]


def _groups(
    model: PairScorer,
    req: RerankRequest,
    mode: str,
    window: WindowOptions,
    budget: TokenBudget,
    limits: InputBudget,
    origin: str,
) -> list[list[Encoded]]:
    """Each document's rows (one, or one per window) with the query, each within LIMITS."""
    texts = [_text(d, req.rank_fields, i) for i, d in enumerate(req.documents)]
    if req.max_tokens_per_doc is not None:
        texts = [_cut(model, t, req.max_tokens_per_doc) for t in texts]
    pairs = [(req.query, t) for t in texts]
    if mode == "window":
        return [
            [w.encoded for w in s.windows]
            for s in split_overflow_windows(
                model,
                pairs,
                window.tokens,
                window.overlap,
                budget,
                limit=limits.limit(model.max_input_tokens),
                origin=origin,
            )
        ]
    cut = mode == "truncate"
    return [[e] for e in encode_items(model, pairs, truncate=cut, budget=budget, max_length=limits.max_tokens)]


async def rerank(
    served: ServedModel, req: RerankRequest, timing: RequestTiming | None, disconnected: Disconnected | None = None
) -> RerankResponse:
    return await answer(await prepare_rerank(served, req), timing, disconnected)


async def prepare_rerank(served: ServedModel, req: RerankRequest) -> Prepared[RerankResponse]:
    model = served.require_surface("rerank")
    assert is_pair_scorer(model)  # checked when the model loaded
    if len(req.documents) > MAX_INPUTS:
        raise RequestTooLarge(f"too many documents: {len(req.documents)} (at most {MAX_INPUTS})")
    options = req.options or RerankOptions()
    limits = input_budget(served)  # the deployment's input budget (none under the golden check)
    mode = overflow_mode(options, limits.overflow)
    origin = overflow_origin(options)
    if req.max_tokens_per_doc is not None and options.overflow is None and options.window is None:
        mode = "truncate"  # the client asked for cut documents
    window = options.window or WindowOptions(tokens=limits.limit(model.max_input_tokens))
    by_maxsim = is_maxsim_scorer(scorer := model) and scorer.rerank_scoring == "maxsim"
    if by_maxsim:
        embedder: object = model
        assert is_text_embedder(embedder)
        if mode == "window":
            raise InvalidRequest(
                f'overflow "window" ({origin}) needs a cross-encoder: this model reranks by MaxSim; '
                'set options.overflow to "truncate" or "reject"'
            )
        texts = [_text(d, req.rank_fields, i) for i, d in enumerate(req.documents)]
        if req.max_tokens_per_doc is not None:
            texts = [_cut(model, t, req.max_tokens_per_doc) for t in texts]
        rows = await served.prepare(
            maxsim_rows, embedder, req.query, texts, mode == "truncate", served.token_budget(), limits.max_tokens
        )
        groups: list[list[Encoded]] = []
    else:
        groups = await served.prepare(_groups, model, req, mode, window, served.token_budget(), limits, origin)
        rows = [RowSpec(len(e.ids), LogitsRow(e)) for group in groups for e in group]

    def finish(stats: ForwardStats) -> RerankResponse:
        if by_maxsim:
            best = maxsim_scores(stats.outputs)
        else:
            logits = np.stack(stats.outputs).astype(np.float64)[:, 0]
            scores = 1.0 / (1.0 + np.exp(-logits))
            best, at = [], 0
            for group in groups:
                best.append(float(scores[at : at + len(group)].max()))
                at += len(group)
        order = sorted(range(len(best)), key=lambda i: (-best[i], i))
        results = [RerankResult(i, best[i]) for i in order]
        tokens = sum(r.tokens for r in rows)
        return RerankResponse(model=served.name, results=results, usage=Usage(tokens, tokens))

    def polish(response: RerankResponse) -> RerankResponse:
        results = response.results[: req.top_n] if req.top_n is not None else response.results
        if req.return_documents:
            results = [
                msgspec.structs.replace(r, document={"text": d} if isinstance(d := req.documents[r.index], str) else d)
                for r in results
            ]
        return msgspec.structs.replace(response, results=results, id=str(uuid.uuid4()))

    return Prepared(served, "rerank", req, options, rows, finish, polish)
