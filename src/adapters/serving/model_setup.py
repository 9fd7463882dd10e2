"""What loading builds for a model to serve with (`loader.py`): one immutable record (`Serving`:
its plugins, batching limits, media loader, forward setup, calibration, what the probe found and
the profile it serves, `settled_profile`), replaced whole at each step that adds to it, never
edited; and how its forwards run (`ForwardSetup`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vllm_srun.adapters.contracts import Determinism, Device, LoadedModel, MediaLoader, Numerics
from vllm_srun.adapters.serving.forward_threads import ForwardRunner
from vllm_srun.domain.settings.dtypes import auto_dtype
from vllm_srun.domain.settings.engine_args import BatchingLimits, EngineArgs
from vllm_srun.domain.settings.profiles import Profile, precision_is_published, serving_profile


@dataclass(frozen=True, slots=True)
class ForwardSetup:
    """How a model's forwards run (R-CPU-1, R-CPU-2): its runner (thread counts, adaptive
    learner) and the worker's thread settings the card reports."""

    runner: ForwardRunner
    thread_budget: int | None = None
    wait_policy: str | None = None
    concurrent_forwards: int = 1  # forwards of this model that may run at once (R-CPU-1)
    forward_nice: int = 0  # the forward threads' nice increment over the event loop's (R-CPU-1)
    express_forward: bool = False  # the lightest tenant's next turn may run beside the busy slots (R-FAIR-7)
    lane_yield: bool = False  # a slot's costlier-lane forward pauses for lane express forwards (R-BAT-6)

    def card(self) -> dict[str, Any]:
        return {
            **self.runner.card(self.thread_budget, self.wait_policy),
            "concurrent_forwards": self.concurrent_forwards,
            "forward_nice": self.forward_nice,
            "express_forward": self.express_forward,
            "lane_yield": self.lane_yield,
        }


@dataclass(frozen=True, slots=True)
class Serving:
    """What a loaded model serves with. Loading builds it (`Loader._load`, `loader.py`) and publishes a new
    one at each step that adds to it (the forward setup; R-DEV-2's calibrated budget)."""

    plugins: tuple[dict[str, str], ...]  # the family and engine plugins in use
    limits: BatchingLimits
    media: MediaLoader | None = None  # set for a model that reads images or videos (R-MEDIA)
    forwards: ForwardSetup | None = None
    calibration: dict[str, Any] | None = None  # R-DEV-2 on a GPU worker: the figures, or why not
    batch_invariant: bool = False  # what the batch-invariance probe found (R-BAT-5)
    determinism: Determinism | None = None  # `--deterministic` in force: how the engine honours it
    profile: Profile | None = None  # R-PROF-3: the profile it serves, settled at the load (None: not yet)
    published: bool = True  # it computes in its published precision (else exact is not answerable, R-PROF-4)

    @property
    def numerics(self) -> Numerics:
        """What the model's answers promise (the card's and `meta`'s `numerics`)."""
        return Numerics.promised(self.batch_invariant, self.determinism)

    def but(self, **changes: Any) -> Serving:
        """A copy with CHANGES (the record itself never changes)."""
        return replace(self, **changes)


def settled_profile(args: EngineArgs, model: LoadedModel, device: Device) -> tuple[Profile, bool]:
    """The profile a loaded model serves (R-PROF-3), and whether it computes in its published
    precision: its `profile`, or when unset the least one its settings ask for, a precision other
    than the published one (R-DT-1) asking for max_speed; ValueError (one line, the model fails to
    load) where a setting contradicts a named profile."""
    published = auto_dtype(model.family, device.name, device.native_dtypes)
    other = not precision_is_published(args.dtype, model.dtype, published)
    try:
        profile = serving_profile(args.profile, args.enable_shared_context, other_precision=other)
        return profile, not other
    except ValueError as exc:
        raise ValueError(
            f"{exc} (the model computes in {model.dtype}; its published precision is {published})"
        ) from None
