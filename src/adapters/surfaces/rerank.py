"""POST /v1/rerank (R-API-3, the upstream contract's rerank) and /v2/rerank (Cohere's): one (query,
document) row per document through a cross-encoder (`num_labels == 1`); relevance = sigmoid(logit).
Results sorted by relevance, highest first, cut to `top_n`; on /v1/rerank the documents that
failed follow them, each with its `error` in its slot (R-API-10).

Over-long pairs fail in their slot (`max_length_exceeded`) unless the request asks otherwise:
`options.overflow: truncate`, Cohere's `max_tokens_per_doc` (cuts each document to that many
tokens), or `options.overflow: window` (the query is kept whole in every window of the
document; the best window scores). A request without `options.overflow` takes the deployment's
`input.overflow`; `options.max_tokens` (at most the deployment's `input.max_tokens`, at most the
model's limit) caps each pair (and window). A multi-vector model without a classification head
scores by MaxSim instead (`maxsim.py`); it has no windows and no logit. `layer`/`dimensions` must
name an exit the card declares (`rerank.exits`: every reranker of ours has one, its last layer).

`document` (with `return_documents`), the one field where the contract and Cohere's clients
collide (R-API-11, docs/contract.md): a document sent as a string comes back as that string
(the contract) — unless the request is in Cohere's form: any document sent as an object, or one
of Cohere's own fields (`rank_fields`, `max_tokens_per_doc`, `priority`); then every document
comes back as Cohere writes it (`{"text": ...}`, or the object sent). `/v2/rerank` always
answers in Cohere's form, and as Cohere has no per-document errors, a document that fails there
fails the request (400; 504 past the deadline).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import msgspec
import numpy as np

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.contracts import Encoded, LogitsRow, PairScorer, is_pair_scorer, is_text_embedder
from vllm_srun.adapters.contracts.outputs import is_maxsim_scorer
from vllm_srun.adapters.schemas.common import MAX_INPUTS
from vllm_srun.adapters.schemas.encoder import (
    EncoderUsage,
    InputUsage,
    RerankOptions,
    RerankRequest,
    RerankResponse,
    RerankResult,
    WindowOptions,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel, TokenBudget
from vllm_srun.adapters.surfaces.common import ItemFailure, Prepared, answer, any_expired, expired
from vllm_srun.adapters.surfaces.embeddings import card_section
from vllm_srun.adapters.surfaces.maxsim import maxsim_rows, maxsim_scores
from vllm_srun.adapters.surfaces.overflow import (
    TokenLimit,
    encode_items,
    input_budget,
    overflow_mode,
    overflow_origin,
    split_overflow_windows,
    token_limit,
)
from vllm_srun.domain.errors import DeadlineExceeded, InvalidRequest, RequestTooLarge, quoted
from vllm_srun.domain.scheduling.answers import EXPIRED
from vllm_srun.domain.scheduling.rows import RowSpec

COHERE_FIELDS = ("rank_fields", "max_tokens_per_doc", "priority")  # fields only Cohere's clients send


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


def cohere_form(req: RerankRequest) -> bool:
    """Whether REQ is in Cohere's form (module doc): its documents then come back as Cohere writes them."""
    return any(isinstance(d, dict) for d in req.documents) or any(getattr(req, f) is not None for f in COHERE_FIELDS)


def check_exit(model: Any, layer: int | None, dimensions: int | None) -> None:
    """400 unless LAYER and DIMENSIONS (each defaulting to the served exit's) name an exit the
    model's card declares (`rerank.exits`)."""
    if layer is None and dimensions is None:
        return
    section = card_section(model).get("rerank") or {}
    exits = [(int(e["layer"]), int(e["dimension"])) for e in section.get("exits") or []]
    default = section.get("default") or {}
    wanted = (
        layer if layer is not None else default.get("layer"),
        dimensions if dimensions is not None else default.get("dimension"),
    )
    if wanted not in exits:
        have = ", ".join(f"layer {a} dimensions {b}" for a, b in exits) or "none"
        raise InvalidRequest(
            f"layer {wanted[0]} and dimensions {wanted[1]} are not a pair-scorer exit of this model (its exits: {have})"
        )


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
    limit: TokenLimit,
    origin: str,
) -> tuple[list[list[Encoded] | ItemFailure], list[int]]:
    """Each document's rows (one, or one per window) with the query, each within LIMIT (a
    document that cannot be read that way fails in its slot), and each pair's whole length."""
    texts = [_text(d, req.rank_fields, i) for i, d in enumerate(req.documents)]
    if req.max_tokens_per_doc is not None:
        texts = [_cut(model, t, req.max_tokens_per_doc) for t in texts]
    pairs: list[str | tuple[str, str] | ItemFailure] = [(req.query, t) for t in texts]
    if mode == "window":
        split = split_overflow_windows(model, pairs, window.tokens, window.overlap, budget, limit=limit, origin=origin)
        return (
            [s if isinstance(s, ItemFailure) else [w.encoded for w in s.windows] for s in split],
            [0 if isinstance(s, ItemFailure) else s.n_tokens for s in split],
        )
    encoded = encode_items(model, pairs, truncate=mode == "truncate", budget=budget, limit=limit)
    return [e if isinstance(e, ItemFailure) else [e] for e in encoded], [
        0 if isinstance(e, ItemFailure) else e.n_tokens for e in encoded
    ]


def _usage(group: list[Encoded], whole: int, windowed: bool) -> InputUsage:
    """A document's usage: its pair's WHOLE length, and what the model read of it (a windowed
    pair: all of it, in its windows)."""
    if windowed:
        return InputUsage(tokens=whole, processed_tokens=whole, truncated=False, windows=len(group))
    (row,) = group
    return InputUsage(tokens=row.n_tokens, processed_tokens=len(row.ids), truncated=row.truncated)


async def rerank(served: ServedModel, req: RerankRequest, call: Call) -> RerankResponse:
    return await answer(await prepare_rerank(served, req, call))


async def rerank_v2(served: ServedModel, req: RerankRequest, call: Call) -> RerankResponse:
    """Cohere's /v2/rerank: Cohere's document form, and a document that fails fails the request."""
    response = await answer(await prepare_rerank(served, req, call, cohere=True))
    failed = next((r for r in response.results if r.error is not None), None)
    if failed is not None:
        message = failed.message or failed.error or "the document failed"
        if failed.error == "deadline_exceeded":
            raise DeadlineExceeded(message)
        raise InvalidRequest(message.replace("input[", "documents[", 1))
    return response


async def prepare_rerank(
    served: ServedModel, req: RerankRequest, call: Call, cohere: bool = False
) -> Prepared[RerankResponse]:
    """REQ's rows; COHERE: the request came to Cohere's route (its documents in Cohere's form)."""
    model = served.require_surface("rerank", call)
    assert is_pair_scorer(model)  # checked when the model loaded
    if len(req.documents) > MAX_INPUTS:
        raise RequestTooLarge(f"too many documents: {len(req.documents)} (at most {MAX_INPUTS})")
    check_exit(model, req.layer, req.dimensions)
    options = req.options or RerankOptions()
    mode = overflow_mode(options, input_budget(served, call).overflow)
    origin = overflow_origin(options)
    if req.max_tokens_per_doc is not None and options.overflow is None and options.window is None:
        mode = "truncate"  # the client asked for cut documents
    limit = token_limit(served, call, model.max_input_tokens, options)
    window = options.window or WindowOptions(tokens=limit.tokens)
    by_maxsim = is_maxsim_scorer(scorer := model) and scorer.rerank_scoring == "maxsim"
    groups: list[list[Encoded] | ItemFailure] = []
    wholes: list[int] = []
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
        entries = await served.prepare(
            call, maxsim_rows, embedder, req.query, texts, mode == "truncate", served.token_budget(), limit
        )
        rows = [e for e in entries if isinstance(e, RowSpec)]
    else:
        groups, wholes = await served.prepare(
            call, _groups, model, req, mode, window, served.token_budget(), limit, origin
        )
        rows = [RowSpec(len(e.ids), LogitsRow(e)) for group in groups if isinstance(group, list) for e in group]

    def finish_maxsim(stats: ForwardStats) -> RerankResponse:
        """The query's row is every document's: past the deadline they all fail together."""
        query, *documents = entries
        assert isinstance(query, RowSpec)  # a query that cannot be read fails the request
        scored, failed, at, tokens = [], [], 1, 0
        dead = stats.outputs[0] is EXPIRED
        outputs = [stats.outputs[0]]
        for i, entry in enumerate(documents):
            if isinstance(entry, ItemFailure):
                failed.append(RerankResult(i, error=entry.code, message=entry.message))
                continue
            out = stats.outputs[at]
            at += 1
            if dead or out is EXPIRED:
                failed.append(RerankResult(i, error="deadline_exceeded", message=expired(i).message))
                continue
            outputs.append(out)
            scored.append(i)
            tokens += entry.tokens
        scores = maxsim_scores(outputs) if scored else []
        tokens += query.tokens if scored else 0
        results = sorted(
            (RerankResult(i, s) for i, s in zip(scored, scores)), key=lambda r: (-(r.relevance_score or 0.0), r.index)
        )
        return RerankResponse(model=served.name, results=results + failed, usage=EncoderUsage.of(tokens))

    def finish(stats: ForwardStats) -> RerankResponse:
        if by_maxsim:
            return finish_maxsim(stats)
        scored, failed, at, tokens = [], [], 0, 0
        for i, group in enumerate(groups):
            if isinstance(group, ItemFailure):
                failed.append(RerankResult(i, error=group.code, message=group.message))
                continue
            own = stats.outputs[at : at + len(group)]
            at += len(group)
            if any_expired(own):
                failed.append(RerankResult(i, error="deadline_exceeded", message=expired(i).message))
                continue
            tokens += sum(len(e.ids) for e in group)
            logit = float(np.asarray(own, dtype=np.float64).reshape(len(group), -1)[:, 0].max())
            usage = _usage(group, wholes[i], mode == "window")
            scored.append(RerankResult(i, 1.0 / (1.0 + math.exp(-logit)), logit, input=usage))
        scored.sort(key=lambda r: (-(r.logit or 0.0), r.index))
        return RerankResponse(model=served.name, results=scored + failed, usage=EncoderUsage.of(tokens))

    documents_as_cohere = cohere or cohere_form(req)

    def polish(response: RerankResponse) -> RerankResponse:
        results = response.results
        if req.top_n is not None:  # the top N scored documents, then every failed one
            scored = [r for r in results if r.error is None]
            results = scored[: req.top_n] + [r for r in results if r.error is not None]
        if req.return_documents:
            results = [r if r.error is not None else _with_document(r, req, documents_as_cohere) for r in results]
        return msgspec.structs.replace(response, results=results, id=str(uuid.uuid4()))

    return Prepared(served, call, "rerank", req, options, rows, finish, polish, expires_rows=True)


def _with_document(result: RerankResult, req: RerankRequest, cohere: bool) -> RerankResult:
    sent = req.documents[result.index]
    if cohere:
        return msgspec.structs.replace(result, document={"text": sent} if isinstance(sent, str) else sent)
    assert isinstance(sent, str)  # an object document makes the request Cohere's form
    return msgspec.structs.replace(result, document=sent)
