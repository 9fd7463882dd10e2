"""The engine <-> model contract of the non-encoder engines is declared, never probed (issue 47
item 3): what each engine plugin narrows `EngineRequest.model` to, and the optional parts of a
model (a text tower, a vision tower, a clip sampler, modalities) read through declared attributes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vllm_srun.adapters.contracts import ClipJob, EngineRefused, EngineRequest, LoadedModel, MediaLimits, quiet
from vllm_srun.adapters.contracts.media import SampledVideo, decode
from vllm_srun.adapters.devices.torch_devices import CpuDevice
from vllm_srun.adapters.engines.native_audio import NativeAudioEncoder
from vllm_srun.adapters.engines.native_decoder import NativeHybridDecoder
from vllm_srun.adapters.engines.plugins import NativePlugin
from vllm_srun.adapters.models.audio_arch import AudioNetwork, AudioNetworkDefaults
from vllm_srun.adapters.models.clap import ClapNetwork
from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
from vllm_srun.adapters.models.qwen3_5_mm import Qwen35VisionLM
from vllm_srun.adapters.models.whisper import WhisperEncoder


class NotAModel:
    pass


@pytest.mark.parametrize(
    ("kind", "wants"),
    [("decoder", "a DecoderLM or a Qwen35LM"), ("dual_encoder", "a DualEncoder"), ("audio_encoder", "an AudioNetwork")],
)
def test_the_native_plugin_refuses_a_model_of_another_type_in_one_line(kind: str, wants: str) -> None:
    with pytest.raises(EngineRefused, match=f"serves {wants}, not a NotAModel$"):
        NativePlugin().build(EngineRequest(kind, NotAModel(), CpuDevice()), quiet)


class AudioTowerOnly(AudioNetworkDefaults, nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)

    def embed_audio(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features.mean(dim=1))


def test_an_audio_network_without_a_text_tower_says_so_and_still_embeds_audio() -> None:
    network = AudioTowerOnly()
    assert isinstance(network, AudioNetwork) and network.has_text_tower is False
    engine = NativeAudioEncoder(network)
    assert engine.embed_audio([np.ones((3, 4), np.float32)]).shape == (1, 2)
    with pytest.raises(ValueError, match=r"^this audio model has no text tower$"):
        engine.embed_text([[1, 2]])


def test_the_audio_networks_declare_their_text_tower() -> None:
    assert WhisperEncoder.has_text_tower is False
    assert ClapNetwork.has_text_tower is True


def test_only_the_vision_lm_reads_media() -> None:
    assert Qwen35LM.reads_media is False
    assert Qwen35VisionLM.reads_media is True


def test_a_text_lm_refuses_media_rows_before_any_forward() -> None:
    lm = Qwen35LM.__new__(Qwen35LM)  # the class's declarations alone: no weights, no forward
    engine = NativeHybridDecoder(lm)
    assert engine.reads_media is False
    with pytest.raises(ValueError, match=r"^this model reads no images or videos$"):
        engine.media_logits([([1, 2], ())])
    with pytest.raises(ValueError, match=r"^this model reads no images or videos$"):
        engine.prefix_kv([1, 2], media=[object()])


class FramesOnly:
    def image(self, data, limits, preprocess):  # type: ignore[no-untyped-def]
        raise AssertionError("not asked")

    def video_frames(self, data, frames, limits, preprocess):  # type: ignore[no-untyped-def]
        raise AssertionError("not asked")


class WithClip(FramesOnly):
    def clip(self, data, limits, preprocess):  # type: ignore[no-untyped-def]
        return SampledVideo(np.zeros((2, 3, 4, 4), np.float32), (0.0, 0.5))


def test_a_clip_job_needs_a_clip_decoder() -> None:
    job = ClipJob(b"video", MediaLimits(max_bytes=10, max_pixels=10), "spec")
    with pytest.raises(TypeError, match=r"^FramesOnly samples no video for a vision-language model$"):
        decode(FramesOnly(), job)
    assert isinstance(decode(WithClip(), job), SampledVideo)


def test_a_loaded_model_reads_text_unless_it_says_otherwise() -> None:
    assert LoadedModel.modalities == frozenset({"text"})
