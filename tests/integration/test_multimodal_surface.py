"""`/v1/embeddings` of multimodal models (R-API-1, R-BAT-6, R-MEDIA), served in-process: text,
image and video items in one request, answers equal to our model run item by item, the media
lane, the card, and bad inputs that answer 400 naming their index without costing a forward."""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.contract_shapes import check
from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.adapters.families.multimodal import MultimodalModel
from vllm_srun.adapters.media.decoder import PillowAvDecoder
from vllm_srun.adapters.media.samples import data_url, image_bytes, image_url, video_bytes, video_url
from vllm_srun.domain.settings.engine_args import EngineArgs

Fixture = Callable[..., Path]


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _video(url: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url}}


def _model(rt: Any) -> MultimodalModel:
    model = next(iter(rt.models.values())).model
    assert isinstance(model, MultimodalModel)
    return model


def _alone(model: MultimodalModel, item: Any, frames: int | None = None) -> np.ndarray:
    """What our model answers for ITEM run by itself, without the server."""
    network, decoder = model.network, PillowAvDecoder()
    with torch.no_grad():
        if isinstance(item, str):
            return network.embed_text([model.tokenize([item], truncate=False)[0].ids])[0].numpy()
        kind = item["type"]
        data = base64.b64decode(item[kind]["url"].split(",", 1)[1])
        if kind == "image_url":
            pixels = decoder.image(data, model.image_limits, model.preprocess)[None]
            return network.embed_images(torch.from_numpy(pixels))[0].numpy()
        pixels = decoder.video_frames(data, frames or model.video_frames, model.video_limits, model.preprocess)
        mean = network.embed_images(torch.from_numpy(pixels)).numpy().mean(axis=0)
        return mean / np.linalg.norm(mean)


@pytest.mark.parametrize("variant", ["clip", "siglip"])
def test_text_image_and_video_in_one_request(multimodal_fixture: Fixture, variant: str) -> None:
    items = [
        "a photo of a small cat",
        _image(image_url(1, 64, 48)),
        {"type": "text", "text": "the sea at night"},
        _video(video_url(2, 7)),
        _image(image_url(3, 20, 90, fmt="JPEG", orientation=8)),
    ]
    batching = (multimodal_fixture(variant), EngineArgs(profile="batching"))  # a lane's rows in one forward
    with serving([batching], media_workers=0, result_cache_entries=0) as (client, rt):
        model = _model(rt)
        r = client.post("/v1/embeddings", json={"input": items, "options": {"return_meta": True}})
        assert r.status_code == 200, r.text
        body = r.json()
        got = np.array([d["embedding"] for d in body["data"]])
        want = np.stack(
            [
                _alone(model, item if not isinstance(item, dict) or item["type"] != "text" else item["text"])
                for item in items
            ]
        )
        assert got.shape == (5, model.dimensions) and np.abs(got - want).max() < 1e-5
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        # one space: text-image similarities are those of the model's own embeddings
        assert np.abs(got @ got.T - want @ want.T).max() < 1e-5
        media_rows = 2 + model.video_frames
        text_tokens = sum(
            len(e.ids) for e in model.tokenize(["a photo of a small cat", "the sea at night"], truncate=False)
        )
        assert body["usage"]["prompt_tokens"] == text_tokens + media_rows * model.image_tokens
        meta = body["meta"]
        assert meta["rows"] == 2 + media_rows and meta["forwards"] == 2  # one forward per lane: they never mix
        text = client.get("/metrics").text
        assert metric(text, "vllm_srun_rows_total", model=f"tiny-{variant}", lane="media") >= media_rows
        assert metric(text, "vllm_srun_forwards_total", model=f"tiny-{variant}", lane="media", outcome="ok") >= 1
        assert metric(text, "vllm_srun_forwards_total", model=f"tiny-{variant}", lane="text", outcome="ok") >= 1


def test_options_dimensions_and_the_string_form(multimodal_fixture: Fixture) -> None:
    with serving([multimodal_fixture("clip")], media_workers=0, result_cache_entries=0) as (client, rt):
        model = _model(rt)
        url = video_url(4, 9)
        r = client.post("/v1/embeddings", json={"input": [_video(url)], "options": {"frames": 3, "return_meta": True}})
        assert r.status_code == 200 and r.json()["meta"]["rows"] == 3
        assert np.abs(np.array(r.json()["data"][0]["embedding"]) - _alone(model, _video(url), 3)).max() < 1e-5
        r = client.post(
            "/v1/embeddings",
            json={
                "input": [{"type": "image_url", "image_url": image_url(5)}],
                "dimensions": 8,
                "encoding_format": "base64",
            },
        )
        vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        assert r.status_code == 200 and vector.shape == (8,) and abs(np.linalg.norm(vector) - 1) < 1e-5
        r = client.post("/v1/embeddings", json={"input": [_video(url)], "options": {"frames": 33}})
        assert r.status_code == 400 and "frames" in r.json()["error"]["message"]


def test_the_card(multimodal_fixture: Fixture) -> None:
    with serving([multimodal_fixture("siglip")], media_workers=0) as (client, _rt):
        card = client.get("/v1/models").json()["data"][0]
    assert (
        card["family"] == "multimodal" and card["surfaces"] == ["embeddings"] and card["golden"]["status"] == "matched"
    )
    assert card["embedding"] == {
        "dimensions": [32],
        "layers": [2],
        "modalities": ["image", "text", "video"],
        "normalized": True,
        "pooling": "each siglip tower's own, projected into one space",
        "input_types": [],
        "architecture": "siglip",
    }
    limits = card["limits"]
    assert (limits["image_max_pixels"], limits["image_source_max_pixels"]) == (32 * 32, 50_000_000)
    media = card["media"]
    assert media["workers"] == 0 and media["workers_source"] == "set" and media["image_tokens"] == 16
    assert media["image"] == {"max_bytes": 16 * 2**20, "max_pixels": 50_000_000}
    assert media["video"]["frames"] == 4 and media["video"]["max_frames"] == 32 and media["video"]["max_seconds"] == 120
    assert set(media["decode_cache"]) == {"entries", "max_entries", "bytes", "max_bytes", "hits", "misses"}
    assert media["preprocess"]["resize"] == {"height": 32, "width": 32} and media["preprocess"]["mean"] == [0.5] * 3
    assert [(c["lane"], c["accounting"], c["cap_tokens"]) for c in card["caps"]] == [
        ("text", "padded", 4096),
        ("media", "padded", 1024),
    ]


BAD: list[tuple[Any, str]] = [
    (_image("http://example.com/cat.png"), "only data: URLs are read"),
    (_image("data:image/png;base64,%%%"), "invalid base64"),
    (_image(data_url(b"not an image at all", "image/png")), "not an image in a supported format"),
    (_image(data_url(image_bytes(1, 64, 64)[:150], "image/png")), "corrupt or truncated|unreadable"),
    (_video(data_url(image_bytes(1, 8, 8), "video/mp4")), "not a video in a supported container"),
    (_video(data_url(video_bytes(1, 8)[:500], "video/mp4")), "unreadable mov container"),
]


def test_a_bad_item_fails_in_its_slot_naming_it_and_costs_no_forward(multimodal_fixture: Fixture) -> None:
    """R-API-10: the bad item answers `invalid_input` in its slot, its siblings their vectors; it
    takes no row (the rows counter grows by the siblings' two rows alone)."""
    with serving([multimodal_fixture("clip")], media_workers=0, result_cache_entries=0) as (client, _rt):
        alone = client.post("/v1/embeddings", json={"input": ["fine text", _image(image_url(9))]}).json()["data"]
        for bad, message in BAD:
            before = metric(client.get("/metrics").text, "vllm_srun_rows_total")
            r = client.post("/v1/embeddings", json={"input": ["fine text", _image(image_url(9)), bad]})
            assert r.status_code == 200 and check("EmbeddingsResponse", r.json()) == [], r.text
            first, second, failed = r.json()["data"]
            assert failed.keys() == {"object", "index", "error", "message"} and failed["error"] == "invalid_input"
            assert failed["message"].startswith("input[2]: ") and "\n" not in failed["message"]
            assert re.search(message, failed["message"]), failed["message"]
            assert [first["embedding"], second["embedding"]] == [d["embedding"] for d in alone]
            assert metric(client.get("/metrics").text, "vllm_srun_rows_total") - before == 2


def test_text_only_models_refuse_media_and_media_models_may_refuse_video(
    encoder_fixture: Fixture, multimodal_fixture: Fixture, tmp_path: Path
) -> None:
    with serving([encoder_fixture("embed")]) as (client, _rt):
        r = client.post("/v1/embeddings", json={"input": ["a cat", _image(image_url(1))]})
        assert (
            r.status_code == 422 and r.json()["error"]["message"] == "input[1] is an image: this model reads text only"
        )
        assert client.post("/v1/embeddings", json={"input": ["a cat"]}).status_code == 200
    folder = tmp_path / "images-only"
    shutil.copytree(multimodal_fixture("clip"), folder)
    (folder / "golden.json").unlink()  # its recorded requests read a video
    manifest = json.loads((folder / "srun.json").read_text())
    manifest.update(modalities=["text", "image"], media={"max_video_frames": 8, "max_image_pixels": 1000})
    (folder / "srun.json").write_text(json.dumps(manifest))
    with serving([folder], media_workers=0) as (client, _rt):
        r = client.post("/v1/embeddings", json={"input": [_video(video_url(1))]})
        assert r.status_code == 422 and "input[0] is a video: this model reads image, text only" in r.text
        r = client.post("/v1/embeddings", json={"input": [_image(image_url(1, 40, 30))]})
        (failed,) = r.json()["data"]  # the only item fails in its slot: still 200 (R-API-10)
        assert r.status_code == 200 and "1200 pixels, over the limit of 1000" in failed["message"]


def test_media_workers_answer_as_the_request_path_does(multimodal_fixture: Fixture) -> None:
    body = {"input": [_image(image_url(7, 33, 77)), _video(video_url(8, 5)), "text"]}
    answers = []
    for workers in (0, 1):
        with serving([multimodal_fixture("clip")], media_workers=workers, result_cache_entries=0) as (client, _rt):
            answers.append(client.post("/v1/embeddings", json=body).json()["data"])
            card = client.get("/v1/models").json()["data"][0]["media"]
            assert card["workers"] == workers and len(card["worker_pids"]) == workers
    assert answers[0] == answers[1]


def test_repeated_media_is_decoded_once_across_requests(multimodal_fixture: Fixture) -> None:
    with serving([multimodal_fixture("clip")], media_workers=0, result_cache_entries=0) as (client, _rt):
        url = image_url(12, 50, 60)
        for _ in range(3):
            assert client.post("/v1/embeddings", json={"input": [_image(url), "text"]}).status_code == 200
        cache = client.get("/v1/models").json()["data"][0]["media"]["decode_cache"]
        text = client.get("/metrics").text
    assert metric(text, "vllm_srun_media_decode_cache_total", outcome="miss") == cache["misses"]
    assert metric(text, "vllm_srun_media_decode_cache_total", kind="image", outcome="hit") >= 2
    assert metric(text, "vllm_srun_media_decode_cache_bytes") == cache["bytes"] > 0
