"""POST /v1/embeddings (R-API-1): inputs → rows → vectors, OpenAI-compatible.

What it needs of a model is the `TextEmbedder` contract (`adapters/contracts.py`).
"""

from __future__ import annotations

import base64

import numpy as np

from vllm_srun.adapters.contracts import TextEmbedder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.schemas.common import MAX_INPUTS
from vllm_srun.adapters.schemas.embeddings import (
    Embedding,
    EmbeddingsOptions,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    TextInput,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import Disconnected, ServedModel
from vllm_srun.adapters.surfaces.common import Prepared, answer
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge, UnsupportedSurface
from vllm_srun.domain.rows import RowSpec


def _texts(req: EmbeddingsRequest) -> list[str]:
    items = [req.input] if isinstance(req.input, str) else req.input
    if len(items) > MAX_INPUTS:
        raise RequestTooLarge(f"too many inputs: {len(items)} (at most {MAX_INPUTS})")
    texts: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, TextInput):
            texts.append(item.text)
        else:
            raise UnsupportedSurface(f"input[{i}] is {type(item).__name__}: this model reads text only")
    return texts


def embedder(served: ServedModel) -> TextEmbedder:
    model = served.require_surface("embeddings")
    assert isinstance(model, TextEmbedder)  # checked when the model loaded
    return model


def prepare_embeddings(served: ServedModel, req: EmbeddingsRequest) -> Prepared[EmbeddingsResponse]:
    model = embedder(served)
    texts = _texts(req)
    options = req.options or EmbeddingsOptions()
    if req.dimensions is not None and req.dimensions > model.dimensions:
        raise InvalidRequest(f"dimensions {req.dimensions} is larger than the model's {model.dimensions}")
    encoded = model.tokenize(texts, truncate=options.overflow == "truncate")
    for i, enc in enumerate(encoded):
        if len(enc.ids) > model.max_input_tokens:
            raise InvalidRequest(
                f"input[{i}] has {enc.n_tokens} tokens, over the model's limit of {model.max_input_tokens}; "
                'set options.overflow to "truncate" to cut it'
            )
    rows = [RowSpec(len(enc.ids), enc) for enc in encoded]
    return Prepared(
        served, "embeddings", req, options, rows, lambda stats: _response(served, model, req, encoded, stats)
    )


async def embeddings(
    served: ServedModel, req: EmbeddingsRequest, timing: RequestTiming | None, disconnected: Disconnected | None = None
) -> EmbeddingsResponse:
    return await answer(prepare_embeddings(served, req), timing, disconnected)


def _response(
    served: ServedModel, model: TextEmbedder, req: EmbeddingsRequest, encoded: list[Encoded], stats: ForwardStats
) -> EmbeddingsResponse:
    vectors = np.stack(stats.outputs).astype(np.float32, copy=False)
    if req.dimensions is not None and req.dimensions < vectors.shape[1]:
        vectors = vectors[:, : req.dimensions]
        if model.normalized:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    if req.encoding_format == "base64":
        data = [
            Embedding(i, base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii"))
            for i, v in enumerate(vectors)
        ]
    else:
        data = [Embedding(i, v.tolist()) for i, v in enumerate(vectors)]
    tokens = sum(len(enc.ids) for enc in encoded)
    return EmbeddingsResponse(object="list", data=data, model=served.name, usage=EmbeddingsUsage(tokens, tokens))
