"""POST /v2/embed: Cohere's embed API (v2), so that the official `cohere` client's
`ClientV2.embed` works unmodified (issue 24). The texts run through `/v1/embeddings`' path (same
rows, prompts, result cache); each of `embedding_types` is that float vector encoded as
`encodings.py` encodes it (int8/uint8 with the package's calibration ranges, else [-1, 1] for a
normalized model).

- `input_type` picks a sentence-transformers prompt of the package: search_query → `search_query`
  or `query`; search_document → `search_document`, `document`, `passage` or `corpus`;
  classification and clustering → the prompt of that name; none found (or no input_type) → the
  package's default prompt. `image` and image inputs are refused (texts only).
- `truncate`: END (Cohere's default) cuts a long text's end, START its start, NONE answers 400;
  `max_tokens` cuts each text to that many tokens (special tokens aside) the same way first.
- `output_dimension`: `dimensions` (a Matryoshka cut, renormalised for a normalized model).
- Cohere's answer has no per-text error: a text that fails on `/v1/embeddings`' path (R-API-10)
  fails the request here (400; 504 `deadline_exceeded` past `options.deadline_ms`).
"""

from __future__ import annotations

import numpy as np

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.contracts import TextEmbedder, is_prompted_embedder
from vllm_srun.adapters.schemas.cohere import (
    ApiVersion,
    BilledUnits,
    CohereMeta,
    EmbeddingsByType,
    EmbedV2Request,
    EmbedV2Response,
)
from vllm_srun.adapters.schemas.embeddings import EmbeddingsOptions, EmbeddingsRequest
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces.embedding_outputs import model_outputs
from vllm_srun.adapters.surfaces.embeddings import DOCUMENT_PROMPTS, embedder, embeddings
from vllm_srun.adapters.surfaces.encodings import quantize, ranges_for, wire
from vllm_srun.domain.errors import DeadlineExceeded, InvalidRequest

PROMPTS_BY_INPUT_TYPE = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", *DOCUMENT_PROMPTS),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def cohere_prompt(model: object, input_type: str | None) -> str | None:
    """The name of MODEL's prompt for INPUT_TYPE (module doc); None: the default prompt."""
    if input_type == "image":
        raise InvalidRequest("input_type image: this model embeds texts")
    prompts = model.prompts if is_prompted_embedder(model) else {}
    wanted = PROMPTS_BY_INPUT_TYPE.get(input_type or "", ())
    return next((name for name in wanted if name in prompts), None)


def _cut(model: TextEmbedder, text: str, keep: int, from_start: bool) -> str:
    """TEXT cut to its first (or, FROM_START, its last) KEEP tokens."""
    tokenizer = getattr(model, "tokenizer", None)
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is None:
        raise InvalidRequest("truncate START and max_tokens need a model with a text tokenizer")
    enc = inner.encode(text, add_special_tokens=False)
    if len(enc.ids) <= keep:
        return text
    if keep <= 0:
        return ""
    return text[enc.offsets[len(enc.ids) - keep][0] :] if from_start else text[: enc.offsets[keep - 1][1]]


def _texts(model: TextEmbedder, req: EmbedV2Request) -> list[str]:
    assert req.texts is not None
    texts = list(req.texts)
    from_start = req.truncate == "START"
    if req.max_tokens is not None:
        texts = [_cut(model, t, req.max_tokens, from_start) for t in texts]
    if from_start:  # what fits the model's limit with its special tokens
        specials = int(getattr(getattr(model, "tokenizer", None), "num_special_tokens", lambda: 2)())
        texts = [_cut(model, t, model.max_input_tokens - specials, True) for t in texts]
    return texts


async def embed_v2(served: ServedModel, req: EmbedV2Request, call: Call) -> EmbedV2Response:
    model = embedder(served, call)
    for name, given in (("images", req.images), ("inputs", req.inputs)):
        if given:
            raise InvalidRequest(f"{name}: this server embeds texts only (send texts)")
    if not req.texts:
        raise InvalidRequest("texts is required (a list of at least one text)")
    if "dense" not in model_outputs(model):
        raise InvalidRequest("this model has no dense embeddings (its outputs are on /v1/embeddings' embedding_type)")
    if req.output_dimension is not None and req.output_dimension > model.dimensions:
        raise InvalidRequest(f"output_dimension {req.output_dimension} is larger than the model's {model.dimensions}")
    types = list(dict.fromkeys(req.embedding_types or ["float"]))
    dims = req.output_dimension or model.dimensions
    ranges = {t: ranges_for(model, t, dims, model.normalized, "embedding_types")[0] for t in types}
    texts: list[str] = await served.prepare(call, _texts, model, req)
    inner = EmbeddingsRequest(
        input=list(texts),
        model=req.model,
        dimensions=req.output_dimension,
        prompt_name=cohere_prompt(model, req.input_type),
        options=EmbeddingsOptions(overflow="reject" if req.truncate == "NONE" else "truncate"),
    )
    try:
        answer = await embeddings(served, inner, call)
        failed = next((d for d in answer.data if d.error is not None), None)
        if failed is not None:  # Cohere's answer has no per-text errors: the first one fails the request
            if failed.error == "deadline_exceeded":
                raise DeadlineExceeded(failed.message or "deadline exceeded")
            raise InvalidRequest(failed.message or str(failed.error))
    except InvalidRequest as exc:  # name Cohere's fields, not /v1/embeddings'
        hint = 'set options.overflow to "truncate" to cut it'
        raise InvalidRequest(
            str(exc).replace("input[", "texts[", 1).replace(hint, "truncate END or START cuts it")
        ) from None
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    by_type: dict[str, object] = {}
    for t in types:
        if t == "base64":
            by_type["base64"] = [wire(v, True) for v in vectors]
        else:
            by_type["float_" if t == "float" else t] = quantize(vectors, t, ranges[t]).tolist()
    meta = CohereMeta(ApiVersion(), BilledUnits(answer.usage.prompt_tokens))
    return EmbedV2Response(
        embeddings=EmbeddingsByType(**by_type),  # type: ignore[arg-type]
        texts=list(req.texts),
        meta=meta,
        model=served.name,
    )
