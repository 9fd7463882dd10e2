"""A CLAP package on `/v1/embeddings` (R-API-1, R-BAT-6, R-MEDIA), served in-process: text and
`input_audio` items mixed in one request answer as our model run on each alone (one space,
normalized), text rows and audio rows run in forwards of their own lanes, the card and golden
file, and bad audio answering 400 naming its index without costing a forward."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import _serving_defaults, session_store
from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.adapters.families.audio_clap import ClapModel
from vllm_srun.adapters.media.audio_samples import audio_bytes, audio_item, input_audio, signal
from vllm_srun.adapters.media.decoder import PillowAvDecoder
from vllm_srun.domain.settings.engine_args import EngineArgs


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from vllm_srun.app.fixtures import write_fixture

    with _serving_defaults():
        yield write_fixture(tmp_path_factory.mktemp("clap") / "tiny-clap", "audio", "clap", 0, store=session_store())


def _model(rt: Any) -> ClapModel:
    model = next(iter(rt.models.values())).model
    assert isinstance(model, ClapModel)
    return model


def _alone(model: ClapModel, item: Any) -> np.ndarray:
    with torch.no_grad():
        if isinstance(item, str):
            return model.network.embed_text([model.tokenize([item], truncate=False)[0].ids])[0].numpy()
        data = base64.b64decode(item["input_audio"]["data"])
        feats = PillowAvDecoder().audio(data, item["input_audio"]["format"], model.audio_limits, model.audio_preprocess)
        return model.network.embed_audio(torch.from_numpy(feats[None]))[0].numpy()


def test_text_and_audio_in_one_request_share_one_space(package: Path) -> None:
    items: list[Any] = [
        "the sound of a dog barking",
        audio_item("tone", 1.2, 16000, "wav", 1),
        {"type": "text", "text": "rain on the roof"},
        audio_item("noise", 0.5, 44100, "flac", 2),
        audio_item("chord", 1.5, 48000, "ogg", 3),
        audio_item("clipped", 0.8, 22050, "mp3", 4),
    ]
    # profile batching: a lane's rows share one forward (under exact each row of a model that is
    # not batch-invariant runs alone, R-PROF-2)
    batching = (package, EngineArgs(profile="batching"))
    with serving([batching], media_workers=0, result_cache_entries=0) as (client, rt):
        model = _model(rt)
        r = client.post("/v1/embeddings", json={"input": items, "options": {"return_meta": True}})
        assert r.status_code == 200, r.text
        body = r.json()
        got = np.array([d["embedding"] for d in body["data"]])
        plain = [item["text"] if isinstance(item, dict) and item["type"] == "text" else item for item in items]
        want = np.stack([_alone(model, item) for item in plain])
        assert got.shape == (6, model.dimensions) and np.abs(got - want).max() < 1e-5
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert np.abs(got @ got.T - want @ want.T).max() < 1e-5  # text-audio similarities are the model's
        text_tokens = sum(len(e.ids) for e in model.tokenize([plain[0], plain[2]], truncate=False))
        assert body["usage"]["prompt_tokens"] == text_tokens + 4 * model.audio_tokens
        assert body["meta"]["rows"] == 6 and body["meta"]["forwards"] == 2  # one forward per lane
        text = client.get("/metrics").text
        assert metric(text, "vllm_srun_rows_total", model="tiny-clap", lane="audio") >= 4
        assert metric(text, "vllm_srun_rows_total", model="tiny-clap", lane="text") >= 2
        r = client.post("/v1/embeddings", json={"input": [items[1]], "dimensions": 8, "encoding_format": "base64"})
        vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        assert r.status_code == 200 and vector.shape == (8,) and abs(np.linalg.norm(vector) - 1) < 1e-5


def test_the_card(package: Path) -> None:
    with serving([package], media_workers=0) as (client, _rt):
        card = client.get("/v1/models").json()["data"][0]
    assert card["family"] == "audio" and card["golden"]["status"] == "matched"
    embedding = card["embedding"]
    assert embedding["modalities"] == ["audio", "text"] and embedding["normalized"] is True
    assert embedding["architecture"] == "clap" and embedding["dimensions"] == [16]
    media = card["media"]
    assert media["lane"] == "audio" and media["audio_tokens"] == 256 and media["audio"]["max_seconds"] == 2.0
    assert media["preprocess"]["features"] == "clap log-mel" and media["preprocess"]["truncation"] == "rand_trunc"
    assert [(c["lane"], c["accounting"]) for c in card["caps"]] == [("text", "padded"), ("audio", "padded")]


def test_bad_audio_fails_in_its_slot_naming_it_and_costs_no_forward(package: Path) -> None:
    long = audio_bytes(signal("tone", 3.0, 16000), 16000, "wav")
    flac = audio_bytes(signal("tone", 1.0, 16000), 16000, "flac")
    with serving([package], media_workers=0, result_cache_entries=0) as (client, _rt):
        for bad, message in [
            (input_audio(long, "wav"), "over the limit of 2 s"),
            (input_audio(flac, "wav"), "the data is FLAC, not wav as its format says"),
        ]:
            before = metric(client.get("/metrics").text, "vllm_srun_rows_total")
            r = client.post("/v1/embeddings", json={"input": ["a dog", bad]})
            text, failed = r.json()["data"]  # R-API-10: the text is answered, the audio fails in its slot
            assert r.status_code == 200 and failed["error"] == "invalid_input" and "embedding" in text
            assert failed["message"].startswith("input[1]: ") and message in failed["message"]
            assert metric(client.get("/metrics").text, "vllm_srun_rows_total") - before == 1
