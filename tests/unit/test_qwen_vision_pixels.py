"""Qwen3.5 pixels (media/qwen_vision.py) against transformers.

Images: transformers' `Qwen2VLImageProcessorPil` (the image processor that loads without
torchvision) is the reference; our [3, H, W] pixels, patchified by the model's `patchify`, must
equal its `pixel_values` bit for bit, resizing up or down, in every image mode.

Videos: transformers' `Qwen3VLVideoProcessor` needs torchvision, which cannot be installed here,
so this file reproduces its documented steps with torch (its video `smart_resize` imported from
transformers; torchvision's CPU resize of uint8 frames, bicubic with antialiasing, which is
torch's native uint8 `interpolate`; rescale and normalize fused in float32; the last frame
repeated to fill the temporal patch; its patch layout). Our pixels must equal them bit for bit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_reference_size

from vllm_srun.adapters.media.qwen_vision import (
    VisionPreprocess,
    image_placeholder,
    video_group_times,
    video_placeholder,
)
from vllm_srun.adapters.media.resample import resize_bicubic_aa
from vllm_srun.adapters.media.samples import picture
from vllm_srun.adapters.models.qwen3_5_vision import VisionConfig, patchify

IMAGE_CFG = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "size": {"shortest_edge": 1024, "longest_edge": 16384},
    "patch_size": 8,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
VIDEO_CFG = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    "size": {"shortest_edge": 2048, "longest_edge": 65536},
    "patch_size": 8,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
}


def tower(patch: int = 8) -> VisionConfig:
    return VisionConfig.from_dict(
        {"patch_size": patch, "temporal_patch_size": 2, "spatial_merge_size": 2, "hidden_size": 16, "num_heads": 2}
        | {"num_position_embeddings": 16, "out_hidden_size": 16}
    )


@pytest.fixture
def spec(tmp_path) -> VisionPreprocess:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(IMAGE_CFG))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_CFG))
    return VisionPreprocess.from_folder(tmp_path)


@pytest.mark.parametrize(
    ("width", "height", "mode"),
    [
        (48, 32, "RGB"),
        (100, 37, "RGB"),
        (20, 20, "RGB"),
        (400, 300, "RGB"),
        (64, 48, "RGBA"),
        (50, 70, "L"),
        (33, 90, "P"),
    ],
)
def test_image_pixels_are_the_transformers_processors(spec, width, height, mode):
    image = Image.fromarray(picture(width * 7 + height, width, height), "RGB").convert(mode)
    if mode == "RGBA":
        image.putalpha(Image.fromarray(picture(3, width, height)[:, :, 0], "L"))
    reference = Qwen2VLImageProcessorPil(**{k: v for k, v in IMAGE_CFG.items() if k != "image_processor_type"})
    expected = reference(images=[image], return_tensors="pt")
    ours = spec.image_pixels(image)
    grid = spec.grid("image", ours.shape)
    assert [list(grid)] == expected["image_grid_thw"].tolist()
    rows = patchify(torch.from_numpy(ours), tower())
    assert torch.equal(rows, expected["pixel_values"])
    assert spec.tokens("image", ours.shape) == (1, grid[1] * grid[2] // 4)


def _reference_video(frames: list[np.ndarray], cfg: dict) -> tuple[torch.Tensor, list[int]]:
    """transformers' Qwen3VLVideoProcessor on uint8 [H, W, 3] frames, its steps reproduced (module doc)."""
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()  # T, C, H, W
    count, _, height, width = video.shape
    p, m, tp = cfg["patch_size"], cfg["merge_size"], cfg["temporal_patch_size"]
    size = cfg["size"]
    h, w = video_reference_size(count, height, width, tp, p * m, size["shortest_edge"], size["longest_edge"])
    if (h, w) != (height, width):
        video = F.interpolate(video, size=[h, w], mode="bicubic", antialias=True, align_corners=False)
    mean = torch.tensor(cfg["image_mean"]) * (1.0 / (1 / 255))
    std = torch.tensor(cfg["image_std"]) * (1.0 / (1 / 255))
    x = (video.to(torch.float32) - mean[:, None, None]) / std[:, None, None]
    x = x[None]
    if pad := -count % tp:
        x = torch.cat((x, x[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
    t = x.shape[1] // tp
    gh, gw = h // p, w // p
    rows = x.view(1, t, tp, 3, gh // m, m, p, gw // m, m, p).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return rows.reshape(t * gh * gw, 3 * tp * p * p), [t, gh, gw]


@pytest.mark.parametrize(("count", "width", "height"), [(4, 32, 48), (5, 64, 32), (6, 160, 120), (8, 96, 256)])
def test_video_pixels_follow_the_video_processors_steps(spec, count, width, height):
    frames = [picture(100 * count + i, width, height) for i in range(count)]
    expected, grid = _reference_video(frames, VIDEO_CFG)
    ours = spec.video_pixels([Image.fromarray(f) for f in frames])
    assert ours.shape[0] == count + count % 2
    assert list(spec.grid("video", ours.shape)) == grid
    rows = patchify(torch.from_numpy(ours), tower())
    assert rows.shape == expected.shape
    assert torch.equal(rows, expected)


@pytest.mark.parametrize(("height", "width", "to_h", "to_w"), [(37, 53, 32, 64), (720, 1280, 160, 288), (5, 7, 64, 32)])
def test_resize_is_torchvisions_cpu_uint8_bicubic(height, width, to_h, to_w):
    frame = picture(height + width, width, height)
    expected = F.interpolate(
        torch.from_numpy(frame).permute(2, 0, 1)[None].contiguous(), size=[to_h, to_w], mode="bicubic", antialias=True
    )[0].permute(1, 2, 0)
    assert np.array_equal(resize_bicubic_aa(frame, to_h, to_w), expected.numpy())


def test_frame_pixels_are_one_frame_of_the_video(spec):
    frames = [Image.fromarray(picture(i, 90, 60)) for i in range(5)]
    whole = spec.video_pixels(frames)
    for i, frame in enumerate(frames):
        assert np.array_equal(spec.frame_pixels(frame, len(frames)), whole[i])
    assert np.array_equal(whole[5], whole[4])  # odd: the last one repeated
    assert spec.frame_multiple == 2


def test_sampling_and_placeholders(spec):
    assert spec.frame_indices(240, 24.0) == np.linspace(0, 239, 20).round().astype(int).tolist()
    assert spec.frames_for(1.0) == 4 and spec.frames_for(10.0) == 20 and spec.frames_for(600.0) == 32
    assert spec.frames_for(10.0, total=7) == 7
    times = video_group_times([0.0, 0.5, 1.0, 1.5, 2.0], 2)
    assert times == [0.25, 1.25, 2.0]
    assert image_placeholder(2) == "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>"
    assert video_placeholder(1, [0.25, 1.25]) == (
        "<0.2 seconds><|vision_start|><|video_pad|><|vision_end|><1.2 seconds><|vision_start|><|video_pad|><|vision_end|>"
    )


def test_spec_reading(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16, "min_pixels": 4096}))
    spec = VisionPreprocess.from_folder(tmp_path)  # no video file: the image file, video defaults
    assert spec.image.patch == 16 and spec.image.min_pixels == 4096 and spec.image.max_pixels == 28 * 28 * 1280
    assert spec.video.patch == 16 and spec.video.mean == (0.5, 0.5, 0.5)
    assert spec.video_max_frames == 32 and spec.video_rate == 2.0
    assert hash(spec) == hash(VisionPreprocess.from_folder(tmp_path)) and spec.key()
    for bad in ({"do_resize": False}, {"image_std": [0.5, 0.0, 0.5]}, {"patch_size": 0}, {"resample": 9}):
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            VisionPreprocess.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").unlink()
    with pytest.raises(ValueError, match=r"preprocessor_config\.json"):
        VisionPreprocess.from_folder(tmp_path)
