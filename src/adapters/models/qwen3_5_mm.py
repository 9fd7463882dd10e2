"""Qwen3.5 with its vision tower (`Qwen3_5ForConditionalGeneration` checkpoints): token ids with
image and video placeholders plus each row's media in, hidden states or logits out. Our own torch
(`qwen3_5_vision.py`, `qwen3_5_rope.py`); transformers is the tests' reference only.

A row is `MediaRow(ids, media, state_length)`: its ids with every image and video already
expanded to its placeholder tokens (`media/qwen_vision.py` writes that text), and its media in
the order their placeholders appear. A medium is anything with `kind` ("image" | "video") and
`pixels` (float32 [3, H, W] or [T, 3, H, W], numpy or torch); one with a `digest` is run through
the tower once per forward however many rows carry it. Rows run back to back (never padded) and
each row's media belong to that row: the tower reads every medium of the forward in one pass
(attention within each image and each frame group), its embeddings replace the placeholder
tokens' in order, and the multimodal rotary positions lay them out in the text.

Shared context (R-SC): `prefix_kv(state_ids, media=…)` runs a state and its media once; the
questions (`branch_logits`, text only) continue from it at the position after the state, as the
same tokens would in one row. `attention_mode` applies as in `qwen3_5.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from vllm_srun.adapters.lane_yield import yield_point
from vllm_srun.adapters.models.gated_delta import Segments
from vllm_srun.adapters.models.qwen3_5 import HybridState, Qwen35LM, read_attention_mode, read_text_weights
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config
from vllm_srun.adapters.models.qwen3_5_rope import DEFAULT_SECTIONS, MediaTokens, mrope_angles, row_positions
from vllm_srun.adapters.models.qwen3_5_vision import Qwen35Vision, VisionConfig, as_tensor, grid_of

VISION_PREFIX = "model.visual."


@dataclass(frozen=True)
class MultimodalConfig:
    """What config.json says about the vision side: the tower, the placeholder ids, the rotary sections."""

    vision: VisionConfig
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    sections: tuple[int, int, int] = DEFAULT_SECTIONS

    @property
    def tokens(self) -> MediaTokens:
        return MediaTokens(self.image_token_id, self.video_token_id, self.vision.merge)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> MultimodalConfig:
        vision = raw.get("vision_config")
        if not isinstance(vision, dict):
            raise ValueError("a Qwen3.5 model that reads images needs vision_config in config.json")
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
        rope = (text or {}).get("rope_parameters") or (text or {}).get("rope_scaling") or {}
        sections = tuple(int(s) for s in rope.get("mrope_section", DEFAULT_SECTIONS))
        if len(sections) != 3 or min(sections) < 0:  # sections past the frequencies are cut, as transformers does
            raise ValueError(f"mrope_section {list(sections)} is not three counts of rotary frequencies")
        ids: dict[str, int] = {}
        for key, default in (
            ("image_token_id", 248056),
            ("video_token_id", 248057),
            ("vision_start_token_id", 248053),
            ("vision_end_token_id", 248054),
        ):
            ids[key] = int(raw.get(key, default))
        return cls(
            VisionConfig.from_dict(vision),
            ids["image_token_id"],
            ids["video_token_id"],
            ids["vision_start_token_id"],
            ids["vision_end_token_id"],
            (sections[0], sections[1], sections[2]),
        )


@dataclass(frozen=True)
class VisionInput:
    """One medium of a row (what the media module hands on has the same fields)."""

    kind: str  # "image" | "video"
    pixels: Any  # float32 [3, H, W] | [T, 3, H, W]
    digest: bytes | None = None


@dataclass(frozen=True)
class MediaRow:
    """One row: ids (placeholders expanded), its media in placeholder order, and how many of its
    leading tokens are its state (the attention modes; None: all)."""

    ids: Sequence[int]
    media: Sequence[Any] = field(default_factory=tuple)
    state_length: int | None = None


def reads_media(folder: str | Path) -> bool:
    """Does FOLDER hold a Qwen3.5 model that reads images and videos: a vision tower in config.json
    and the image processor's preprocessor_config.json beside it?"""
    path = Path(folder) / "config.json"
    if not path.is_file() or not (Path(folder) / "preprocessor_config.json").is_file():
        return False
    raw = json.loads(path.read_text(encoding="utf-8"))
    return str(raw.get("model_type", "")).lower() == "qwen3_5" and isinstance(raw.get("vision_config"), dict)


class Qwen35VisionLM(Qwen35LM):
    """`Qwen35LM` plus `visual` (module doc)."""

    reads_media = True

    def __init__(self, config: Qwen35Config, mm: MultimodalConfig, head: bool = True) -> None:
        super().__init__(config, head=head)
        if mm.vision.out_hidden_size != config.hidden_size:
            raise ValueError(
                f"the vision tower gives {mm.vision.out_hidden_size} values per token, the text model takes {config.hidden_size}"
            )
        self.mm = mm
        self.visual = Qwen35Vision(mm.vision)

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        *,
        head: bool = True,
    ) -> Qwen35VisionLM:
        folder = Path(folder)
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = Qwen35Config.from_dict(raw)
        mm = MultimodalConfig.from_dict(raw)
        state = read_text_weights(folder, with_head=head and not config.tie_word_embeddings)
        state.update(read_vision_weights(folder))
        state = {k: v.to(dtype).to(device) for k, v in state.items()}
        with torch.device("meta"):
            model = cls(config, mm, head=head)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"weights in {folder} do not fit the Qwen3.5 vision layout: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        model.visual.reset_rotary(device)  # a buffer, not in the checkpoint (built on meta above)
        model.attention_mode = read_attention_mode(folder)
        return model.eval().requires_grad_(False)

    # ---------------------------------------------------------------- media
    def media_features(self, media: Sequence[Any]) -> list[torch.Tensor]:
        """The tower's token embeddings [tokens, hidden] of each medium, each distinct one run once."""
        order: dict[Any, int] = {}
        distinct: list[torch.Tensor] = []
        slots = []
        for medium in media:
            key = getattr(medium, "digest", None) or id(medium)
            key = (medium.kind, key)
            if key not in order:
                order[key] = len(distinct)
                distinct.append(as_tensor(medium.pixels))
            slots.append(order[key])
        features = self.visual(distinct)
        return [features[i].to(self.dtype) for i in slots]

    def _assemble(
        self, rows: Sequence[MediaRow], start: int = 0
    ) -> tuple[torch.Tensor, Segments, tuple[torch.Tensor, torch.Tensor], list[int]]:
        """Input embeddings [N, H] of ROWS with their media spliced in, the rows' segments, their
        rotary cos/sin, and the position after each row."""
        tokens = self.mm.tokens
        c = self.mm.vision
        positions, nexts, all_media = [], [], []
        for i, row in enumerate(rows):
            kinds = [m.kind for m in row.media]
            if any(k not in ("image", "video") for k in kinds):
                raise ValueError(f"row {i}: a medium is an image or a video (got {sorted(set(kinds))})")
            images = [grid_of(tuple(m.pixels.shape), c) for m in row.media if m.kind == "image"]
            videos = [grid_of(tuple(m.pixels.shape), c) for m in row.media if m.kind == "video"]
            if any(len(m.pixels.shape) != 3 for m in row.media if m.kind == "image"):
                raise ValueError(f"row {i}: an image's pixels are [3, H, W]")
            try:
                pos, nxt = row_positions(row.ids, images, videos, tokens, start)
            except ValueError as exc:
                raise ValueError(f"row {i}: {exc}") from None
            positions.append(pos)
            nexts.append(nxt)
            all_media.extend(sorted(row.media, key=lambda m: m.kind != "image"))  # images, then videos
        ids = self._ids([t for row in rows for t in row.ids])
        x = self.model.embed_tokens(ids)
        if all_media:
            features = self.media_features(all_media)
            image_rows, video_rows = [], []
            cursor = 0
            for row in rows:  # per row: its images' features in order, then its videos'
                n_images = sum(m.kind == "image" for m in row.media)
                image_rows.extend(features[cursor : cursor + n_images])
                video_rows.extend(features[cursor + n_images : cursor + len(row.media)])
                cursor += len(row.media)
            x = x.clone()
            if image_rows:
                x[ids == tokens.image_id] = torch.cat(image_rows)
            if video_rows:
                x[ids == tokens.video_id] = torch.cat(video_rows)
        seg = Segments.of([len(row.ids) for row in rows], self.device)
        cfg = self.config
        rope = mrope_angles(
            torch.cat(positions, dim=1).to(self.device), cfg.rotary_dim, cfg.rope_theta, self.mm.sections, self.dtype
        )
        yield_point()  # between the vision tower and the language model's layers (R-BAT-6)
        return x, seg, rope, nexts

    # ---------------------------------------------------------------- forwards
    @torch.inference_mode()
    def media_hidden_states(self, rows: Sequence[MediaRow | tuple[Sequence[int], Sequence[Any]]]) -> torch.Tensor:
        """Final-normed hidden states [N, hidden] of ROWS laid back to back."""
        ready = [_row(r) for r in rows]
        x, seg, rope, _ = self._assemble(ready)
        return self._layers(x, seg, rope, vis=self.visibility(_states(ready)))[0]

    @torch.inference_mode()
    def media_logits(self, rows: Sequence[MediaRow | tuple[Sequence[int], Sequence[Any]]]) -> torch.Tensor:
        """Next-token logits [R, vocab] after the last token of each row."""
        ready = [_row(r) for r in rows]
        x, seg, rope, _ = self._assemble(ready)
        h, _ = self._layers(x, seg, rope, vis=self.visibility(_states(ready)))
        return self.head_logits(h[seg.ends - 1])

    @torch.inference_mode()
    def prefix_kv(self, state_ids: torch.Tensor | Sequence[int], media: Sequence[Any] = ()) -> HybridState:
        """Run a state (its media with it) once; its continuations start at the position after it."""
        ids = [int(t) for t in self._ids(state_ids).reshape(-1).tolist()]
        if not ids:
            raise ValueError("a shared state needs at least one token")
        x, seg, rope, nexts = self._assemble([MediaRow(ids, tuple(media))])
        _, kept = self._layers(x, seg, rope, vis=self.visibility(), keep=True)
        return HybridState(kept, len(ids), nexts[0])


def _row(row: Any) -> MediaRow:
    if isinstance(row, MediaRow):
        return row
    ids, media = row
    return MediaRow(list(ids), tuple(media))


def _states(rows: Sequence[MediaRow]) -> list[int] | None:
    if all(r.state_length is None for r in rows):
        return None
    return [len(r.ids) if r.state_length is None else r.state_length for r in rows]


def read_vision_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tower's tensors (`model.visual.X` → `visual.X`) of FOLDER's safetensors."""
    state: dict[str, torch.Tensor] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                if key.startswith(VISION_PREFIX):
                    state["visual." + key[len(VISION_PREFIX) :]] = f.get_tensor(key)
    if not state:
        raise ValueError(f"{folder}: config.json has a vision_config but the weights hold no model.visual.* tensors")
    return state
