"""The per-model settings (`ModelArgs`: what a models file entry, a deployment and the worker's
flags may set for each model) and a deployment's serving settings (`ServingArgs`: those and what
its workers take besides), declared once (`declarations.declare`). None means "not set": the
worker's flag for a models file entry, the worker's default for a deployment or a flag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from vllm_srun.adapters.config.declarations import S, Settings, declare, or_default
from vllm_srun.domain.scheduling.admission import AdmissionLimits
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.settings.profiles import settings_refusal

# msgspec reads a Literal's values at run time: the bounds module's choices, stated once there.
# A type checker cannot read them, so it sees the fields as strings.
if TYPE_CHECKING:
    Dtype = str
    Overflow = str
    ProfileChoice = str
else:
    Dtype = Literal[bounds.DTYPE.choices]
    Overflow = Literal[bounds.INPUT_OVERFLOW.choices]
    ProfileChoice = Literal[bounds.PROFILE.choices]

_ENGINE_ARGS = EngineArgs()  # the domain's defaults


class ModelArgs(Settings, frozen=True, kw_only=True):
    """What each model may set for itself: in a models file entry, a deployment and (as every
    entry's default) the worker's flags. None: not set."""

    engine: Annotated[str, declare(bounds.ENGINE, "the runtime engine")] | None = None
    family: (
        Annotated[
            str,
            declare(
                bounds.FAMILY,
                "the family that reads the package, instead of the detected one; refused when it cannot read it",
                shown="detected from the package",
            ),
        ]
        | None
    ) = None
    max_num_seqs: (
        Annotated[
            int,
            declare(bounds.MAX_NUM_SEQS, "most rows in one forward; 1 runs every row alone", shown="by device class"),
        ]
        | None
    ) = None
    max_num_batched_tokens: (
        Annotated[
            int, declare(bounds.MAX_NUM_BATCHED_TOKENS, "most counted tokens in one forward", shown="by device class")
        ]
        | None
    ) = None
    batch_window_ms: (
        Annotated[float, declare(bounds.BATCH_WINDOW_MS, "milliseconds the first queued row waits for company")] | None
    ) = None
    dtype: (
        Annotated[
            Dtype,
            declare(
                bounds.DTYPE,
                "the precision the model computes in; auto: the package's, FP32 for a BF16 model on a CPU",
            ),
        ]
        | None
    ) = None
    profile: (
        Annotated[
            ProfileChoice,
            declare(
                bounds.PROFILE,
                "what the model may trade for speed: exact (every answer its row's alone, published "
                "precision), shared_context, batching or max_speed; requests may still ask for exact",
                shown="exact, unless enable_shared_context or a dtype other than the published asks for more",
            ),
        ]
        | None
    ) = None
    memory_budget_gib: (
        Annotated[
            float,
            declare(
                bounds.MEMORY_BUDGET_GIB,
                "GiB a model's weights may hold at the precision it computes in; a larger one is refused "
                "before its weights are read, naming both figures",
                shown="none",
            ),
        ]
        | None
    ) = None
    enable_shared_context: (
        Annotated[
            bool,
            declare(
                bounds.ENABLE_SHARED_CONTEXT,
                "decision models: run a multi-question request's state once (a spelling of profile shared_context)",
                shown="off: on under profiles shared_context and max_speed",
            ),
        ]
        | None
    ) = None
    max_model_len: (
        Annotated[
            int,
            declare(
                bounds.MAX_MODEL_LEN,
                "decision models: most input tokens one question's prompt may have",
                shown="the package's limit",
            ),
        ]
        | None
    ) = None
    # the input budget, written `input: {max_tokens, overflow}` in a config or models file
    input_max_tokens: (
        Annotated[
            int,
            declare(
                bounds.INPUT_MAX_TOKENS,
                "most tokens one input may have (classify, embeddings, rerank, decisions)",
                shown="the model's own limit",
            ),
        ]
        | None
    ) = None
    input_overflow: (
        Annotated[
            Overflow,
            declare(
                bounds.INPUT_OVERFLOW,
                "what is done with a longer input when the request does not say (embeddings: window is reject)",
            ),
        ]
        | None
    ) = None
    max_queue: (
        Annotated[
            int,
            declare(
                bounds.MAX_QUEUE, "unanswered requests one model may hold; past it: 429 overloaded with Retry-After"
            ),
        ]
        | None
    ) = None
    max_queued_tokens: (
        Annotated[
            int,
            declare(
                bounds.MAX_QUEUED_TOKENS,
                "tokens of the unanswered requests one model may hold, counted as request-body bytes "
                "(an upper bound); applies only while a request is pending",
            ),
        ]
        | None
    ) = None

    def problems(self) -> list[str]:
        """One line per refused value, and a profile its other settings contradict (R-PROF-3)."""
        refusal = settings_refusal(self.profile, self.enable_shared_context)
        return super().problems() + ([refusal] if refusal else [])

    def engine_args(self) -> EngineArgs:
        """The domain's engine arguments: the set values, the domain's defaults for the rest."""
        default = _ENGINE_ARGS
        return EngineArgs(
            max_num_seqs=or_default(self.max_num_seqs, default.max_num_seqs),
            max_num_batched_tokens=or_default(self.max_num_batched_tokens, default.max_num_batched_tokens),
            batch_window_ms=or_default(self.batch_window_ms, default.batch_window_ms),
            dtype=or_default(self.dtype, default.dtype),
            enable_shared_context=or_default(self.enable_shared_context, default.enable_shared_context),
            max_model_len=or_default(self.max_model_len, default.max_model_len),
            input_max_tokens=or_default(self.input_max_tokens, default.input_max_tokens),
            input_overflow=or_default(self.input_overflow, default.input_overflow),
            profile=or_default(self.profile, default.profile),
        )

    def admission(self) -> AdmissionLimits:
        """The domain's admission limits (R-ADM-1)."""
        return AdmissionLimits(
            or_default(self.max_queue, bounds.MAX_QUEUE.default),
            or_default(self.max_queued_tokens, bounds.MAX_QUEUED_TOKENS.default),
        )

    def over(self: S, base: ModelArgs) -> S:
        """These settings, each one left unset taken from BASE (a models file entry over the flags)."""
        inherited = {name: getattr(base, name) for name in ModelArgs.__struct_fields__ if getattr(self, name) is None}
        return msgspec.structs.replace(self, **inherited)

    def model_args(self) -> ModelArgs:
        """Just the per-model settings of a larger record."""
        return ModelArgs(**{name: getattr(self, name) for name in ModelArgs.__struct_fields__})


_MIB = bounds.MIB
_RESULT_CACHE_HELP = (
    f"answers kept in the LRU result cache, at most {bounds.RESULT_CACHE_BYTES // _MIB} MiB of them; 0 turns it off"
)


class ServingArgs(ModelArgs, frozen=True, kw_only=True):
    """What a deployment sets for its workers besides the per-model settings (and what the worker
    takes as flags)."""

    result_cache_entries: Annotated[int, declare(bounds.RESULT_CACHE_ENTRIES, _RESULT_CACHE_HELP)] | None = None
    media_workers: (
        Annotated[
            int,
            declare(
                bounds.MEDIA_WORKERS,
                "processes that decode and resize images and videos (R-MEDIA); 0 decodes in the request path",
                shown="one per 16 CPUs of the budget, 1 to 4",
            ),
        ]
        | None
    ) = None
    max_request_tokens: (
        Annotated[
            int,
            declare(
                bounds.MAX_REQUEST_TOKENS,
                "most tokens the rows of one request may hold (inputs, windows or questions together); 413 past it",
                shown="524288 (2,048 inputs of 256 tokens)",
            ),
        ]
        | None
    ) = None

    def serving_args(self) -> ServingArgs:
        """Just the serving settings of a larger record (a deployment's, for its workers)."""
        return ServingArgs(**{name: getattr(self, name) for name in ServingArgs.__struct_fields__})
