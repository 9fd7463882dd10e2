"""POST /v1/embeddings (R-API-1): inputs → rows → vectors, OpenAI-compatible.

What it needs of a model is the `TextEmbedder` contract (`adapters/contracts/surfaces.py`); a model that
also implements `MediaEmbedder` reads `image_url` and `video_url` items (`data:` URLs only):
each image is one row of the model's media lane, each video one row per sampled frame, whose
vectors are mean-pooled (and normalized for a normalized model); one that implements
`AudioEmbedder` reads `input_audio` items (base64 `data` and its `format`): each one row of the
model's audio lane. A model whose `modalities` lack `text` refuses text items (422, the whole
request: the model does not read that kind). Everything else about an input is checked before
any forward, and an input that fails fails in its own slot (R-API-10: `error`, `message`, no
row, its siblings answered): a bad URL, media over the limits or that does not decode
(`invalid_input`), a text that reads as no token at all (`invalid_input`), a text longer than the
request's limit (`max_length_exceeded`; the limit: the model's, the deployment's `input.max_tokens`
below it, `options.max_tokens` below that) unless the overflow (`options.overflow`, else the
deployment's `input.overflow`) is `truncate`, which cuts it there; embeddings have no windows,
so `window` refuses as `reject` does. An input whose rows had not started by
`options.deadline_ms` answers `deadline_exceeded`. Each answered input carries its `input`
usage (tokens, processed_tokens, truncated; a media item: the tokens its rows count).

`layer` must be one the card declares (`embedding.layers`: every model of ours declares its last
layer only; 400 otherwise). `dimensions` keeps the first N dimensions: the card's
`embedding.dimensions` lists the native one, and any smaller N is a Matryoshka cut (our
extension, renormalised for a normalized model). `meta.representation` (with `return_meta`)
names the vector space: the weights' hash, the layer, the dimension, `normalized` and the
inputs' modality when they share one.

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
import weakref
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from vllm_srun.adapters.call import Call
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
from vllm_srun.adapters.schemas.common import MAX_INPUTS, Representation
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
from vllm_srun.adapters.schemas.encoder import InputUsage
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel, TokenBudget
from vllm_srun.adapters.surfaces.common import TOKENIZE_CHUNK, ItemFailure, Prepared, answer, any_expired, expired
from vllm_srun.adapters.surfaces.embedding_outputs import (
    OutputPlan,
    dense_answers,
    multi_vector_answer,
    output_plan,
    sparse_answer,
)
from vllm_srun.adapters.surfaces.overflow import TokenLimit, input_budget, token_limit, too_long
from vllm_srun.domain.errors import InvalidRequest, MediaFailed, RequestTooLarge, UnsupportedSurface, quoted
from vllm_srun.domain.scheduling.rows import RowSpec


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


def _split(
    items: list[InputItem], model: TextEmbedder
) -> tuple[list[tuple[int, str]], list[_Media], dict[int, ItemFailure]]:
    """(index, text) of the text items, the media items (their bytes, from their data: URLs) and
    the items that failed already (by index); 422 for an item of a kind the model does not read."""
    media_model = model if is_media_embedder(model) else None
    modalities: frozenset[str] = getattr(model, "modalities", frozenset({"text"}))
    reads = sorted(modalities)
    texts: list[tuple[int, str]] = []
    media: list[_Media] = []
    failed: dict[int, ItemFailure] = {}
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
                failed[i] = ItemFailure("invalid_input", f"input[{i}]: {exc}")
                continue
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
            failed[i] = ItemFailure("invalid_input", f"input[{i}]: {exc}")
    return texts, media, failed


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


def embedder(served: ServedModel, call: Call) -> TextEmbedder:
    model = served.require_surface("embeddings", call)
    assert is_text_embedder(model)  # checked when the model loaded
    return model


# the card sections of loaded models, read once each: what `layer` and `meta.representation` name
_SECTIONS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def card_section(model: Any) -> dict[str, Any]:
    """MODEL's card section (`LoadedModel.card_section`), read once per loaded model."""
    try:
        found = _SECTIONS.get(model)
        if found is None:
            found = _SECTIONS[model] = dict(model.card_section())
    except TypeError:  # a model that cannot be weakly referenced or hashed: read each time
        found = dict(model.card_section())
    return found


def declared_layers(model: Any) -> list[int]:
    """The layer exits MODEL's card declares (`embedding.layers`)."""
    return [int(layer) for layer in card_section(model).get("embedding", {}).get("layers") or []]


def check_layer(model: Any, layer: int | None) -> int | None:
    """The layer an embeddings request reads (its `layer`, else the last declared one); 400 for
    one the model does not declare."""
    layers = declared_layers(model)
    if layer is not None and layer not in layers:
        have = ", ".join(map(str, layers)) or "none"
        raise InvalidRequest(f"layer {layer} is not a layer exit of this model (its layers: {have})")
    return layer if layer is not None else (layers[-1] if layers else None)


async def _decode(
    served: ServedModel, model: TextEmbedder, media: list[_Media], frames: int
) -> dict[int, Any | ItemFailure]:
    """Pixels of every media item by input index ([3, H, W] per image, [frames, 3, H, W] per
    video; audio: its features), decoded concurrently; an item that does not decode fails in its
    slot, a media worker that died fails the request (503: retry it)."""
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
    out: dict[int, Any | ItemFailure] = {}
    for m, result in zip(media, results):
        if isinstance(result, MediaError):
            out[m.index] = ItemFailure("invalid_input", f"input[{m.index}]: {result}")
        elif isinstance(result, MediaWorkerDied):
            raise MediaFailed(f"input[{m.index}]: {result}; retry the request")
        elif isinstance(result, BaseException):
            raise result
        else:
            out[m.index] = result
    return out


@dataclass(frozen=True, slots=True)
class _Input:
    """One input as prepared: its rows' place among the request's rows, its usage, or its failure."""

    start: int = 0
    count: int = 0
    usage: InputUsage | None = None
    failure: ItemFailure | None = None


async def prepare_embeddings(served: ServedModel, req: EmbeddingsRequest, call: Call) -> Prepared[EmbeddingsResponse]:
    """REQ validated into its rows: text rows tokenized (off the event loop for a large request,
    R-API-9), media decoded (off the request path when media workers run, R-MEDIA; the decode
    cache answers repeats, R-PERF-4), every request-level failure raised and every item's failure
    kept in its slot before any row reaches a scheduler."""
    model = embedder(served, call)
    items = _items(req)
    options = req.options or EmbeddingsOptions()
    if req.dimensions is not None and req.dimensions > model.dimensions and req.embedding_type == "dense":
        raise InvalidRequest(f"dimensions {req.dimensions} is larger than the model's {model.dimensions}")
    layer = check_layer(model, req.layer)
    plan = output_plan(model, req, options, items)
    prompt = resolve_prompt(model, req.input_type, req.prompt_name)
    media_model = model if is_media_embedder(model) else None
    frames = (options.frames or media_model.video_frames) if media_model is not None else 0
    limit = token_limit(served, call, model.max_input_tokens, options)
    text_rows, media, failed = await served.prepare(
        call,
        _inputs,
        model,
        items,
        frames,
        (options.overflow or input_budget(served, call).overflow)
        == "truncate",  # window: embeddings have none, it rejects
        served.token_budget(),
        prompt,
        limit,
    )
    if plan.kind != "dense":  # a sparse or multi-vector row: answered by the model's token-level head
        keep = plan.keep_special
        text_rows = {
            i: (RowSpec(r.tokens, TokenOutputRow(r.payload, plan.kind, keep), r.lane), usage)
            for i, (r, usage) in text_rows.items()
        }
    decoded = await _decode(served, model, media, frames) if media else {}
    inputs: list[_Input] = []
    rows: list[RowSpec] = []
    for i, item in enumerate(items):
        start = len(rows)
        got = decoded.get(i)
        failure = failed.get(i) or (got if isinstance(got, ItemFailure) else None)
        if failure is not None:
            inputs.append(_Input(failure=failure))
            continue
        if i in text_rows:
            row, usage = text_rows[i]
            rows.append(row)
        elif isinstance(item, AudioInput):
            assert is_audio_embedder(model)
            rows.append(RowSpec(model.audio_tokens, got, model.audio_lane))
            usage = None
        else:
            assert media_model is not None
            pixels: Any = got  # [3, H, W] for an image, [frames, 3, H, W] for a video
            stack = [pixels] if pixels.ndim == 3 else list(pixels)
            rows.extend(RowSpec(media_model.image_tokens, p, media_model.media_lane) for p in stack)
            usage = None
        if usage is None:  # a media item: the tokens its rows count
            counted = sum(r.tokens for r in rows[start:])
            usage = InputUsage(tokens=counted, processed_tokens=counted, truncated=False)
        inputs.append(_Input(start, len(rows) - start, usage))
    representation = _representation(served, model, req, plan, items, layer)
    return Prepared(
        served,
        call,
        "embeddings",
        req,
        options,
        rows,
        lambda stats: _response(served, model, req, plan, rows, inputs, stats),
        lambda response: _with_representation(response, representation),
        expires_rows=True,
    )


async def embeddings(served: ServedModel, req: EmbeddingsRequest, call: Call) -> EmbeddingsResponse:
    return await answer(await prepare_embeddings(served, req, call))


def _modality(item: InputItem) -> str:
    if isinstance(item, (str, TextInput)):
        return "text"
    if isinstance(item, AudioInput):
        return "audio"
    return "image" if isinstance(item, ImageUrlInput) else "video"


def _representation(
    served: ServedModel,
    model: TextEmbedder,
    req: EmbeddingsRequest,
    plan: OutputPlan,
    items: list[InputItem],
    layer: int | None,
) -> Representation | None:
    """The vector space a dense answer's vectors live in (`meta.representation`); None for a
    sparse or multi-vector answer, or a model without a hash or a declared layer."""
    if plan.kind != "dense" or not served.sha256 or layer is None:
        return None
    modalities = {_modality(item) for item in items}
    return Representation(
        model_sha256=served.sha256,
        layer=layer,
        dimension=min(req.dimensions or model.dimensions, model.dimensions),
        normalized=bool(model.normalized),
        modality=modalities.pop() if len(modalities) == 1 else None,
    )


def _with_representation(response: EmbeddingsResponse, representation: Representation | None) -> EmbeddingsResponse:
    if response.meta is None or representation is None:
        return response
    return msgspec.structs.replace(response, meta=msgspec.structs.replace(response.meta, representation=representation))


def _inputs(
    model: TextEmbedder,
    items: list[InputItem],
    frames: int,
    truncate: bool,
    budget: TokenBudget,
    prompt: str,
    limit: TokenLimit,
) -> tuple[dict[int, tuple[RowSpec, InputUsage]], list[_Media], dict[int, ItemFailure]]:
    """The CPU work of preparing the inputs: each text item's row and usage by input index
    (PROMPT before its text, tokenized a chunk at a time, at most LIMIT tokens), the media items'
    bytes (from their data: URLs), and the items that failed, within the request's token BUDGET
    (a media item counts the rows it will become before anything decodes it)."""
    text_items, media, failed = _split(items, model)
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
    rows: dict[int, tuple[RowSpec, InputUsage]] = {}
    for (i, _), enc in zip(text_items, _encode(model, text_items, truncate, budget, limit)):
        if isinstance(enc, ItemFailure):
            failed[i] = enc
            continue
        read = len(enc.ids) if enc.truncated else enc.n_tokens
        rows[i] = (
            RowSpec(len(enc.ids), enc),
            InputUsage(tokens=enc.n_tokens, processed_tokens=read, truncated=enc.truncated),
        )
    return rows, media, failed


def _encode(
    model: TextEmbedder,
    texts: list[tuple[int, str]],
    truncate: bool,
    budget: TokenBudget,
    limit: TokenLimit,
) -> list[Encoded | ItemFailure]:
    """The (input index, text) items' rows, tokenized a chunk at a time, each at most LIMIT
    tokens: an over-long input (unless TRUNCATE) or one that reads as no token fails in its slot;
    a request over its token budget stops the work there."""
    hint = 'set options.overflow to "truncate" to cut it'
    out: list[Encoded | ItemFailure] = []
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = texts[start : start + TOKENIZE_CHUNK]
        try:
            part = model.tokenize([text for _, text in chunk], truncate=truncate, max_length=limit.tokens)
        except ValueError as exc:  # e.g. a limit that leaves no room after the special tokens
            raise InvalidRequest(str(exc)) from None
        # the rows' tokens (a truncated input counts what it keeps; a refused one was read whole)
        budget.spend(sum(len(enc.ids) for enc in part))
        for (i, _), enc in zip(chunk, part):
            # n_tokens: the input's own length (a row may be padded past it, e.g. SigLIP's)
            if enc.n_tokens > limit.tokens and not enc.truncated:
                out.append(too_long(i, enc.n_tokens, limit, hint))
            elif not enc.ids:
                out.append(ItemFailure("invalid_input", f"input[{i}] reads as no token for this model"))
            else:
                out.append(enc)
    return out


def _response(
    served: ServedModel,
    model: TextEmbedder,
    req: EmbeddingsRequest,
    plan: OutputPlan,
    rows: list[RowSpec],
    inputs: list[_Input],
    stats: ForwardStats,
) -> EmbeddingsResponse:
    outputs = stats.outputs
    answered: list[int] = []  # the inputs with a vector
    data: list[Embedding] = []
    tokens = 0
    for i, inp in enumerate(inputs):
        failure = inp.failure
        if failure is None and any_expired(outputs[inp.start : inp.start + inp.count]):
            failure = expired(i)
        if failure is not None:
            data.append(Embedding(object="embedding", index=i, error=failure.code, message=failure.message))
            continue
        tokens += sum(r.tokens for r in rows[inp.start : inp.start + inp.count])
        answered.append(i)
        data.append(Embedding(object="embedding", index=i, input=inp.usage))
    usage = EmbeddingsUsage(tokens, tokens)
    if not answered:
        return EmbeddingsResponse(object="list", data=data, model=served.name, usage=usage)
    if plan.kind != "dense":  # one row per input (texts only)
        render = sparse_answer if plan.kind == "sparse" else multi_vector_answer
        for i in answered:
            data[i] = msgspec.structs.replace(data[i], embedding=render(outputs[inputs[i].start], plan))
        return EmbeddingsResponse(object="list", data=data, model=served.name, usage=usage)
    pooled = []
    for i in answered:
        start, count = inputs[i].start, inputs[i].count
        if count == 1:
            pooled.append(np.asarray(outputs[start], dtype=np.float32))
            continue
        frames = np.stack([np.asarray(o, dtype=np.float32) for o in outputs[start : start + count]])
        mean = np.mean(frames, axis=0)  # a video: its frames' mean
        pooled.append(mean / max(float(np.linalg.norm(mean)), 1e-12) if model.normalized else mean)
    vectors = np.stack(pooled).astype(np.float32, copy=False)
    if req.dimensions is not None and req.dimensions < vectors.shape[1]:
        vectors = vectors[:, : req.dimensions]
        if model.normalized:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    for i, vector in zip(answered, dense_answers(vectors, plan)):
        data[i] = msgspec.structs.replace(data[i], embedding=vector)
    return EmbeddingsResponse(
        object="list", data=data, model=served.name, usage=usage, quantization=plan.quantization()
    )
