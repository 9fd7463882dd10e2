"""The engine plugins this package registers (entry points of group `vllm_srun.engines`).

- `native`: our torch code; encoders run unpadded with the oneDNN fast path where it is measured
  safe and faster (`native.py`), decoders eager (`native_decoder.py`); on GPUs both take fused
  Triton kernels at the forward sizes where they were measured faster (`gpu_kernels.py`,
  `triton_encoder.py`, `triton_decoder.py`); dual encoders (the multimodal family's CLIP and
  SigLIP) run eager (`native_dual.py`), and so do audio encoders (`native_audio.py`);
- `onnxruntime`: ONNX Runtime for encoders (`onnxruntime.py`), on the CPU or a GPU's execution provider.
  What it refuses whatever the model is its own to say (`settings_refusal`: dtype auto only, no
  `--deterministic`), as is what it lacks on a device (`device_refusal`); no other module tests an
  engine's name against it.

Each plugin imports its engine module only when it builds, so `--engine native` never imports
onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_srun.adapters.contracts import (
    Device,
    Engine,
    EngineRefused,
    EngineRequest,
    EngineSettings,
    Progress,
    SettingRefusal,
)

if TYPE_CHECKING:
    from vllm_srun.adapters.models.audio_arch import AudioNetwork
    from vllm_srun.adapters.models.decoder import DecoderLM
    from vllm_srun.adapters.models.dual_encoder import DualEncoder
    from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder


def encoder_model(request: EngineRequest) -> ReferenceEncoder:
    """REQUEST's model as the encoder family's loaded model (`models/reference_encoder.py`: the
    encoder module of `models/encoder_arch.EncoderModule`, its head, pooling and quantization), or
    EngineRefused in one line when an encoder request carries something else."""
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder

    if not isinstance(request.model, ReferenceEncoder):
        raise EngineRefused(f"an encoder engine serves a ReferenceEncoder, not a {type(request.model).__name__}")
    return request.model


def decoder_model(request: EngineRequest) -> DecoderLM | Qwen35LM:
    """REQUEST's model as the decision family's decoder LM (`models/decoder.DecoderLM`, or the
    Qwen3.5 backbone `models/qwen3_5.Qwen35LM` with or without its vision tower), or EngineRefused."""
    from vllm_srun.adapters.models.decoder import DecoderLM
    from vllm_srun.adapters.models.qwen3_5 import Qwen35LM

    if not isinstance(request.model, DecoderLM | Qwen35LM):
        raise EngineRefused(f"a decoder engine serves a DecoderLM or a Qwen35LM, not a {type(request.model).__name__}")
    return request.model


def dual_encoder_model(request: EngineRequest) -> DualEncoder:
    """REQUEST's model as the multimodal family's dual encoder (`models/dual_encoder.DualEncoder`),
    or EngineRefused."""
    from vllm_srun.adapters.models.dual_encoder import DualEncoder

    if not isinstance(request.model, DualEncoder):
        raise EngineRefused(f"a dual-encoder engine serves a DualEncoder, not a {type(request.model).__name__}")
    return request.model


def audio_model(request: EngineRequest) -> AudioNetwork:
    """REQUEST's model as the audio family's network (`models/audio_arch.AudioNetwork`: Whisper's
    encoder, CLAP), or EngineRefused."""
    from vllm_srun.adapters.models.audio_arch import AudioNetwork

    if not isinstance(request.model, AudioNetwork):
        raise EngineRefused(f"an audio-encoder engine serves an AudioNetwork, not a {type(request.model).__name__}")
    return request.model


def use_threads(threads: int | None) -> None:
    """Build (and time kernels) on THREADS intra-op threads: the device thread builds the engine.
    Every forward then declares its own count in the process's thread context (`threads.py`)."""
    if threads:
        from vllm_srun.adapters.engines.threads import TorchThreadContext

        TorchThreadContext().declare(threads)


class NativePlugin:
    name = "native"

    def build(self, request: EngineRequest, progress: Progress) -> Engine:
        if request.kind in ("encoder", "decoder", "dual_encoder", "audio_encoder"):
            use_threads(request.threads)
        if request.kind == "encoder":
            from vllm_srun.adapters.engines.native import native_encoder

            return native_encoder(
                encoder_model(request),
                request.device,
                progress,
                largest_forward_tokens=request.largest_forward_tokens,
                cache_dir=request.cache_dir,
                deterministic=request.deterministic,
                prefer_invariant=request.prefer_invariant,
            )
        if request.kind == "decoder":
            from vllm_srun.adapters.engines.native_decoder import native_decoder

            return native_decoder(decoder_model(request), request.device, progress)
        if request.kind == "dual_encoder":
            from vllm_srun.adapters.engines.native_dual import NativeDualEncoder

            return NativeDualEncoder(dual_encoder_model(request))
        if request.kind == "audio_encoder":
            from vllm_srun.adapters.engines.native_audio import NativeAudioEncoder

            return NativeAudioEncoder(audio_model(request))
        raise EngineRefused(f"the native engine has no forward for {request.kind} models")


class OnnxRuntimePlugin:
    name = "onnxruntime"

    def settings_refusal(self, settings: EngineSettings) -> SettingRefusal | None:
        """ONNX Runtime serves a float32 graph (ours, exported, or the package's), so it runs only
        dtype auto; its CPU kernels were not shown to give a row the same bits in any batch."""
        if settings.deterministic:
            return SettingRefusal(
                "deterministic",
                "the onnxruntime engine cannot answer bit-identically in any batch; use --engine native",
            )
        if settings.dtype != "auto":
            return SettingRefusal("dtype", "the onnxruntime engine runs only dtype auto")
        return None

    def device_refusal(self, device: Device) -> str | None:
        """What this process's onnxruntime lacks to run on DEVICE (checked before any weights load)."""
        from vllm_srun.adapters.engines.onnxruntime import providers_for

        try:
            providers_for(device)
        except EngineRefused as exc:
            return str(exc)
        return None

    def build(self, request: EngineRequest, progress: Progress) -> Engine:
        if request.kind != "encoder":
            raise EngineRefused(f"the onnxruntime engine serves encoder models only (this is a {request.kind} model)")
        refusal = self.settings_refusal(EngineSettings(deterministic=request.deterministic))
        if refusal is not None:  # the CLIs refuse it before any load; a container built in code, here
            raise EngineRefused(refusal.reason)
        model = encoder_model(request)
        if model.quantization is not None:  # an int8 package (engines/cpu_int8.py)
            raise EngineRefused(
                "the onnxruntime engine does not serve int8 packages (vllm-srun quantize); use --engine native"
            )
        use_threads(request.threads)  # torch pools a package graph's hidden states
        from vllm_srun.adapters.engines.onnxruntime import onnx_encoder

        return onnx_encoder(
            model,
            device=request.device,
            threads=request.threads,
            progress=progress,
            onnx_file=request.package_graph,
            cache_dir=request.cache_dir,
            package_sha256=request.package_sha256,
        )
