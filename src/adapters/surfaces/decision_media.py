"""Images and videos of decision states (R-API-4, R-MEDIA, R-PERF-4): what a request sends, read
into bytes, checked and decoded once, before any question is tokenized.

A state's media are its `images` (data URLs of PNG, JPEG or WebP images), then its `videos` (data
URLs of MP4/QuickTime or Matroska/WebM videos), each list in request order; the request's own
state may also name TypeSafe `assets` (an image each, keyed by the placeholder text that stands
for it): a placeholder found in the state's strings makes its asset an image of the state, after
the `images`, in the order the placeholders first appear in the state's text, and the placeholder
is taken out of the text. A question that names an asset fails in its slot (`invalid_question`):
these models read media of the state only. Nothing is fetched: only `data:` URLs are read.

Only a model whose card lists the modality reads a medium (`MediaQuestionAnswerer`); any other
answers a non-empty `images` or `videos` with 400 and `assets` with 422, as before. Every bad
medium fails the whole request with 400 `invalid_request` naming it (`images[1]: …`,
`states.reply.videos[0]: …`, `assets.<name>: …`) before any forward, in this order:

1. the fewest tokens the state's media can take (`min_media_tokens` each) already exceed the
   model's input limit (nothing is decoded);
2. each data URL: scheme, base64, its media type, the byte limit (`data_url.py`);
3. decoding, in the media workers (`--media-workers`) through the decode cache: format, pixels
   from the header (a decompression bomb), truncation, a video's duration and frame size;
4. the request's videos together take more than `max_video_tokens` tokens.

A media worker that dies decoding fails the request with 500 (retry it), never another one.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.adapters.contracts import (
    MediaError,
    MediaQuestionAnswerer,
    MediaWorkerDied,
    QuestionAnswerer,
    QuestionError,
    SampledVideo,
    StateMedium,
    is_media_question_answerer,
)
from vllm_srun.adapters.media.data_url import data_url_bytes
from vllm_srun.adapters.schemas.decisions import Asset, DecisionsBody
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import InvalidRequest, MediaFailed, UnsupportedSurface, quoted

KINDS = ("image", "video")


@dataclass(frozen=True, slots=True)
class Sent:
    """One medium as sent: where it is in the request (for messages), its kind and its bytes."""

    where: str
    kind: str
    data: bytes


@dataclass
class StateMediaSent:
    """A state's media as sent, and what its assets changed: the state with the placeholders taken
    out, and the assets its questions name (those questions fail)."""

    state: Any
    sent: list[Sent] = field(default_factory=list)
    asked_assets: dict[str, str] = field(default_factory=dict)  # question name → the asset it names


def modalities_of(model: QuestionAnswerer) -> frozenset[str]:
    return model.modalities if is_media_question_answerer(model) else frozenset({"text"})


def check_modalities(model: QuestionAnswerer, lists: Sequence[tuple[str, Sequence[str] | None]]) -> None:
    """400 for a non-empty `images` / `videos` (LISTS: (kind, list)) the model does not read."""
    reads = modalities_of(model)
    for kind, urls in lists:
        if urls and kind not in reads:
            have = ", ".join(sorted(reads))
            raise InvalidRequest(
                f"{kind}s need a model with the {kind} modality (its card's modalities); this model reads {have}"
            )


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value (object keys and values, array items), depth first."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            for key, inner in reversed(list(item.items())):
                stack.append(inner)
                stack.append(key)
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _without(value: Any, names: Sequence[str]) -> Any:
    """VALUE with every occurrence of NAMES taken out of its strings (keys and values)."""
    if isinstance(value, str):
        for name in names:
            value = value.replace(name, "")
        return value
    if isinstance(value, Mapping):
        return {_without(k, names): _without(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_without(v, names) for v in value]
    return value


def _first_seen(state: Any, names: Sequence[str]) -> list[str]:
    """The NAMES found in STATE's strings, in the order they first appear."""
    order: dict[str, int] = {}
    position = 0
    for text in _strings(state):
        for name in names:
            if name not in order:
                at = text.find(name)
                if at >= 0:
                    order[name] = position + at
        position += len(text) + 1
    return sorted(order, key=order.__getitem__)


def _asset_bytes(name: str, asset: Asset, limit: int) -> bytes:
    where = f"assets.{quoted(name)}"
    if asset.part is not None:
        raise InvalidRequest(
            f"{where}: part {quoted(asset.part)} names a part of a multipart request, and this one has none"
        )
    if asset.data_base64 is None:
        raise InvalidRequest(f"{where}: an asset holds its image as data_base64 (or, in a multipart request, a part)")
    try:
        return data_url_bytes(f"data:;base64,{asset.data_base64}", "image", limit)
    except MediaError as exc:
        raise InvalidRequest(f"{where}: {exc}") from None


def read_sent(model: QuestionAnswerer, req: DecisionsBody) -> list[StateMediaSent]:
    """Every state's media as bytes (the request's own state first, then each `states` entry);
    400 for a list of a modality the model does not read, media that cannot fit the model's input
    or a bad data URL; 422 for assets on a model that reads no images."""
    states = req.states or {}
    check_modalities(model, [("image", req.images), ("video", req.videos)])
    for entry in states.values():
        check_modalities(model, [("image", entry.images), ("video", entry.videos)])
    if req.assets and "image" not in modalities_of(model):
        raise UnsupportedSurface("media assets need an image model; this model reads text only")
    parts = [("", req.state, req.images, req.videos, req.assets)]
    parts += [(f"states.{quoted(name)}.", e.state, e.images, e.videos, None) for name, e in states.items()]
    out = []
    for prefix, state, images, videos, assets in parts:
        got = StateMediaSent(state)
        out.append(got)
        if not (images or videos or assets):
            continue
        assert is_media_question_answerer(model)
        seen = _placeholders(req, got) if assets else []
        _check_room(model, prefix, len(images or ()) + len(seen), len(videos or ()))
        for kind, urls in (("image", images or ()), ("video", videos or ())):
            limit = (model.image_limits if kind == "image" else model.video_limits).max_bytes
            for i, url in enumerate(urls):
                where = f"{prefix}{kind}s[{i}]"
                try:
                    got.sent.append(Sent(where, kind, data_url_bytes(url, kind, limit)))
                except MediaError as exc:
                    raise InvalidRequest(f"{where}: {exc}") from None
        videos_sent = [s for s in got.sent if s.kind == "video"]
        got.sent = [s for s in got.sent if s.kind == "image"]
        for name in seen:  # the assets' images after the request's images, before its videos
            assert req.assets is not None
            data = _asset_bytes(name, req.assets[name], model.image_limits.max_bytes)
            got.sent.append(Sent(f"assets.{quoted(name)}", "image", data))
        got.sent += videos_sent
    return out


def _check_room(model: MediaQuestionAnswerer, prefix: str, images: int, videos: int) -> None:
    """400 when the fewest tokens IMAGES and VIDEOS can take exceed the model's input limit (before
    anything is decoded)."""
    least = images * model.min_media_tokens("image") + videos * model.min_media_tokens("video")
    limit = int(getattr(model, "max_input_tokens", 0) or 0)
    if limit and least > limit:
        raise InvalidRequest(
            f"{prefix}images and videos: {images} images and {videos} videos take at least {least} input tokens, "
            f"over the model's limit of {limit}"
        )


def _placeholders(req: DecisionsBody, own: StateMediaSent) -> list[str]:
    """The request's assets whose placeholders its state holds, in the order they first appear;
    OWN's state loses them, and OWN notes the questions that name one (module doc)."""
    assets = req.assets or {}
    names = [name for name in assets if name]
    if len(names) != len(assets):
        raise InvalidRequest("assets: a placeholder must be a non-empty string")
    for name, asset in assets.items():
        if asset.type not in (None, "image"):
            raise InvalidRequest(f"assets.{quoted(name)}: type {quoted(str(asset.type))} is not an image")
    seen = _first_seen(req.state, names)
    for question, sent in req.questions.items():
        named = [name for name in names if any(name in text for text in _strings(sent))]
        if named:
            own.asked_assets[question] = named[0]
    unused = [name for name in names if name not in seen and name not in own.asked_assets.values()]
    if unused:
        raise InvalidRequest(f"assets.{quoted(unused[0])}: its placeholder appears nowhere in the state")
    own.state = _without(req.state, seen)
    return seen


def asset_errors(sent: StateMediaSent) -> dict[str, QuestionError]:
    """The questions that name an asset, failed in their slots."""
    return {
        name: QuestionError(
            "invalid_question",
            f"the question names the asset {quoted(asset)}: this model reads images of the state only "
            "(put the placeholder in the state)",
        )
        for name, asset in sent.asked_assets.items()
    }


async def decode_all(
    served: ServedModel, model: QuestionAnswerer, states: Sequence[StateMediaSent]
) -> list[tuple[StateMedium, ...]]:
    """Every state's media decoded (concurrently; once per content, R-PERF-4), in order; 400 naming
    the first medium that does not decode, or when the videos take too many tokens; 500 when a
    media worker died (retry)."""
    everything = [s for state in states for s in state.sent]
    if not everything:
        return [() for _ in states]
    assert is_media_question_answerer(model)
    loader = served.media
    assert loader is not None, "a model that reads media is served without a media loader"

    def one(s: Sent) -> Any:
        if s.kind == "image":
            return loader.image(s.data, model.image_limits, model.preprocess)
        return loader.clip(s.data, model.video_limits, model.preprocess)

    results = await asyncio.gather(*(one(s) for s in everything), return_exceptions=True)
    for s, result in zip(everything, results):
        if isinstance(result, MediaError):
            raise InvalidRequest(f"{s.where}: {result}")
        if isinstance(result, MediaWorkerDied):
            raise MediaFailed(f"{s.where}: {result}; retry the request")
        if isinstance(result, BaseException):
            raise result
    media = {id(s): _medium(s, result) for s, result in zip(everything, results)}
    video_tokens = sum(
        model.media_tokens("video", tuple(media[id(s)].pixels.shape)) for s in everything if s.kind == "video"
    )
    if video_tokens > model.max_video_tokens:
        raise InvalidRequest(
            f"videos: the request's videos take {video_tokens} input tokens, over the {model.max_video_tokens} "
            "tokens a request may spend on videos (send fewer or shorter videos)"
        )
    return [tuple(media[id(s)] for s in state.sent) for state in states]


def _medium(sent: Sent, decoded: Any) -> StateMedium:
    digest = hashlib.sha256(sent.data).digest()
    if isinstance(decoded, SampledVideo):
        return StateMedium("video", decoded.pixels, digest, tuple(decoded.times))
    return StateMedium(sent.kind, decoded, digest)
