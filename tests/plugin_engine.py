"""`acme`: an engine plugin of another distribution (registered by `tests/plugin_dist.py`, entry
point group `vllm_srun.engines`), the way a package that tunes an engine would ship one: it serves
encoder models by wrapping our native engine under its own name, and says what it refuses before
anything loads (`SettingsPreflight`: dtype auto or float32 only, no `--deterministic`;
`DevicePreflight`: CPUs only), so a test can tell its refusals from anyone else's.
"""

from __future__ import annotations

from typing import Any

from vllm_srun.adapters.contracts import (
    Batch,
    BatchOutputs,
    Device,
    EncoderEngine,
    EngineRefused,
    EngineRequest,
    EngineSettings,
    Progress,
    SettingRefusal,
    as_encoder_engine,
)
from vllm_srun.adapters.engines.plugins import NativePlugin

NAME = "acme"


class AcmeEngine:
    """The native encoder engine under the name `acme` (the card's `engine`)."""

    name = NAME

    def __init__(self, inner: EncoderEngine) -> None:
        self.inner = inner

    @property
    def accounting(self) -> Any:
        return self.inner.accounting

    @property
    def kernel_switch_tokens(self) -> int | None:
        return self.inner.kernel_switch_tokens

    @property
    def forward_threads(self) -> bool:
        return self.inner.forward_threads

    @property
    def determinism(self) -> Any:
        return None  # acme promises no bit-identical answers (its plugin refuses --deterministic)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "acme": {"wraps": self.inner.name}}

    def forward(self, batch: Batch) -> BatchOutputs:
        """One planned forward (`contracts/batch.py`): the rows and what each asks in, one output per row out."""
        return self.inner.forward(batch)


class AcmeEnginePlugin:
    """Entry point `acme` of group `vllm_srun.engines`."""

    name = NAME

    def settings_refusal(self, settings: EngineSettings) -> SettingRefusal | None:
        if settings.deterministic:
            return SettingRefusal("deterministic", "the acme engine promises no bit-identical answers")
        if settings.dtype not in ("auto", "float32"):
            return SettingRefusal("dtype", "the acme engine runs float32 only (dtype auto or float32)")
        return None

    def device_refusal(self, device: Device) -> str | None:
        return None if device.kind == "cpu" else f"the acme engine runs on CPUs only (device {device.name})"

    def build(self, request: EngineRequest, progress: Progress) -> AcmeEngine:
        if request.kind != "encoder":
            raise EngineRefused(f"the acme engine serves encoder models only (this is a {request.kind} model)")
        progress("load: the acme engine wraps the native one")
        return AcmeEngine(as_encoder_engine(NativePlugin().build(request, progress)))
