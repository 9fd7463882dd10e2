"""Decisions about images and videos end to end (R-API-4, R-MEDIA, R-BAT-6, R-SC): the
`qwen3_5_vision` fixture written by `vllm-srun fixture --family decision --variant qwen3_5_vision`
(golden file included, recorded through the real surface with an image and a video question),
served by a real `vllm-srun serve` process with a media worker, and through `vllm-sr serve`:

- an image question and a video question, alone and sent at once with text questions, equal
  transformers' `Qwen3_5ForConditionalGeneration` (its tokenizer and its PIL image processor
  loaded apart; the video's frames as our decoder samples them) within 1e-4;
- a state with media under `shared_context` runs once (one row) and answers as `exact` does, with
  the same `usage.input_tokens`;
- the official `typesafe-sdk` client, unmodified, sends its media assets (a multipart body) and
  gets the answers a JSON request with the same image gets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.front import running_front
from tests.e2e.server import running_server
from vllm_srun.adapters.media.samples import data_url, image_bytes, video_bytes, video_url

typesafe_sdk = pytest.importorskip("typesafe_sdk")
from typesafe_sdk import Choice, Image, Noul, TypeSafeClient  # noqa: E402

pytestmark = pytest.mark.slow
MODEL = "tiny-decision-qwen3_5_vision"
QUESTIONS = {
    "bright": {"type": "noul", "instructions": "Is the picture bright?"},
    "tone": {"type": "choice", "instructions": "Which tone?", "criteria": {"calm": None, "busy": None}},
}
PNG = image_bytes(31, 60, 44)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / MODEL
    command = ["fixture", str(out), "--family", "decision", "--variant", "qwen3_5_vision"]
    done = subprocess.run([sys.executable, "-m", "vllm_srun.app.cli", *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (out / "golden.json").is_file() and (out / "preprocessor_config.json").is_file()
    return out


@pytest.fixture(scope="module")
def server(package: Path) -> Iterator[str]:
    models = package.parent / "models.yaml"  # shared_context always chosen when asked for; exact by request
    models.write_text(
        f"models:\n  - model: {package}\n    name: {MODEL}\n    profile: shared_context\n"
        "    options: {break_even_tokens: 0}\n"
    )
    flags = ("--models", str(models), "--media-workers", "1", "--result-cache-entries", "0")
    with running_server(*flags) as base:
        yield base


def test_the_golden_check_passed_with_its_image_and_video_questions(server: str, package: Path) -> None:
    recorded = json.loads((package / "golden.json").read_text())["requests"]
    assert any("images" in r["body"] for r in recorded) and any("videos" in r["body"] for r in recorded)
    card = httpx.get(f"{server}/v1/models").json()["data"][0]
    assert card["status"] == "ready" and card["golden"]["status"] == "matched", card["golden"]
    assert card["modalities"] == ["image", "text", "video"] and card["media"]["workers"] == 1


def test_the_sdk_sends_an_image_asset_and_gets_the_json_answer(server: str) -> None:
    by_json = httpx.post(
        f"{server}/v1/decisions",
        json={"state": "What is in the picture?", "questions": QUESTIONS, "images": [data_url(PNG, "image/png")]},
        timeout=60,
    )
    assert by_json.status_code == 200, by_json.text
    picture = Image(PNG)
    with TypeSafeClient(api_key="unused", base_url=server, model=MODEL) as client, client.attach_assets(picture):
        result = client.system_one(
            state=f"{picture}What is in the picture?",
            questions={
                "bright": Noul(instructions="Is the picture bright?"),
                "tone": Choice(instructions="Which tone?", criteria={"calm": None, "busy": None}),
            },
        )
    want = by_json.json()["answers"]
    assert result.nouls["bright"].noul == pytest.approx(want["bright"]["noul"], abs=1e-12)
    assert result.choices["tone"].probabilities == pytest.approx(want["tone"]["probabilities"], abs=1e-12)
    assert result.usage.input_tokens == by_json.json()["usage"]["input_tokens"]


def test_bad_media_is_400_and_the_sdk_raises_it(server: str) -> None:
    from typesafe_sdk import TypeSafeBadRequestError

    with (
        TypeSafeClient(api_key="unused", base_url=server, model=MODEL) as client,
        pytest.raises(TypeSafeBadRequestError, match="not an image in a supported format"),
    ):
        client.system_one(state=Image(b"%PDF-1.7 not a picture"), questions={"q": Noul(instructions="Is it?")})
    got = httpx.post(
        f"{server}/v1/decisions",
        json={"state": "x", "questions": QUESTIONS, "videos": [data_url(PNG, "video/mp4")]},
        timeout=60,
    )
    assert got.status_code == 400 and got.json()["error"]["message"].startswith("videos[0]: not a video")


def test_through_the_front_a_multipart_body_reaches_the_worker_as_json(package: Path) -> None:
    with running_front(str(package), "--platform", "cpu", "--result-cache-entries", "0") as front:
        video = {"state": "A short clip.", "questions": QUESTIONS, "videos": [video_url(5, 8, 48, 40)]}
        got = httpx.post(f"{front.base}/v1/decisions", json=video, timeout=120)
        assert got.status_code == 200, got.text
        picture = Image(PNG)
        with TypeSafeClient(api_key="unused", base_url=front.base, model=MODEL) as client:
            result = client.system_one(state=picture, questions={"bright": Noul(instructions="Is the picture bright?")})
        direct = httpx.post(
            f"{front.base}/v1/decisions",
            json={"state": "", "questions": {"bright": QUESTIONS["bright"]}, "images": [data_url(PNG, "image/png")]},
            timeout=60,
        )
        assert result.nouls["bright"].noul == pytest.approx(direct.json()["answers"]["bright"]["noul"], abs=1e-12)


# ---- answers against transformers, through the real process -----------------------------------------
TOL = 1e-4
BRIGHT = {"bright": QUESTIONS["bright"]}
EXACT = {"profile": "exact"}  # one row a question: text rows in the text lane, media rows in the media lane
IMAGE_PNG = image_bytes(41, 72, 50)
VIDEO_MP4 = video_bytes(42, frames=20, width=56, height=40)  # 2.5 s at 8 a second: 5 frames read, 6 with the last
TEXTS = ["The sky is clear and the sun is out.", "A dark room with the lights off."]


def _noul(server: str, body: dict[str, Any]) -> float:
    got = httpx.post(f"{server}/v1/decisions", json=body, timeout=120)
    assert got.status_code == 200, got.text
    return float(got.json()["answers"]["bright"]["noul"])


class Reference:
    """transformers' P(Yes) for the noul question BRIGHT about a state: the prompt written here from the
    package's template (srun.json), tokenized by transformers' tokenizer, the image's pixels from
    transformers' PIL image processor, the video's from our decoder (its pixels are transformers' bit for
    bit: tests/unit/test_qwen_vision_pixels.py) with the timestamps transformers' processor writes."""

    def __init__(self, package: Path) -> None:
        import torch
        from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

        self.torch = torch
        self.model = Qwen3_5ForConditionalGeneration.from_pretrained(package, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(package)
        self.package = package
        template = json.loads((package / "srun.json").read_text())["prompt_template"]
        self.state_part = template["state"].replace("{bos}", "").replace("{system}", template["system"])
        self.question_part = template["question"].replace("{question}", "Question: {q}\nAnswer with Yes or No.")

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def image(self, data: bytes) -> tuple[str, dict[str, Any]]:
        import io

        from PIL import Image as PILImage
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        processor = Qwen2VLImageProcessorPil.from_pretrained(self.package)
        got = processor(images=[PILImage.open(io.BytesIO(data))], return_tensors="pt")
        tokens = int(got["image_grid_thw"].prod()) // processor.merge_size**2
        text = "<|vision_start|>" + "<|image_pad|>" * tokens + "<|vision_end|>"
        return text, {"pixel_values": got["pixel_values"], "image_grid_thw": got["image_grid_thw"]}

    def video(self, data: bytes) -> tuple[str, dict[str, Any]]:
        from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

        from vllm_srun.adapters.families.decision_vision import video_limits
        from vllm_srun.adapters.media.decoder import PillowAvDecoder
        from vllm_srun.adapters.media.qwen_vision import VisionPreprocess
        from vllm_srun.adapters.models.qwen3_5_vision import VisionConfig, patchify

        spec = VisionPreprocess.from_folder(self.package)
        clip = PillowAvDecoder().clip(data, video_limits(spec), spec)
        tower = VisionConfig.from_dict(self.model.config.vision_config.to_dict())
        rows = patchify(self.torch.from_numpy(clip.pixels.copy()), tower)
        t, h, w = spec.grid("video", clip.pixels.shape)
        merge = tower.merge
        times = Qwen3VLProcessor._calculate_timestamps(None, list(clip.times), 1.0, 2)  # type: ignore[arg-type]
        per_group = h * w // merge**2
        text = "".join(
            f"<{s:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_group + "<|vision_end|>" for s in times
        )
        return text, {"pixel_values_videos": rows, "video_grid_thw": self.torch.tensor([[t, h, w]])}

    def prompt(self, state: str, media: tuple[tuple[str, dict[str, Any]], ...], question: str) -> tuple[list[int], int]:
        """The ids of a noul QUESTION about STATE and MEDIA, and how many of them are the state's."""
        state_ids = self._ids(self.state_part.replace("{state}", "".join(text for text, _ in media) + state))
        return state_ids + self._ids(self.question_part.replace("{q}", question)), len(state_ids)

    def noul(self, state: str, media: tuple[tuple[str, dict[str, Any]], ...] = (), question: str = "") -> float:
        torch, cfg = self.torch, self.model.config
        ids, _ = self.prompt(state, media, question or BRIGHT["bright"]["instructions"])
        kinds = [1 if i == cfg.image_token_id else 2 if i == cfg.video_token_id else 0 for i in ids]
        extra = {k: v for _, inputs in media for k, v in inputs.items()}
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([kinds]), **extra).logits
        yes, no = (self._ids(word)[0] for word in ("Yes", "No"))
        return float(torch.softmax(logits[0, -1, [yes, no]].double(), dim=0)[0])


@pytest.fixture(scope="module")
def reference(package: Path) -> Reference:
    return Reference(package)


def test_an_image_and_a_video_question_equal_transformers_alone_and_among_text_rows(
    server: str, reference: Reference
) -> None:
    image, video = reference.image(IMAGE_PNG), reference.video(VIDEO_MP4)
    bodies = [
        {"state": "What is in the picture?", "images": [data_url(IMAGE_PNG, "image/png")]},
        {"state": "A short clip.", "videos": [data_url(VIDEO_MP4, "video/mp4")]},
        *({"state": text} for text in TEXTS),
    ]
    want = [
        reference.noul("What is in the picture?", (image,)),
        reference.noul("A short clip.", (video,)),
        *(reference.noul(text) for text in TEXTS),
    ]
    bodies = [{**body, "questions": BRIGHT, "options": EXACT} for body in bodies]
    alone = [_noul(server, body) for body in bodies]

    async def together() -> list[httpx.Response]:  # media and text rows in the same planning rounds
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/decisions", json=b) for b in bodies * 3))

    mixed = [float(r.json()["answers"]["bright"]["noul"]) for r in asyncio.run(together())]
    gaps = [abs(a - w) for a, w in zip(alone, want, strict=True)]
    print(f"served vs transformers: image {gaps[0]:.1e}, video {gaps[1]:.1e}, text {max(gaps[2:]):.1e}")
    assert max(gaps) <= TOL, (alone, want)
    assert max(abs(m - a) for m, a in zip(mixed, alone * 3, strict=True)) <= TOL, (mixed, alone)


def test_a_state_with_media_runs_once_under_shared_context(server: str, reference: Reference) -> None:
    nouls = {"bright": "Is the picture bright?", "moving": "Does anything move?"}
    state = "What is in the picture?"
    body = {
        "state": state,
        "questions": {name: {"type": "noul", "instructions": text} for name, text in nouls.items()},
        "images": [data_url(IMAGE_PNG, "image/png")],
        "videos": [data_url(VIDEO_MP4, "video/mp4")],
    }
    media = (reference.image(IMAGE_PNG), reference.video(VIDEO_MP4))
    prompts = [reference.prompt(state, media, text) for text in nouls.values()]
    state_tokens = prompts[0][1]
    once = state_tokens + sum(len(ids) - state_tokens for ids, _ in prompts)  # the state counted once
    want = {name: reference.noul(state, media, text) for name, text in nouls.items()}
    asked = {}
    for profile in ("exact", "shared_context"):
        options = {"profile": profile, "return_meta": True}
        got = httpx.post(f"{server}/v1/decisions", json={**body, "options": options}, timeout=120)
        assert got.status_code == 200, got.text
        asked[profile] = got.json()
    exact, shared = asked["exact"], asked["shared_context"]
    assert exact["meta"]["rows"] == len(nouls) and shared["meta"]["rows"] == 1
    assert shared["usage"]["input_tokens"] == exact["usage"]["input_tokens"] == once
    gap = max(abs(shared["answers"][n]["noul"] - exact["answers"][n]["noul"]) for n in nouls)
    to_reference = max(abs(shared["answers"][n]["noul"] - want[n]) for n in nouls)
    print(
        f"shared vs unshared (image + video state): {gap:.1e}, shared vs transformers {to_reference:.1e}; "
        f"input_tokens {once} (state {state_tokens}) both"
    )
    assert gap <= TOL and to_reference <= TOL


def test_the_docs_image_example_runs_as_written(server: str, tmp_path: Path) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(IMAGE_PNG)
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "decision_image.py"
    done = subprocess.run(
        [sys.executable, str(example), server, MODEL, str(picture)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("outdoors: P(yes) = 0.") and "input tokens: " in done.stdout
    broken = tmp_path / "broken.png"
    broken.write_bytes(IMAGE_PNG[:40])  # a truncated picture: one line, the status and why
    refused = subprocess.run(
        [sys.executable, str(example), server, MODEL, str(broken)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1 and refused.stderr.startswith("400: images[0]"), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
