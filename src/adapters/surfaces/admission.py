"""R-ADM-1's upper bound of a request's tokens, known before any tokenization: its body's bytes
(a token reads at least one byte of text), except that an image, video or audio item counts as
the rows it becomes (an image's tokens, a video's frames times them, an audio file's window),
never as its encoded bytes; a decision state's image or video (or TypeSafe asset) counts as the
most tokens one may take (`MediaQuestionAnswerer.max_media_tokens`)."""

from __future__ import annotations

import msgspec

from vllm_srun.adapters.contracts import is_audio_embedder, is_media_embedder, is_media_question_answerer
from vllm_srun.adapters.schemas.decisions import DecisionsBody
from vllm_srun.adapters.schemas.embeddings import AudioInput, EmbeddingsRequest, ImageUrlInput, VideoUrlInput
from vllm_srun.adapters.serving.served import ServedModel


def _url_bytes(item: ImageUrlInput | VideoUrlInput) -> int:
    ref = item.image_url if isinstance(item, ImageUrlInput) else item.video_url
    return len(ref if isinstance(ref, str) else ref.url)


def admission_tokens(served: ServedModel, req: msgspec.Struct, body_bytes: int) -> int:
    """The tokens REQ counts against `--max-queued-tokens`."""
    if isinstance(req, DecisionsBody):
        return _decision_tokens(served, req, body_bytes)
    if not isinstance(req, EmbeddingsRequest) or isinstance(req.input, str):
        return body_bytes
    media = [item for item in req.input if isinstance(item, (ImageUrlInput, VideoUrlInput))]
    audio = [item for item in req.input if isinstance(item, AudioInput)]
    if not media and not audio:
        return body_bytes
    model = served.model
    if audio:  # an audio item counts its row (the model's window), never its encoded bytes
        per_audio = model.audio_tokens if is_audio_embedder(model) else 1
        body_bytes = max(1, body_bytes - sum(len(item.input_audio.data) for item in audio) + len(audio) * per_audio)
        if not media:
            return body_bytes
    per_image = model.image_tokens if is_media_embedder(model) else 1
    frames = (req.options.frames if req.options is not None else None) or (
        model.video_frames if is_media_embedder(model) else 1
    )
    rows = sum(frames if isinstance(item, VideoUrlInput) else 1 for item in media)
    return max(1, body_bytes - sum(_url_bytes(item) for item in media) + rows * per_image)


def _decision_tokens(served: ServedModel, req: DecisionsBody, body_bytes: int) -> int:
    """A decisions request: its bytes, its media's encoded bytes counted as the most tokens they take."""
    model = served.model
    if not is_media_question_answerer(model):
        return body_bytes
    entries = [(req.images, req.videos), *((s.images, s.videos) for s in (req.states or {}).values())]
    images = [url for urls, _ in entries for url in urls or ()]
    videos = [url for _, urls in entries for url in urls or ()]
    assets = [a.data_base64 or "" for a in (req.assets or {}).values()]
    if not (images or videos or assets):
        return body_bytes
    sent = sum(map(len, images)) + sum(map(len, videos)) + sum(map(len, assets))
    counted = (len(images) + len(assets)) * model.max_media_tokens("image") + len(videos) * model.max_media_tokens(
        "video"
    )
    return max(1, body_bytes - sent + counted)
