"""Decisions about images and videos through HTTP (R-API-4, R-BAT-6, R-SC, R-PERF-4) on the
`qwen3_5_vision` fixture (a tiny random Qwen3.5 with its vision tower; FP32, CPU), served in
process with a media worker:

- an image question, a video question, both, and a `states` entry are answered; each answer
  equals transformers' `Qwen3_5ForConditionalGeneration` read on the same prompt ids and the same
  preprocessed pixels (softmax over the answer tokens, within 1e-4);
- the state once (profile shared_context, break-even pinned to 0): one shared row in the `media`
  lane per state, answers within 1e-4 of the unshared ones (`exact`: one row a question, each
  carrying the state's media), `usage.input_tokens` the same both ways, counting the media's
  tokens once; the media decoded once for both;
- text rows of the same model stay in the `text` lane.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.adapters.contracts import StateMedium
from vllm_srun.adapters.families.fixtures.decision_fixture import write_decision_fixture
from vllm_srun.adapters.media.samples import image_url, video_url
from vllm_srun.domain.settings.engine_args import EngineArgs

TOL = 1e-4
QUESTIONS = {
    "bright": {"type": "noul", "instructions": "Is the picture bright?"},
    "colour": {
        "type": "choice",
        "instructions": "Which colour?",
        "criteria": {"red": None, "green": None, "blue": None},
    },
    "busy": {"type": "score", "instructions": "How busy is it?", "criteria": ["calm", "some", "busy"]},
}
IMAGE = image_url(11, 72, 50)
VIDEO = video_url(
    12, frames=20, width=56, height=40
)  # 2.5 s at 8 frames a second: 5 frames read, 6 with the last again


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The fixture as written, and a copy whose srun.json pins the shared-context break-even to 0."""
    root = tmp_path_factory.mktemp("qwen3_5_vision")
    plain = root / "tiny-vision"
    write_decision_fixture(plain, "qwen3_5_vision", 0)
    shared = root / "tiny-vision-shared"
    shutil.copytree(plain, shared)
    manifest = json.loads((shared / "srun.json").read_text())
    manifest["shared_context"] = {"break_even_tokens": 0}
    (shared / "srun.json").write_text(json.dumps(manifest))
    (shared / "golden.json").unlink(missing_ok=True)
    return plain, shared


@pytest.fixture(scope="module")
def served(packages: tuple[Path, Path]) -> Iterator[tuple[Any, Any]]:
    plain, shared = packages
    models = [
        (plain, EngineArgs(batch_window_ms=0)),
        (shared, EngineArgs(batch_window_ms=0, profile="shared_context")),
    ]
    with serving(models, media_workers=1, max_request_bytes=64 << 20) as (client, rt):
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert all(c["status"] == "ready" for c in cards.values()), cards
        yield client, rt


def _ask(client: Any, model: str, **body: Any) -> dict[str, Any]:
    got = client.post("/v1/decisions", json={"model": model, "options": {"return_meta": True}, **body})
    assert got.status_code == 200, got.text
    return dict(got.json())


def _values(answer: dict[str, Any]) -> list[float]:
    if answer["type"] == "noul":
        return [answer["noul"]]
    return list(answer["probabilities"].values())


def _gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(abs(x - y) for name in a for x, y in zip(_values(a[name]), _values(b[name]), strict=True))


def test_card_says_what_the_model_reads(served: tuple[Any, Any]) -> None:
    client, _ = served
    card = client.get("/v1/models").json()["data"][0]
    assert card["modalities"] == ["image", "text", "video"]
    assert card["limits"]["image_max_bytes"] == 8_000_000 and card["limits"]["image_source_max_pixels"] == 16_000_000
    assert card["media"]["lane"] == "media" and card["media"]["workers"] == 1


@pytest.mark.parametrize(
    "media",
    [{"images": [IMAGE]}, {"videos": [VIDEO]}, {"images": [IMAGE], "videos": [VIDEO]}],
    ids=["image", "video", "both"],
)
def test_answers_equal_transformers_and_shared_equals_unshared(served: tuple[Any, Any], media: dict[str, Any]) -> None:
    client, rt = served
    scrape = client.get("/metrics").text
    before = metric(scrape, "vllm_srun_media_decode_duration_seconds_count")
    unshared = _ask(client, "tiny-vision", state="A picture of the day.", questions=QUESTIONS, **media)
    shared = _ask(client, "tiny-vision-shared", state="A picture of the day.", questions=QUESTIONS, **media)
    assert unshared["meta"]["rows"] == len(QUESTIONS) and shared["meta"]["rows"] == 1
    assert shared["usage"] == unshared["usage"]
    assert _gap(shared["answers"], unshared["answers"]) <= TOL
    decoded = metric(client.get("/metrics").text, "vllm_srun_media_decode_duration_seconds_count") - before
    assert decoded <= len(media.get("images", [])) + len(media.get("videos", []))  # once, for both models
    reference = _reference_answers(rt, "A picture of the day.", media)
    to_reference, shared_gap = _gap(unshared["answers"], reference), _gap(shared["answers"], unshared["answers"])
    print(f"{sorted(media)}: served vs transformers {to_reference:.1e}, shared vs unshared {shared_gap:.1e}")
    assert to_reference <= TOL and _gap(shared["answers"], reference) <= TOL


def test_a_states_entry_reads_its_own_media(served: tuple[Any, Any]) -> None:
    client, _ = served
    body = {
        "state": "No picture here.",
        "questions": {"bright": QUESTIONS["bright"]},
        "states": {"clip": {"state": "A short clip.", "questions": QUESTIONS, "videos": [VIDEO]}},
    }
    got = _ask(client, "tiny-vision", **body)
    alone = _ask(client, "tiny-vision", state="A short clip.", questions=QUESTIONS, videos=[VIDEO])
    assert got["states"]["clip"]["answers"] == alone["answers"] and got["states"]["clip"]["usage"] == alone["usage"]
    text = _ask(client, "tiny-vision", state="No picture here.", questions={"bright": QUESTIONS["bright"]})
    assert got["answers"] == text["answers"] and got["usage"] == text["usage"]


def test_text_rows_stay_in_the_text_lane(served: tuple[Any, Any]) -> None:
    client, _ = served
    lanes = ("text", "shared", "media")
    scrape = client.get("/metrics").text
    before = {lane: metric(scrape, "vllm_srun_rows_total", model="tiny-vision", lane=lane) for lane in lanes}
    _ask(client, "tiny-vision", state="Only words.", questions=QUESTIONS)
    _ask(client, "tiny-vision", state="Words and a picture.", questions=QUESTIONS, images=[IMAGE])
    scrape = client.get("/metrics").text
    ran = {
        lane: metric(scrape, "vllm_srun_rows_total", model="tiny-vision", lane=lane) - before[lane] for lane in lanes
    }
    assert ran == {"text": len(QUESTIONS), "shared": 0, "media": len(QUESTIONS)}


# ---- the reference ---------------------------------------------------------------------------------
def _reference_answers(rt: Any, state: str, media: dict[str, Any]) -> dict[str, Any]:
    """transformers' answers to QUESTIONS about STATE and MEDIA: the served model's own prompt ids and
    pixels (decoded as the server decodes them), read by `Qwen3_5ForConditionalGeneration`."""
    from vllm_srun.adapters.media.data_url import data_url_bytes
    from vllm_srun.adapters.media.decoder import PillowAvDecoder
    from vllm_srun.adapters.models.qwen3_5_vision import patchify
    from vllm_srun.adapters.surfaces.decision_layout import lay_out
    from vllm_srun.adapters.surfaces.decision_questions import read_all

    served = rt.get("tiny-vision")
    model = served.model
    decoder = PillowAvDecoder()
    items: list[StateMedium] = []
    for url in media.get("images", []):
        data = data_url_bytes(url, "image", 10**8)
        items.append(StateMedium("image", decoder.image(data, model.image_limits, model.preprocess), b""))
    for url in media.get("videos", []):
        data = data_url_bytes(url, "video", 10**8)
        clip = decoder.clip(data, model.video_limits, model.preprocess)
        items.append(StateMedium("video", clip.pixels, b"", clip.times))
    (view,) = lay_out(read_all(QUESTIONS), QUESTIONS, state).views  # the questions as the surface asks them
    prepared = model.prepare(view.text, view.asked, media=items)
    reference = _transformers(served.folder)
    cfg = reference.config
    tower = model.decoder_engine.lm.mm.vision  # the vision config patchify reads
    extra: dict[str, Any] = {}
    images = [m for m in items if m.kind == "image"]
    videos = [m for m in items if m.kind == "video"]
    spec = model.preprocess
    if images:
        extra["pixel_values"] = torch.cat([patchify(torch.from_numpy(np.array(m.pixels)), tower) for m in images])
        extra["image_grid_thw"] = torch.tensor([list(spec.grid("image", m.pixels.shape)) for m in images])
    if videos:
        extra["pixel_values_videos"] = torch.cat(
            [patchify(torch.from_numpy(np.array(m.pixels)), tower) for m in videos]
        )
        extra["video_grid_thw"] = torch.tensor([list(spec.grid("video", m.pixels.shape)) for m in videos])
    out = {}
    for q in prepared.questions:
        assert q.error is None and q.rendered is not None, q.error
        ids = list(prepared.state_ids + q.ids)
        kinds = torch.tensor([[1 if t == cfg.image_token_id else 2 if t == cfg.video_token_id else 0 for t in ids]])
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([ids]), mm_token_type_ids=kinds, **extra).logits[0, -1]
        picked = logits[list(q.answer_ids)].double()
        probs = torch.softmax(picked, dim=0).tolist()
        out[q.name] = (
            {"type": "noul", "noul": probs[0]}
            if q.kind == "noul"
            else {"type": q.kind, "probabilities": dict(zip(q.rendered.labels, probs))}
        )
    return out


_LOADED: dict[Path, Any] = {}


def _transformers(folder: Path) -> Any:
    from transformers import Qwen3_5ForConditionalGeneration

    if folder not in _LOADED:
        _LOADED[folder] = Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return _LOADED[folder]
