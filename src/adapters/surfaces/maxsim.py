"""`/v1/rerank` (and `/v2/rerank`) by MaxSim for a multi-vector model (issue 24): automatic for a
model whose rerank has no classification head (`contracts/outputs.MaxSimScorer`, card
`rerank.relevance`), e.g. a package with a ColBERT head.

The query is one multi-vector row and each document one more (the model's `query` prompt before
the query and its `document` prompt before each document, when it has prompts). A document's
relevance is ColBERT's MaxSim: the sum over the query's token vectors of their largest dot product
with one of the document's token vectors (vectors L2-normalised, so each term is a cosine).
`options.overflow: truncate` or Cohere's `max_tokens_per_doc` cut long texts; else a document over
the limit fails in its slot (`max_length_exceeded`) and a query over it fails the request; windows
are for cross-encoders (400).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import TextEmbedder, is_prompted_embedder
from vllm_srun.adapters.contracts.outputs import TokenOutputRow
from vllm_srun.adapters.serving.served import TokenBudget
from vllm_srun.adapters.surfaces.common import TOKENIZE_CHUNK, ItemFailure
from vllm_srun.adapters.surfaces.embeddings import resolve_prompt
from vllm_srun.adapters.surfaces.overflow import TokenLimit, too_long
from vllm_srun.domain.errors import InvalidRequest
from vllm_srun.domain.scheduling.rows import RowSpec


def _prompt(model: object, kind: str) -> str:
    has = is_prompted_embedder(model) and bool(model.prompts)
    return resolve_prompt(model, kind, None) if has else ""


def maxsim_rows(
    model: TextEmbedder,
    query: str,
    documents: Sequence[str],
    truncate: bool,
    budget: TokenBudget,
    limit: TokenLimit,
) -> list[RowSpec | ItemFailure]:
    """The query's row, then one per document (module doc), each at most LIMIT tokens unless
    TRUNCATE: a longer query fails the request (400), a longer document fails in its slot."""
    texts = [_prompt(model, "query") + query] + [_prompt(model, "document") + d for d in documents]
    rows: list[RowSpec | ItemFailure] = []
    hint = 'set options.overflow to "truncate" to cut it'
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        part = model.tokenize(texts[start : start + TOKENIZE_CHUNK], truncate=truncate, max_length=limit.tokens)
        budget.spend(sum(len(enc.ids) for enc in part))  # a refused text was read too
        for i, enc in enumerate(part, start):
            if enc.n_tokens <= limit.tokens or enc.truncated:
                rows.append(RowSpec(len(enc.ids), TokenOutputRow(enc, "multi_vector")))
            elif i == 0:
                raise InvalidRequest(f"the query has {enc.n_tokens} tokens, over {limit.text()}; {hint}")
            else:
                rows.append(too_long(i - 1, enc.n_tokens, limit, hint))
    return rows


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Σ over QUERY's vectors [Q, D] of their best dot product with DOCUMENT's [T, D] (0 without tokens)."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    sims = query.astype(np.float64) @ document.astype(np.float64).T
    return float(sims.max(axis=1).sum())


def maxsim_scores(outputs: Sequence[Any]) -> list[float]:
    """Each document's MaxSim against the query (OUTPUTS: the query's vectors, then each document's)."""
    query = np.asarray(outputs[0], dtype=np.float32)
    return [maxsim(query, np.asarray(doc, dtype=np.float32)) for doc in outputs[1:]]
