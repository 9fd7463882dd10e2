"""Qwen3.5's multimodal rotary positions: where image and video tokens sit in the text.

Every token has three positions (time, row, column). A text token's three are equal and count on
from the token before. A run of image tokens (one image) or of video tokens (one temporal group of
a video: the processor writes each group between its own vision start and end tokens, after its
`<t seconds>` stamp) laid out on its merged grid of h × w tokens, starting at position P (the
position after the text before it) takes time P, row P + i, column P + j; the text after it
continues at P + max(h, w). A row's media are taken in order, images by the image runs and video
groups by the video runs; run lengths must match their media (ValueError otherwise).

The rotary angles of the text model interleave the three: of the rotary frequencies, index f
turns with the row position when f ≡ 1 (mod 3) and f < 3·sections[1], with the column when
f ≡ 2 (mod 3) and f < 3·sections[2], and with the time otherwise (`mrope_section` in the text
config's `rope_parameters`, default [11, 11, 10]). With three equal positions this is the plain
rotary of text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch

DEFAULT_SECTIONS = (11, 11, 10)


@dataclass(frozen=True)
class MediaTokens:
    """The placeholder ids and the merge size: what laying media out in a row needs."""

    image_id: int
    video_id: int
    merge: int


def row_positions(
    ids: Sequence[int],
    images: Sequence[tuple[int, int, int]],
    videos: Sequence[tuple[int, int, int]],
    tokens: MediaTokens,
    start: int = 0,
) -> tuple[torch.Tensor, int]:
    """Positions [3, L] of one row's IDS whose image runs take the patch grids IMAGES (t, h, w; t = 1)
    and video runs the temporal groups of VIDEOS, in order, counting from START; and the position
    the next token would take."""
    m = tokens.merge
    image_grids = list(images)
    video_groups = [(h, w) for t, h, w in videos for _ in range(t)]
    kinds = [1 if t == tokens.image_id else 2 if t == tokens.video_id else 0 for t in ids]
    parts: list[torch.Tensor] = []
    current, taken_images, taken_groups = start, 0, 0
    for kind, run in groupby(kinds):
        length = len(list(run))
        if kind == 0:
            parts.append((torch.arange(length) + current).expand(3, -1))
            current += length
            continue
        if kind == 1:
            if taken_images >= len(image_grids):
                raise ValueError(f"the prompt has more image placeholders than its {len(image_grids)} images")
            _, h, w = image_grids[taken_images]
            taken_images += 1
            what = "an image"
        else:
            if taken_groups >= len(video_groups):
                raise ValueError("the prompt has more video placeholders than its videos have frame groups")
            h, w = video_groups[taken_groups]
            taken_groups += 1
            what = "a video frame group"
        gh, gw = h // m, w // m
        if length != gh * gw:
            raise ValueError(f"{what} of {gh * gw} tokens has {length} placeholder tokens in the prompt")
        rows = torch.arange(gh).repeat_interleave(gw) + current
        cols = torch.arange(gw).repeat(gh) + current
        parts.append(torch.stack((torch.full((length,), current), rows, cols)))
        current += max(gh, gw)
    if taken_images != len(image_grids) or taken_groups != len(video_groups):
        raise ValueError(
            f"the prompt places {taken_images} of {len(image_grids)} images and "
            f"{taken_groups} of {len(video_groups)} video frame groups"
        )
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
    return positions, current


def mrope_angles(
    positions: torch.Tensor, rotary_dim: int, theta: float, sections: Sequence[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [N, 1, rotary_dim] of POSITIONS [3, N] (module doc), computed in FP32."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=positions.device) / rotary_dim))
    freqs = positions.float()[..., None] * inv  # [3, N, rotary_dim / 2]
    mixed = freqs[0].clone()
    for stream in (1, 2):
        picked = slice(stream, 3 * int(sections[stream]), 3)
        mixed[..., picked] = freqs[stream][..., picked]
    angles = torch.cat((mixed, mixed), dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)
