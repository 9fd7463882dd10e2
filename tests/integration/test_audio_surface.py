"""`/v1/embeddings` `input_audio` items on the audio family (R-API-1, R-BAT-6, R-MEDIA,
R-PERF-4), served in-process: answers equal to our model run on the decoder's features, the
audio lane and its own rows, the card, bad audio answering 400 naming its index without costing
a forward, text refused by an audio-only model, and repeated audio decoded once."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import _serving_defaults, session_store
from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.adapters.families.audio import AudioModel
from vllm_srun.adapters.media.audio_samples import audio_bytes, audio_item, input_audio, signal
from vllm_srun.adapters.media.decoder import PillowAvDecoder


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from vllm_srun.app.fixtures import write_fixture

    with _serving_defaults():
        yield write_fixture(
            tmp_path_factory.mktemp("audio") / "tiny-whisper", "audio", "whisper", 0, store=session_store()
        )


def _model(rt: Any) -> AudioModel:
    model = next(iter(rt.models.values())).model
    assert isinstance(model, AudioModel)
    return model


def _alone(model: AudioModel, item: dict[str, Any]) -> np.ndarray:
    data = base64.b64decode(item["input_audio"]["data"])
    feats = PillowAvDecoder().audio(data, item["input_audio"]["format"], model.audio_limits, model.audio_preprocess)
    with torch.no_grad():
        return model.network.embed_audio(torch.from_numpy(feats[None]))[0].numpy()


def test_audio_items_in_every_format(package: Path) -> None:
    items = [
        audio_item("tone", 1.2, 16000, "wav", 1),
        audio_item("noise", 0.5, 44100, "flac", 2),
        audio_item("chord", 1.5, 48000, "ogg", 3),
        audio_item("clipped", 0.8, 22050, "mp3", 4),
    ]
    with serving([package], media_workers=0, result_cache_entries=0) as (client, rt):
        model = _model(rt)
        r = client.post("/v1/embeddings", json={"input": items, "options": {"return_meta": True}})
        assert r.status_code == 200, r.text
        body = r.json()
        got = np.array([d["embedding"] for d in body["data"]])
        want = np.stack([_alone(model, item) for item in items])
        assert got.shape == (4, model.dimensions) and np.abs(got - want).max() < 1e-5
        assert body["usage"]["prompt_tokens"] == 4 * model.audio_tokens
        assert body["meta"]["rows"] == 4
        text = client.get("/metrics").text
        assert metric(text, "vllm_srun_rows_total", model="tiny-whisper", lane="audio") >= 4
        r = client.post("/v1/embeddings", json={"input": [items[0]], "dimensions": 8, "encoding_format": "base64"})
        vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        assert r.status_code == 200 and np.abs(vector - want[0][:8]).max() < 1e-5  # not normalized: cut only


def test_the_card(package: Path) -> None:
    with serving([package], media_workers=0) as (client, _rt):
        card = client.get("/v1/models").json()["data"][0]
    assert card["family"] == "audio" and card["golden"]["status"] == "matched"
    assert card["embedding"]["modalities"] == ["audio"] and card["embedding"]["normalized"] is False
    media = card["media"]
    assert media["lane"] == "audio" and media["audio_tokens"] == 100
    assert media["audio"]["max_seconds"] == 2.0 and media["audio"]["formats"] == ["wav", "flac", "mp3", "ogg"]
    assert media["preprocess"]["sampling_rate"] == 16000 and media["preprocess"]["n_mels"] == 16
    assert [(c["lane"], c["accounting"]) for c in card["caps"]] == [("audio", "padded")]


FLAC = audio_bytes(signal("tone", 1.0, 16000), 16000, "flac")
BAD: list[tuple[Any, str]] = [
    ({"type": "input_audio", "input_audio": {"data": "not*base64!", "format": "wav"}}, "invalid base64"),
    ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "the audio is empty"),
    (input_audio(FLAC, "wav"), "the data is FLAC, not wav as its format says"),
    (input_audio(b"\x00" * 400, "mp3"), "not audio in a supported format"),
    (input_audio(audio_bytes(signal("tone", 1.0, 16000), 16000, "wav")[:3000], "wav"), "truncated"),
    (input_audio(audio_bytes(signal("tone", 3.0, 16000), 16000, "wav"), "wav"), "over the limit of 2 s"),
]


def test_a_bad_audio_item_fails_in_its_slot_naming_it_and_costs_no_forward(package: Path) -> None:
    """R-API-10: a bad item answers `invalid_input` in its slot and takes no row; a format the
    schema does not name, or text to an audio-only model, still fails the request."""
    good = audio_item("tone", 0.5, 16000, "wav", 9)
    with serving([package], media_workers=0, result_cache_entries=0) as (client, _rt):
        for bad, message in BAD:
            before = metric(client.get("/metrics").text, "vllm_srun_rows_total")
            r = client.post("/v1/embeddings", json={"input": [good, good, bad]})
            assert r.status_code == 200, r.text
            first, second, failed = r.json()["data"]
            assert failed["error"] == "invalid_input" and "embedding" not in failed
            assert failed["message"].startswith("input[2]: ") and "\n" not in failed["message"]
            assert re.search(message, failed["message"]), failed["message"]
            assert first["embedding"] == second["embedding"]
            assert metric(client.get("/metrics").text, "vllm_srun_rows_total") - before == 2
        before = metric(client.get("/metrics").text, "vllm_srun_forwards_total")
        r = client.post(
            "/v1/embeddings",
            json={"input": [good, {"type": "input_audio", "input_audio": {"data": "AA", "format": "aiff"}}]},
        )
        assert r.status_code == 400 and "input[1]" in r.text
        r = client.post("/v1/embeddings", json={"input": [good, "some text"]})
        assert r.status_code == 422 and r.json()["error"]["message"] == "input[1] is text: this model reads audio only"
        assert metric(client.get("/metrics").text, "vllm_srun_forwards_total") == before
        assert client.post("/v1/embeddings", json={"input": [good]}).status_code == 200


def test_models_without_audio_refuse_it(multimodal_fixture: Any) -> None:
    with serving([multimodal_fixture("clip")], media_workers=0) as (client, _rt):
        r = client.post("/v1/embeddings", json={"input": ["a cat", audio_item("tone", 0.5, 16000)]})
        assert (
            r.status_code == 422
            and r.json()["error"]["message"] == "input[1] is audio: this model reads image, text, video only"
        )


def test_media_workers_answer_as_the_request_path_does_and_repeats_decode_once(package: Path) -> None:
    item = audio_item("chord", 1.1, 32000, "flac", 5)
    answers = []
    for workers in (0, 1):
        with serving([package], media_workers=workers, result_cache_entries=0) as (client, _rt):

            def counts() -> tuple[float, ...]:  # the golden check at load decodes through the cache too
                text = client.get("/metrics").text
                cache = client.get("/v1/models").json()["data"][0]["media"]["decode_cache"]
                return (
                    metric(text, "vllm_srun_media_decode_cache_total", kind="audio", outcome="miss"),
                    metric(text, "vllm_srun_media_decode_cache_total", kind="audio", outcome="hit"),
                    metric(text, "vllm_srun_media_decode_cache_entries", kind="audio"),
                    cache["misses"],
                )

            before = counts()
            for _ in range(3):
                r = client.post("/v1/embeddings", json={"input": [item, item]})
                assert r.status_code == 200
            answers.append(r.json()["data"])
            assert [a - b for a, b in zip(counts(), before, strict=True)] == [1, 5, 1, 1]
    assert answers[0] == answers[1]
