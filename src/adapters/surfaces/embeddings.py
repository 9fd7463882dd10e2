"""POST /v1/embeddings (R-API-1): inputs → rows → vectors, OpenAI-compatible.

What it needs of a model is the `TextEmbedder` contract (`adapters/contracts/surfaces.py`); a model that
also implements `MediaEmbedder` reads `image_url` and `video_url` items (`data:` URLs only):
each image is one row of the model's media lane, each video one row per sampled frame, whose
vectors are mean-pooled (and normalized for a normalized model); one that implements
`AudioEmbedder` reads `input_audio` items (base64 `data` and its `format`): each one row of the
model's audio lane. A model whose `modalities` lack `text` refuses text items. Everything about an input is
checked before any forward: its kind against the model's modalities, the URL, the limits and
the decoding (a bad input answers 400 naming its index, and costs no forward). A text longer
than the model's limit, or than the deployment's `input.max_tokens` below it, is refused unless
the overflow (`options.overflow`, else the deployment's `input.overflow`) is `truncate`, which
cuts it there; embeddings have no windows, so `window` refuses as `reject` does.

Prompts (a sentence-transformers package's `prompts`, card `embedding.prompts`): `prompt_name`
picks one by name, `input_type` by kind (query → `query`; document → `document`, `passage` or
`corpus`, the first the package has; none of them → the default prompt); neither → the package's
`default_prompt_name`. The prompt's text is prepended to every text input before tokenizing, so
its tokens count in `usage`. An unknown name, `input_type` for a model without prompts, or the two
fields naming different prompts answer 400 listing the model's prompts.

`embedding_type` (sparse, multi_vector), the sparse options and the quantized `encoding_format`s
are checked and rendered by `embedding_outputs.py`: a sparse or multi-vector text is one
`TokenOutputRow` (contracts/outputs.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import (
    Encoded,
    MediaError,
    MediaWorkerDied,
    TextEmbedder,
    is_audio_embedder,
    is_media_embedder,
    is_prompted_embedder,
    is_text_embedder,
)
from vllm_srun.adapters.contracts.outputs import TokenOutputRow
from vllm_srun.adapters.media.audio_input import audio_data_bytes
from vllm_srun.adapters.media.data_url import data_url_bytes
from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.schemas.common import MAX_INPUTS
from vllm_srun.adapters.schemas.embeddings import (
    AudioInput,
    Embedding,
    EmbeddingsOptions,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    ImageUrlInput,
    InputItem,
    TextInput,
    VideoUrlInput,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import Disconnected, ServedModel, TokenBudget
from vllm_srun.adapters.surfaces.common import TOKENIZE_CHUNK, Prepared, answer
from vllm_srun.adapters.surfaces.embedding_outputs import (
    OutputPlan,
    dense_answers,
    multi_vector_answer,
    output_plan,
    sparse_answer,
)
from vllm_srun.adapters.surfaces.overflow import input_budget
from vllm_srun.domain.errors import InvalidRequest, MediaFailed, RequestTooLarge, UnsupportedSurface, quoted
from vllm_srun.domain.rows import RowSpec


@dataclass(frozen=True, slots=True)
class _Media:
    index: int
    kind: str  # image | video | audio
    data: bytes
    fmt: str = ""  # audio: the declared format


def _items(req: EmbeddingsRequest) -> list[InputItem]:
    items: list[InputItem] = [req.input] if isinstance(req.input, str) else list(req.input)
    if len(items) > MAX_INPUTS:
        raise RequestTooLarge(f"too many inputs: {len(items)} (at most {MAX_INPUTS})")
    return items


def _url(item: ImageUrlInput | VideoUrlInput) -> str:
    ref = item.image_url if isinstance(item, ImageUrlInput) else item.video_url
    return ref if isinstance(ref, str) else ref.url


def _split(items: list[InputItem], model: TextEmbedder) -> tuple[list[tuple[int, str]], list[_Media]]:
    """(index, text) of the text items and the media items (decoded from their data: URLs)."""
    media_model = model if is_media_embedder(model) else None
    modalities: frozenset[str] = getattr(model, "modalities", frozenset({"text"}))
    reads = sorted(modalities)
    texts: list[tuple[int, str]] = []
    media: list[_Media] = []
    for i, item in enumerate(items):
        if isinstance(item, (str, TextInput)):
            if "text" not in modalities:
                raise UnsupportedSurface(f"input[{i}] is text: this model reads {', '.join(reads)} only")
            texts.append((i, item if isinstance(item, str) else item.text))
            continue
        if isinstance(item, AudioInput):
            if not is_audio_embedder(model) or "audio" not in modalities:
                raise UnsupportedSurface(f"input[{i}] is audio: this model reads {', '.join(reads)} only")
            try:
                data = audio_data_bytes(item.input_audio.data, model.audio_limits.max_bytes)
            except MediaError as exc:
                raise InvalidRequest(f"input[{i}]: {exc}") from None
            media.append(_Media(i, "audio", data, item.input_audio.format))
            continue
        kind = "image" if isinstance(item, ImageUrlInput) else "video"
        if media_model is None or kind not in media_model.modalities:
            what = "an image" if kind == "image" else "a video"
            raise UnsupportedSurface(f"input[{i}] is {what}: this model reads {', '.join(reads)} only")
        limits = media_model.image_limits if kind == "image" else media_model.video_limits
        try:
            media.append(_Media(i, kind, data_url_bytes(_url(item), kind, limits.max_bytes)))
        except MediaError as exc:
            raise InvalidRequest(f"input[{i}]: {exc}") from None
    return texts, media


DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # input_type document: the first of these a package has


def resolve_prompt(model: object, input_type: str | None, prompt_name: str | None) -> str:
    """The prompt text to prepend to MODEL's text inputs (module doc); InvalidRequest for a bad choice."""
    prompts: dict[str, str] = {}
    default: str | None = None
    if is_prompted_embedder(model):
        prompts, default = dict(model.prompts), model.default_prompt_name
    names = f"this model's prompts: {', '.join(prompts)}" if prompts else "this model has no prompts"
    if prompt_name is not None and prompt_name not in prompts:
        raise InvalidRequest(f"prompt_name {quoted(prompt_name)} is not a prompt of this model ({names})")
    chosen = prompt_name
    if input_type is not None:
        if not prompts:
            raise InvalidRequest(f"input_type {input_type!r} needs a model with prompts ({names})")
        wanted = ("query",) if input_type == "query" else DOCUMENT_PROMPTS
        by_type = next((n for n in wanted if n in prompts), default)
        if prompt_name is not None and by_type != prompt_name:
            picks = f"prompt {by_type!r}" if by_type is not None else "no prompt"
            raise InvalidRequest(
                f"input_type {input_type!r} selects {picks} but prompt_name is {quoted(prompt_name)} ({names})"
            )
        chosen = by_type
    elif chosen is None:
        chosen = default
    return prompts.get(chosen, "") if chosen is not None else ""


def embedder(served: ServedModel) -> TextEmbedder:
    model = served.require_surface("embeddings")
    assert is_text_embedder(model)  # checked when the model loaded
    return model


async def _decode(served: ServedModel, model: TextEmbedder, media: list[_Media], frames: int) -> list[Any]:
    """Pixels of every media item ([3, H, W] per image, [frames, 3, H, W] per video; audio: its
    features), decoded concurrently; the first failure (by input index) fails the request."""
    loader = served.media
    assert loader is not None, "a media model is served without a media loader"

    def one(m: _Media) -> Any:
        if m.kind == "audio":
            assert is_audio_embedder(model)
            return loader.audio(m.data, m.fmt, model.audio_limits, model.audio_preprocess)
        assert is_media_embedder(model)
        if m.kind == "image":
            return loader.image(m.data, model.image_limits, model.preprocess)
        return loader.video(m.data, frames, model.video_limits, model.preprocess)

    results = await asyncio.gather(*(one(m) for m in media), return_exceptions=True)
    for m, result in zip(media, results):
        if isinstance(result, MediaError):
            raise InvalidRequest(f"input[{m.index}]: {result}")
        if isinstance(result, MediaWorkerDied):
            raise MediaFailed(f"input[{m.index}]: {result}; retry the request")
        if isinstance(result, BaseException):
            raise result
    return list(results)


async def prepare_embeddings(served: ServedModel, req: EmbeddingsRequest) -> Prepared[EmbeddingsResponse]:
    """REQ validated into its rows: text rows tokenized (off the event loop for a large request,
    R-API-9), media decoded (off the request path when media workers run, R-MEDIA; the decode
    cache answers repeats, R-PERF-4), every failure raised before any row reaches a scheduler."""
    model = embedder(served)
    items = _items(req)
    options = req.options or EmbeddingsOptions()
    if req.dimensions is not None and req.dimensions > model.dimensions and req.embedding_type == "dense":
        raise InvalidRequest(f"dimensions {req.dimensions} is larger than the model's {model.dimensions}")
    plan = output_plan(model, req, options, items)
    prompt = resolve_prompt(model, req.input_type, req.prompt_name)
    media_model = model if is_media_embedder(model) else None
    frames = (options.frames or media_model.video_frames) if media_model is not None else 0
    limits = input_budget(served)  # the deployment's input budget (none under the golden check)
    text_rows, media = await served.prepare(
        _inputs,
        model,
        items,
        frames,
        (options.overflow or limits.overflow) == "truncate",  # window: embeddings have none, it rejects
        served.token_budget(),
        prompt,
        limits.max_tokens,
    )
    if plan.kind != "dense":  # a sparse or multi-vector row: answered by the model's token-level head
        keep = plan.keep_special
        text_rows = {
            i: RowSpec(r.tokens, TokenOutputRow(r.payload, plan.kind, keep), r.lane) for i, r in text_rows.items()
        }
    decoded = await _decode(served, model, media, frames) if media else []
    pixels = iter(decoded)
    spans: list[tuple[int, int]] = []  # each input's rows: (first, count)
    rows: list[RowSpec] = []
    for i in range(len(items)):
        start = len(rows)
        if i in text_rows:
            rows.append(text_rows[i])
        elif isinstance(items[i], AudioInput):
            assert is_audio_embedder(model)
            rows.append(RowSpec(model.audio_tokens, next(pixels), model.audio_lane))
        else:
            assert media_model is not None
            got = next(pixels)
            stack = [got] if got.ndim == 3 else list(got)
            rows.extend(RowSpec(media_model.image_tokens, p, media_model.media_lane) for p in stack)
        spans.append((start, len(rows) - start))
    return Prepared(
        served,
        "embeddings",
        req,
        options,
        rows,
        lambda stats: _response(served, model, req, plan, rows, spans, stats),
    )


async def embeddings(
    served: ServedModel, req: EmbeddingsRequest, timing: RequestTiming | None, disconnected: Disconnected | None = None
) -> EmbeddingsResponse:
    return await answer(await prepare_embeddings(served, req), timing, disconnected)


def _inputs(
    model: TextEmbedder,
    items: list[InputItem],
    frames: int,
    truncate: bool,
    budget: TokenBudget,
    prompt: str = "",
    max_tokens: int | None = None,
) -> tuple[dict[int, RowSpec], list[_Media]]:
    """The CPU work of preparing the inputs: each text item's row by input index (PROMPT before
    its text, tokenized a chunk at a time), and the media items' bytes (from their data: URLs),
    within the request's token BUDGET (a media item counts the rows it will become before
    anything decodes it); MAX_TOKENS (the deployment's input.max_tokens) caps a text's row."""
    text_items, media = _split(items, model)
    if is_media_embedder(model) and media:
        if any(m.kind == "video" for m in media) and frames > model.video_limits.max_frames:
            raise InvalidRequest(
                f"options.frames {frames} is over the model's limit of {model.video_limits.max_frames}"
            )
        budget.spend(sum(frames if m.kind == "video" else 1 for m in media if m.kind != "audio") * model.image_tokens)
    if is_audio_embedder(model):
        budget.spend(sum(m.kind == "audio" for m in media) * model.audio_tokens)
    if prompt:
        text_items = [(i, prompt + text) for i, text in text_items]
    encoded = _encode(model, text_items, truncate, budget, max_tokens)
    return {i: RowSpec(len(enc.ids), enc) for (i, _), enc in zip(text_items, encoded)}, media


def _encode(
    model: TextEmbedder,
    texts: list[tuple[int, str]],
    truncate: bool,
    budget: TokenBudget,
    max_tokens: int | None = None,
) -> list[Encoded]:
    """The (input index, text) items' rows, tokenized a chunk at a time, each at most the model's
    limit (or MAX_TOKENS below it): an over-long input (unless TRUNCATE) or a request over its
    token budget stops the work there."""
    limit = min(max_tokens or model.max_input_tokens, model.max_input_tokens)
    whose = "the model's limit" if limit == model.max_input_tokens else "the deployment's input.max_tokens"
    out: list[Encoded] = []
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = texts[start : start + TOKENIZE_CHUNK]
        try:
            part = model.tokenize([text for _, text in chunk], truncate=truncate, max_length=limit)
        except ValueError as exc:  # e.g. a limit that leaves no room after the special tokens
            raise InvalidRequest(str(exc)) from None
        for (i, _), enc in zip(chunk, part):
            # n_tokens: the input's own length (a row may be padded past it, e.g. SigLIP's)
            if enc.n_tokens > limit and not enc.truncated:
                raise InvalidRequest(
                    f"input[{i}] has {enc.n_tokens} tokens, over {whose} of {limit}; "
                    'set options.overflow to "truncate" to cut it'
                )
        budget.spend(sum(len(enc.ids) for enc in part))
        out.extend(part)
    return out


def _response(
    served: ServedModel,
    model: TextEmbedder,
    req: EmbeddingsRequest,
    plan: OutputPlan,
    rows: list[RowSpec],
    spans: list[tuple[int, int]],
    stats: ForwardStats,
) -> EmbeddingsResponse:
    tokens = sum(r.tokens for r in rows)
    usage = EmbeddingsUsage(tokens, tokens)
    if plan.kind != "dense":  # one row per input (texts only)
        render = sparse_answer if plan.kind == "sparse" else multi_vector_answer
        data = [Embedding(i, render(out, plan)) for i, out in enumerate(stats.outputs)]
        return EmbeddingsResponse(object="list", data=data, model=served.name, usage=usage)
    outputs = [np.asarray(o, dtype=np.float32) for o in stats.outputs]
    pooled = []
    for start, count in spans:
        if count == 1:
            pooled.append(outputs[start])
            continue
        mean = np.mean(np.stack(outputs[start : start + count]), axis=0)  # a video: its frames' mean
        pooled.append(mean / max(float(np.linalg.norm(mean)), 1e-12) if model.normalized else mean)
    vectors = np.stack(pooled).astype(np.float32, copy=False)
    if req.dimensions is not None and req.dimensions < vectors.shape[1]:
        vectors = vectors[:, : req.dimensions]
        if model.normalized:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    data = [Embedding(i, v) for i, v in enumerate(dense_answers(vectors, plan))]
    return EmbeddingsResponse(
        object="list", data=data, model=served.name, usage=usage, quantization=plan.quantization()
    )
