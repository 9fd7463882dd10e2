"""The `MediaDecoder` of this package: pillow for images, PyAV for videos and audio (R-MEDIA).

Every check that can refuse an input runs before its pixels are decoded: the byte size, the
format (images: PNG, JPEG, WebP, GIF, BMP, TIFF; videos: `video.py`), and the pixel count read
from the header (a decompression bomb is refused without inflating it). Then the image is
decoded, turned upright by its EXIF orientation, and preprocessed (`preprocess.py`). Whatever
goes wrong with the bytes is a `MediaError` with one line; nothing a hostile input does escapes
as another exception. Audio (`audio.py`) is decoded to mono samples at the model's rate and
turned into its log-mel features (`audio_features.py`).

A vision-language model's `VisionPreprocess` makes the pixels itself (`image_pixels`), and its
videos are sampled into as many frames as it asks for their duration (`clip`: pixels and times).
`MediaLimits.formats` narrows the formats a model reads (a decision model: PNG, JPEG, WebP;
MP4/MOV and Matroska/WebM).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps

from vllm_srun.adapters.contracts.media import MediaError, MediaLimits, PixelSpec, SampledVideo, VisionPreprocess
from vllm_srun.adapters.media.preprocess import ImagePreprocess, pixels

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def signature(data: bytes) -> str | None:
    """The supported format DATA's first bytes claim, if any."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in SIGNATURES if data.startswith(magic)), None)


def open_image(data: bytes, limits: MediaLimits) -> Image.Image:
    """The decoded, upright image; MediaError for anything bad or oversize."""
    limits.check_bytes(data, "image")
    formats = limits.formats or IMAGE_FORMATS
    claimed = signature(data)
    if claimed is not None and claimed not in formats:
        raise MediaError(f"a {claimed} image, and this model reads {', '.join(formats)} only")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=formats)
        except Image.DecompressionBombError:
            raise MediaError(
                "the image header declares more pixels than pillow ever decodes (a decompression bomb)"
            ) from None
        except Image.UnidentifiedImageError:
            if claimed is not None:
                raise MediaError(f"corrupt {claimed} image: its header cannot be read") from None
            raise MediaError(f"not an image in a supported format ({', '.join(formats)})") from None
        except Exception as exc:  # any parser error on hostile bytes is the input's fault
            raise MediaError(f"unreadable image header ({_reason(exc)})") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise MediaError(f"the image is {width}×{height} pixels")
    if width * height > limits.max_pixels:
        raise MediaError(
            f"the image is {width}×{height} = {width * height} pixels, over the limit of {limits.max_pixels} "
            "(refused before decoding)"
        )
    try:
        image.load()
        return ImageOps.exif_transpose(image)
    except Exception as exc:  # truncated data, bad chunks, broken EXIF
        raise MediaError(f"corrupt or truncated image ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]


class PillowAvDecoder:
    """Images with pillow, videos with PyAV (`video.py`), audio with PyAV (`audio.py`); each
    preprocessed as the package says."""

    def __init__(self) -> None:
        # our own pixel limit (checked from the header, before decoding) replaces pillow's,
        # which would refuse only past twice its 89 M pixels, in other words
        Image.MAX_IMAGE_PIXELS = None
        self._tables: dict[ImagePreprocess, np.ndarray] = {}

    def tables(self, spec: ImagePreprocess) -> np.ndarray:
        found = self._tables.get(spec)
        if found is None:
            found = self._tables[spec] = spec.tables()
        return found

    def image(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> np.ndarray:
        if isinstance(preprocess, VisionPreprocess):
            image = open_image(data, limits)
            try:
                return preprocess.image_pixels(image)
            except MemoryError:
                raise MediaError("the image is too large to preprocess") from None
            except ValueError as exc:  # the processor refuses its size (an aspect ratio past its limit)
                raise MediaError(f"the image cannot be preprocessed: {_reason(exc)}") from None
        spec = _spec(preprocess)
        image = open_image(data, limits)
        try:
            return pixels(image, spec, self.tables(spec))
        except MemoryError:
            raise MediaError("the image is too large to preprocess") from None

    def clip(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> SampledVideo:
        """A video sampled as a vision-language model's PREPROCESS reads it (`ClipJob`)."""
        from vllm_srun.adapters.media.video import sample_clip  # PyAV loads only where a video comes

        if not isinstance(preprocess, VisionPreprocess):
            raise TypeError(f"a clip is sampled for a VisionPreprocess, not a {type(preprocess).__name__}")
        try:
            frames, times = sample_clip(data, preprocess.frames_for, limits, preprocess.frame_pixels)
        except MemoryError:
            raise MediaError("the video is too large to preprocess") from None
        except ValueError as exc:  # MediaError is one; the processor refuses its frames' size
            if isinstance(exc, MediaError):
                raise
            raise MediaError(f"the video cannot be preprocessed: {_reason(exc)}") from None
        pad = -len(frames) % max(1, preprocess.frame_multiple)  # the last frame repeated, as the processor does
        if pad:
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
            times = times + (times[-1],) * pad
        return SampledVideo(frames, times)

    def video_frames(self, data: bytes, frames: int, limits: MediaLimits, preprocess: PixelSpec) -> np.ndarray:
        from vllm_srun.adapters.media.video import sample_video  # PyAV loads only where a video comes

        spec = _spec(preprocess)
        tables = self.tables(spec)
        return sample_video(data, frames, limits, lambda image: pixels(image, spec, tables))

    def audio(self, data: bytes, fmt: str, limits: MediaLimits, preprocess: PixelSpec) -> np.ndarray:
        from vllm_srun.adapters.media.audio import decode_audio  # PyAV loads only where audio comes
        from vllm_srun.adapters.media.audio_features import AudioPreprocess, features

        if not isinstance(preprocess, AudioPreprocess):
            raise TypeError(f"audio is preprocessed with an AudioPreprocess, not a {type(preprocess).__name__}")
        samples = decode_audio(data, fmt, limits, preprocess.sampling_rate)
        try:
            return features(samples, preprocess)
        except MemoryError:
            raise MediaError("the audio is too long to preprocess") from None


def _spec(preprocess: PixelSpec) -> ImagePreprocess:
    """The preprocessing this decoder applies: a package's `ImagePreprocess`, nothing else."""
    if not isinstance(preprocess, ImagePreprocess):
        raise TypeError(f"this decoder preprocesses with an ImagePreprocess, not a {type(preprocess).__name__}")
    return preprocess
