"""Qwen3.5 with its vision tower (R-Q35-3): our model and pixels against transformers'
`Qwen3_5ForConditionalGeneration` on the `qwen3_5_vision` fixture package (FP32, CPU).

- The package loads in transformers as written (config, weights, tokenizer, image processor).
- Image rows, video rows, rows with both and text rows: logits at every position within 1e-4 of the
  reference, each row alone and all of them laid back to back in one forward. Our pixels are the
  reference's: images through transformers' PIL image processor (bit for bit), videos through the
  video processor's steps reproduced with torch (tests/unit/test_qwen_vision_pixels.py: bit for
  bit), the prompt's video timestamps from transformers' Qwen3-VL processor.
- Shared context: a state with its media run once, questions branched from it, equals each
  question run whole after the state (≤ 1e-4), in every attention mode; in the prefix modes the
  reference runs with the same attention masks handed to its language model, and no state token's
  hidden state moves when the question changes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

from vllm_srun.adapters.families.fixtures.decision_fixture import write_decision_fixture
from vllm_srun.adapters.media.qwen_vision import (
    VisionPreprocess,
    image_placeholder,
    video_group_times,
    video_placeholder,
)
from vllm_srun.adapters.media.samples import picture
from vllm_srun.adapters.models.qwen3_5_layers import visibility_mask
from vllm_srun.adapters.models.qwen3_5_mm import MediaRow, Qwen35VisionLM, VisionInput
from vllm_srun.adapters.models.qwen3_5_vision import patchify

TOL = 1e-4
SYSTEM = "<|im_start|>system\nYou answer questions about the content the user gives.<|im_end|>\n<|im_start|>user\n"
QUESTIONS = [
    "is the picture bright<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "which colour is the order: red or green<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "yes<|im_end|>\n<|im_start|>assistant\n",
]
FPS, TOTAL = 8.0, 20  # the test video: 20 frames at 8 per second


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3_5_vision")
    write_decision_fixture(folder, "qwen3_5_vision", 0)
    return folder


@pytest.fixture(scope="module")
def models(package: Path):
    reference = Qwen3_5ForConditionalGeneration.from_pretrained(package, dtype=torch.float32).eval()
    return reference, Qwen35VisionLM.from_pretrained(package)


@pytest.fixture(scope="module")
def media(package: Path):
    """An image and a video: our arrays, the reference's pixel rows and grids, their prompt texts."""
    spec = VisionPreprocess.from_folder(package)
    image = Image.fromarray(picture(21, 72, 50))
    processor = Qwen2VLImageProcessorPil.from_pretrained(package)
    expected = processor(images=[image], return_tensors="pt")
    ours_image = spec.image_pixels(image)
    indices = spec.frame_indices(TOTAL, FPS)
    frames = [Image.fromarray(picture(300 + i, 56, 40)) for i in indices]
    ours_video = spec.video_pixels(frames)
    groups, per_group = spec.tokens("video", ours_video.shape)
    reference_times = Qwen3VLProcessor._calculate_timestamps(None, list(indices), FPS, 2)  # type: ignore[arg-type]
    times = video_group_times([i / FPS for i in indices], 2)
    assert times == pytest.approx(reference_times)
    return {
        "image": VisionInput("image", ours_image, b"image"),
        "image_rows": expected["pixel_values"],
        "image_grid": expected["image_grid_thw"],
        "image_text": image_placeholder(spec.tokens("image", ours_image.shape)[1]),
        "video": VisionInput("video", ours_video, b"video"),
        "video_rows": patchify(torch.from_numpy(ours_video), _tower(package)),
        "video_grid": torch.tensor([list(spec.grid("video", ours_video.shape))]),
        "video_text": video_placeholder(per_group, times),
        "groups": groups,
    }


def _tower(package: Path):
    return Qwen35VisionLM.from_pretrained(package).mm.vision


def _ids(package: Path, text: str) -> list[int]:
    return AutoTokenizer.from_pretrained(package)(text, add_special_tokens=False)["input_ids"]


def _reference_logits(reference, row_ids, media, with_image, with_video, masks=None) -> torch.Tensor:
    """transformers' logits [L, V] of one row (with MASKS: the full-attention masks it is given)."""
    cfg = reference.config
    ids = torch.tensor([row_ids])
    kinds = torch.tensor([[1 if t == cfg.image_token_id else 2 if t == cfg.video_token_id else 0 for t in row_ids]])
    extra = {}
    if with_image:
        extra.update(pixel_values=media["image_rows"], image_grid_thw=media["image_grid"])
    if with_video:
        extra.update(pixel_values_videos=media["video_rows"], video_grid_thw=media["video_grid"])
    with torch.no_grad():
        if masks is None:
            return reference(input_ids=ids, mm_token_type_ids=kinds, **extra).logits[0]
        inner = reference.model
        embeds = inner.get_input_embeddings()(ids)
        if with_image:
            found = torch.cat(inner.get_image_features(extra["pixel_values"], extra["image_grid_thw"]).pooler_output)
            embeds = embeds.masked_scatter((ids == cfg.image_token_id)[..., None], found)
        if with_video:
            found = torch.cat(
                inner.get_video_features(extra["pixel_values_videos"], extra["video_grid_thw"]).pooler_output
            )
            embeds = embeds.masked_scatter((ids == cfg.video_token_id)[..., None], found)
        positions, _ = inner.get_rope_index(
            ids, kinds, image_grid_thw=extra.get("image_grid_thw"), video_grid_thw=extra.get("video_grid_thw")
        )
        out = inner.language_model(
            inputs_embeds=embeds,
            position_ids=positions,
            attention_mask={"full_attention": masks[None, None], "linear_attention": None},
        )
        return reference.lm_head(out.last_hidden_state)[0]


def _rows(package: Path, media) -> list[tuple[list[int], tuple, bool, bool]]:
    """(ids, our media, has image, has video) of four rows: image, video, both, text."""
    image, video = media["image_text"], media["video_text"]
    texts = [
        (SYSTEM + image + "the picture of the day\n\n" + QUESTIONS[0], (media["image"],), True, False),
        (SYSTEM + video + "a short video of the order\n\n" + QUESTIONS[1], (media["video"],), False, True),
        (SYSTEM + image + video + "both of them\n\n" + QUESTIONS[0], (media["image"], media["video"]), True, True),
        (SYSTEM + "no media at all\n\n" + QUESTIONS[2], (), False, False),
    ]
    return [(_ids(package, t), m, i, v) for t, m, i, v in texts]


def test_the_package_loads_in_transformers(package: Path, models, media):
    reference, ours = models
    tokenizer = AutoTokenizer.from_pretrained(package)
    cfg = reference.config
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == cfg.image_token_id == ours.mm.image_token_id
    assert tokenizer.convert_tokens_to_ids("<|video_pad|>") == cfg.video_token_id == ours.mm.video_token_id
    assert media["groups"] == 3 and torch.equal(  # 2.5 s: 5 frames read, the last repeated
        patchify(torch.from_numpy(media["image"].pixels), ours.mm.vision), media["image_rows"]
    )


def test_rows_alone_and_packed_equal_transformers(package: Path, models, media):
    reference, ours = models
    rows = _rows(package, media)
    expected = [_reference_logits(reference, ids, media, i, v) for ids, _, i, v in rows]
    gaps = []
    for (ids, row_media, _, _), want in zip(rows, expected, strict=True):
        alone = ours.head_logits(ours.media_hidden_states([MediaRow(ids, row_media)]))
        gaps.append((alone - want).abs().max().item())
    packed = ours.head_logits(ours.media_hidden_states([MediaRow(ids, m) for ids, m, _, _ in rows]))
    start = 0
    for (ids, _, _, _), want in zip(rows, expected, strict=True):
        gaps.append((packed[start : start + len(ids)] - want).abs().max().item())
        start += len(ids)
    last = ours.media_logits([(ids, m) for ids, m, _, _ in rows])
    gaps += [(last[r] - expected[r][-1]).abs().max().item() for r in range(len(rows))]
    scale = max(w.abs().max().item() for w in expected)
    print(f"vision parity: max |ours - transformers| = {max(gaps):.2e} over every position (logits up to {scale:.1f})")
    assert max(gaps) <= TOL


@pytest.mark.parametrize("mode", ["causal", "prefix_bidir", "prefix_causal"])
def test_shared_state_with_media_equals_whole_rows(package: Path, models, media, mode: str):
    reference, ours = models
    ours.attention_mode = mode
    try:
        both = (media["image"], media["video"])
        state = _ids(package, SYSTEM + media["image_text"] + media["video_text"] + "both of them\n\n")
        questions = [_ids(package, q) for q in QUESTIONS]
        prefix = ours.prefix_kv(state, media=both)
        branched = ours.branch_logits(prefix, questions)
        whole = ours.media_logits([MediaRow(state + q, both, state_length=len(state)) for q in questions])
        gap = (branched - whole).abs().max().item()
        print(f"{mode}: shared vs unshared {gap:.2e}")
        assert gap <= TOL
        for q, row in zip(questions, whole, strict=True):
            ids = state + q
            masks = visibility_mask(len(ids), len(state), mode)
            assert masks is not None
            want = _reference_logits(reference, ids, media, True, True, masks)[-1]
            assert (row - want).abs().max().item() <= TOL
        hidden = [ours.media_hidden_states([MediaRow(state + q, both, state_length=len(state))]) for q in questions]
        for h in hidden[1:]:  # no state token sees a question
            assert torch.allclose(h[: len(state)], hidden[0][: len(state)], atol=1e-6, rtol=0)
        if mode != "causal":  # the mode is in force
            ours.attention_mode = "causal"
            causal = ours.media_hidden_states([MediaRow(state + questions[0], both)])
            state_gap = (causal[: len(state)] - hidden[0][: len(state)]).abs().max().item()
            # prefix_bidir: state tokens see later state tokens; prefix_causal: they see what causal sees
            assert state_gap > 1e-3 if mode == "prefix_bidir" else state_gap <= 1e-6
            assert (causal[-1] - hidden[0][-1]).abs().max().item() > 1e-3  # the question sees all of itself
    finally:
        ours.attention_mode = "causal"


def test_bad_rows_are_refused_in_one_line(package: Path, models, media):
    _, ours = models
    ids = _ids(package, SYSTEM + media["image_text"] + "x")
    with pytest.raises(ValueError, match="more image placeholders"):
        ours.media_logits([MediaRow(ids, ())])
    with pytest.raises(ValueError, match="places 1 of 2 images"):
        ours.media_logits([MediaRow(ids, (media["image"], media["image"]))])
    cut = ids[:-3] + ids[-2:]  # one image token short
    with pytest.raises(ValueError, match="placeholder tokens"):
        ours.media_logits([MediaRow(cut, (media["image"],))])
    odd = VisionInput("image", np.zeros((3, 20, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="whole 16x16 blocks"):
        ours.media_logits([MediaRow(ids, (odd,))])


def test_the_fixture_is_deterministic_by_seed(tmp_path: Path):
    requests = write_decision_fixture(tmp_path / "a", "qwen3_5_vision", 0)
    write_decision_fixture(tmp_path / "b", "qwen3_5_vision", 0)
    write_decision_fixture(tmp_path / "c", "qwen3_5_vision", 1)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "preprocessor_config.json" in names and "video_preprocessor_config.json" in names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (tmp_path / "c" / "model.safetensors").read_bytes()
    media = [r["body"] for r in requests if r["surface"] == "decisions"]
    assert [sorted(set(b) & {"images", "videos"}) for b in media] == [["images"], ["videos"]]
