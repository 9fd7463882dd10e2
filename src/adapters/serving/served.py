"""One served model: its package, status, scheduler loop and card (R-API-6).

What loading builds for a model to serve with is one immutable record (`Serving`: its plugins,
batching limits, media loader, forward setup, calibration), replaced whole, never edited. What
stays mutable on `ServedModel` is what changes while it lives: its lifecycle state and reason
(`domain/lifecycle`), the package it resolved to (folder and hash, known before the load), the
loaded model, the golden check's outcome and its running scheduler loop.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from vllm_srun.adapters.call import Call, Disconnected, Held
from vllm_srun.adapters.cancellation import race
from vllm_srun.adapters.contracts import Determinism, LoadedModel, MediaLoader, Numerics
from vllm_srun.adapters.offload import Offload
from vllm_srun.adapters.schemas.common import MAX_INPUTS, ResponseMeta
from vllm_srun.adapters.serving.forward_threads import ForwardRunner
from vllm_srun.adapters.serving.package_facts import PackageFacts, package_facts
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats, SchedulerLoop
from vllm_srun.domain import bounds
from vllm_srun.domain.admission import Admission
from vllm_srun.domain.engine_args import BatchingLimits, EngineArgs
from vllm_srun.domain.errors import DeadlineExceeded, NotReady, RequestTooLarge, UnsupportedSurface
from vllm_srun.domain.lifecycle import ModelState, advance
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.profiles import PROFILES, Profile, answer_numerics, enabled, profile_for, serving_profile
from vllm_srun.domain.rows import RowSpec
from vllm_srun.domain.scheduler import EXPIRED

__all__ = ["Disconnected"]  # the disconnect waiter's type, where the surfaces have long found it
T = TypeVar("T")


ANSWER_FILES = frozenset(
    {
        "config.json",
        "tokenizer.json",
        "preprocessor_config.json",
        "config_sentence_transformers.json",  # prompts
        "colbert_linear.pt",  # multi-vector head (BGE-M3 layout)
        "embedding_ranges.json",  # int8/uint8 calibration ranges
    }
)


def weights_sha256(folder: Path) -> str:
    """Hash of the files that decide the model's answers (weights, config, tokenizer, prompts, a
    ColBERT head, int8 calibration ranges)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in {".safetensors", ".onnx"} or path.name in ANSWER_FILES):
            digest.update(path.name.encode())
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


# the accelerators the project's own test suite runs every model on (the card's `accelerator_validated`)
VALIDATED_ACCELERATORS = frozenset({"cpu"})
ACCELERATORS = ("cpu", "cuda", "rocm", "mps")


def accelerator_of(device: str) -> str | None:
    """The accelerator kind of a device name (`cuda:1` → `cuda`); None for `auto` or a plugin's."""
    kind = device.split(":", 1)[0]
    return kind if kind in ACCELERATORS else None


def package_date(folder: Path) -> str:
    """The package's date (its config.json's, UTC, YYYY-MM-DD): the `release_date` clients list."""
    try:
        stamp = (folder / "config.json").stat().st_mtime
    except OSError:
        return ""
    return datetime.fromtimestamp(stamp, tz=UTC).date().isoformat()


class TokenBudget:
    """The tokens one request's rows may hold (`max_request_tokens`), spent as it is prepared:
    413 as soon as the total passes the limit, before the rest is tokenized or any row runs."""

    def __init__(self, limit: int, model: str) -> None:
        self.limit = limit
        self.model = model
        self.spent = 0

    def spend(self, tokens: int) -> None:
        self.spent += tokens
        if self.spent > self.limit:
            raise RequestTooLarge(
                f"the request needs more than {self.limit} tokens (max_request_tokens of model {self.model!r}); "
                "send fewer or shorter inputs"
            )


async def until_deadlines(
    rows: Sequence[RowSpec],
    deadline_ms: float | Sequence[float | None] | None,
    spent: float,
    submit: Callable[[list[RowSpec], list[float | None]], Awaitable[ForwardStats]],
    disconnected: Disconnected | None,
) -> ForwardStats:
    """ROWS run by SUBMIT(rows, seconds each may wait) with their deadlines (DEADLINE_MS: one for
    all, or one per row; ms since the request arrived, SPENT seconds ago): a row whose deadline
    passed already is not submitted, and every row not started by its deadline answers `EXPIRED`
    (R-API-10). A client that goes away cancels them (`race`)."""
    per_row = list(deadline_ms) if isinstance(deadline_ms, Sequence) else [deadline_ms] * len(rows)
    left = [None if ms is None else ms / 1000 - spent for ms in per_row]
    live = [i for i, seconds in enumerate(left) if seconds is None or seconds > 0]
    if not live:
        return ForwardStats((EXPIRED,) * len(rows), 0.0, 0.0, 0, 0)
    stats = await race(
        lambda: submit([rows[i] for i in live], [left[i] for i in live]),
        deadline_s=None,
        disconnected=disconnected,
        deadline_message="",
    )
    if len(live) == len(rows):
        return stats
    outputs: list[Any] = [EXPIRED] * len(rows)
    for at, i in enumerate(live):
        outputs[i] = stats.outputs[at]
    return replace(stats, outputs=tuple(outputs))


def _pending_golden() -> dict[str, Any]:
    return {"status": "pending", "checked": 0, "matched": 0, "reason": None}


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

    def card(self) -> dict[str, Any]:
        return {
            **self.runner.card(self.thread_budget, self.wait_policy),
            "concurrent_forwards": self.concurrent_forwards,
            "forward_nice": self.forward_nice,
            "express_forward": self.express_forward,
        }


@dataclass(frozen=True, slots=True)
class Serving:
    """What a loaded model serves with. Loading builds it (`Runtime._load`) and publishes a new
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


@dataclass
class ServedModel:
    name: str
    artifact: str
    args: EngineArgs
    device: str
    engine: str = bounds.ENGINE.default  # `--engine` or its models file entry's: a plugin's name, or auto
    cache: ResultCache | None = None  # the worker's result cache (R-PERF-3), shared by its models
    status: ModelState = ModelState.STARTING  # its step in `domain/lifecycle` (only `become` changes it)
    reason: str | None = None
    folder: Path | None = None
    model: LoadedModel | None = None
    scheduler_loop: SchedulerLoop | None = None
    serving: Serving | None = None  # what loading built for it to serve with
    sha256: str | None = None
    golden: dict[str, Any] = field(default_factory=_pending_golden)
    admission: Admission | None = None  # R-ADM-1: its unanswered requests and tokens
    clock: Clock | None = None
    max_request_tokens: int = bounds.MAX_REQUEST_TOKENS.default
    offload: Offload | None = None  # where large requests are prepared (None: on the loop)
    # a models file entry's upstream fields (`ModelSpec`): the Hub commit asked for, the family
    # forced, the memory budget and the family's options
    revision: str | None = None
    family: str | None = None
    memory_budget_gib: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    _facts: PackageFacts | None = field(default=None, init=False, repr=False)  # read once, from `folder`

    @property
    def limits(self) -> BatchingLimits | None:
        return self.serving.limits if self.serving is not None else None

    @property
    def media(self) -> MediaLoader | None:
        return self.serving.media if self.serving is not None else None

    @property
    def forward_runner(self) -> ForwardRunner | None:
        forwards = self.serving.forwards if self.serving is not None else None
        return forwards.runner if forwards is not None else None

    @property
    def target(self) -> str:
        """What the model store resolves: the artifact, at its Hub revision when it has one."""
        return f"{self.artifact}@{self.revision}" if self.revision else self.artifact

    @property
    def ready(self) -> bool:
        return self.status is ModelState.READY

    def become(self, state: ModelState, reason: str | None = None) -> None:
        """Take a step of the lifecycle (IllegalTransition: one it does not allow); REASON: why it failed."""
        self.status = advance(self.status, state)
        if reason is not None:
            self.reason = reason

    @contextmanager
    def admitted(self, call: Call, requests: int, tokens: int) -> Iterator[Call]:
        """Hold REQUESTS requests of TOKENS (an upper bound) for CALL's tenant until the block
        ends, or raise `Overloaded` (R-ADM-1, R-FAIR-4); the block gets CALL holding the ticket.
        Leaving the block normally counts them as answered work. Rows it runs (`run`) are
        scheduled for its tenant (R-FAIR-1), and from the first of them on the ticket holds their
        counted tokens instead of the bound."""
        admission, clock = self.admission, self.clock
        if admission is None or clock is None:
            yield call
            return
        ticket = admission.admit(requests, tokens, clock.now(), call.tenant)
        answered = False
        try:
            yield call.holding(Held(admission, ticket))
            answered = True
        finally:
            admission.release(ticket, clock.now(), answered=answered)

    def require_surface(self, surface: str, call: Call) -> LoadedModel:
        """The model, when it is ready (or warming and CALL is its golden check's replay) and lists SURFACE."""
        checking = self.status is ModelState.WARMING and call.replay
        if self.model is None or not (self.ready or checking):
            raise NotReady(f"model {self.name!r} is {self.status}" + (f": {self.reason}" if self.reason else ""))
        if surface not in self.model.surfaces:
            raise UnsupportedSurface(
                f"model {self.name!r} does not serve {surface} (it serves {', '.join(sorted(self.model.surfaces))})"
            )
        return self.model

    async def prepare(self, call: Call, fn: Callable[..., T], *args: Any) -> T:
        """FN(*ARGS), the CPU work of preparing CALL's request: off the event loop when it is large."""
        return fn(*args) if self.offload is None else await self.offload.run(fn, *args, size=call.body_bytes)

    def token_budget(self) -> TokenBudget:
        return TokenBudget(self.max_request_tokens, self.name)

    async def run(
        self,
        rows: Sequence[RowSpec],
        call: Call,
        *,
        profile: Profile | None = None,
        expire_rows: bool = False,
        row_deadlines: Sequence[float | None] | None = None,
    ) -> ForwardStats:
        """The rows' outputs once CALL's last row ran; drops them on its deadline or disconnect.
        Its tenant and priority (None: the scheduler's choice, interactive unless the rows are
        more than one forward) decide when its rows run among the others' (R-FAIR-2/3). PROFILE
        (None: the serving one) decides whether its rows may share forwards with other requests'
        rows (R-PROF-2). Its deadline counts from its arrival. EXPIRE_ROWS (R-API-10): the deadline
        fails nothing; a row not started by it (ROW_DEADLINES: one per row instead, in ms from the
        arrival) is not run and its output is `EXPIRED`. Without it a passed deadline fails the
        whole request (`DeadlineExceeded`, 504)."""
        loop = self.scheduler_loop
        assert loop is not None
        timing = call.timing
        if timing is not None and not timing.run_start:  # the end of its `tokenize` phase
            timing.run_start = time.perf_counter()
        held = call.held
        if held is not None and held.admission is self.admission:  # its real tokens, no longer the body's bound
            held.admission.count_rows(held.ticket, sum(spec.tokens for spec in rows))
        exact = not (profile or self.profile).coalesces
        if expire_rows:
            spent = time.perf_counter() - timing.start if timing is not None else 0.0
            deadline_ms = call.deadline_ms if row_deadlines is None else row_deadlines
            stats = await until_deadlines(
                rows,
                deadline_ms,
                spent,
                lambda live, seconds: loop.submit(live, call, exact=exact, deadlines=seconds),
                call.disconnected,
            )
            if timing is not None:
                timing.queue_ms = stats.queue_s * 1000
                timing.forward_ms = stats.forward_s * 1000
            return stats
        assert row_deadlines is None, "a deadline per row needs expire_rows"
        deadline_ms, deadline_s = call.deadline_ms, None
        if deadline_ms is not None:  # counted from the request's arrival: its preparation took part of it
            spent = time.perf_counter() - timing.start if timing is not None else 0.0
            deadline_s = deadline_ms / 1000 - spent
            if deadline_s <= 0:
                raise DeadlineExceeded(f"no answer within options.deadline_ms={deadline_ms:g} (spent preparing it)")
        stats = await race(
            lambda: loop.submit(rows, call, exact=exact),
            deadline_s=deadline_s,
            disconnected=call.disconnected,
            deadline_message=f"no answer within options.deadline_ms={deadline_ms:g}" if deadline_ms else "",
        )
        if timing is not None:  # a bundle's models each set them: the last answered's stay
            timing.queue_ms = stats.queue_s * 1000
            timing.forward_ms = stats.forward_s * 1000
            timing.run_end = time.perf_counter()  # its `post` phase starts
        return stats

    @property
    def facts(self) -> PackageFacts | None:
        """The package's manifest hash, origin and weight count (`package_facts.py`), once resolved."""
        if self._facts is None and self.folder is not None:
            self._facts = package_facts(self.folder, self.artifact)
        return self._facts

    @property
    def accelerator(self) -> str | None:
        """The accelerator the model runs on (`cpu`, `cuda`, `rocm`, `mps`): its device's kind."""
        return self.model.device.kind if self.model is not None else accelerator_of(self.device)

    @property
    def profile(self) -> Profile:
        """The profile the model serves (R-PROF-3): settled at its load (an unset profile becomes
        max_speed where `--dtype` asks for another precision), else the one its settings ask for."""
        if self.serving is not None and self.serving.profile is not None:
            return self.serving.profile
        try:
            return serving_profile(self.args.profile, self.args.enable_shared_context)
        except ValueError:  # refused before any load (`ModelArgs.problems`); exact until then
            return PROFILES["exact"]

    @property
    def profiles(self) -> tuple[Profile, ...]:
        """The profiles a request may ask for (R-PROF-4): exact, then the serving one."""
        return enabled(self.profile, self.serving is None or self.serving.published)

    def profile_for(self, asked: str | None) -> Profile:
        """A request's profile (`options.profile`; None: the serving one); 400 `invalid_request`
        naming the enabled ones for any other name (R-PROF-4)."""
        return profile_for(asked, self.profile, self.serving is None or self.serving.published)

    def profile_fields(self) -> dict[str, Any]:
        """The card's `profile` (the serving one) and `profiles` (the enabled ones, R-PROF)."""
        return {"profile": self.profile.name, "profiles": [p.card() for p in self.profiles]}

    def meta(self, stats: ForwardStats | None, rows: int, profile: Profile | None = None) -> ResponseMeta:
        """`meta` of an answer (R-API-8); no stats: answered from the result cache. PROFILE (None:
        the serving one): the profile it was computed under, and what that promises (`numerics`)."""
        model, serving = self.model, self.serving
        assert model is not None and serving is not None
        profile = profile or self.profile
        numerics = answer_numerics(profile, serving.batch_invariant, serving.determinism is not None)
        facts = self.facts
        forward_ms = round(stats.forward_s * 1000, 3) if stats is not None else 0.0
        return ResponseMeta(
            numerics=numerics,
            dtype=model.dtype,
            device=model.device.name,
            engine=model.engine.name,
            queue_ms=round(stats.queue_s * 1000, 3) if stats is not None else 0.0,
            forward_ms=forward_ms,
            forwards=stats.forwards if stats is not None else 0,
            rows=rows if stats is not None else 0,
            padded_tokens=stats.padded_tokens if stats is not None else 0,
            cache_hit=stats is None,
            model_id=self.name,
            revision=facts.revision if facts is not None else None,
            model_sha256=self.sha256,
            profile=profile.name,
            accelerator=model.device.kind,
            compute_ms=forward_ms,
        )

    def card(self) -> dict[str, Any]:
        model, serving = self.model, self.serving
        limits = self.limits
        promise = serving if model is not None and serving is not None else None  # the probe's, once loaded
        facts = self.facts
        accelerator = self.accelerator
        card: dict[str, Any] = {
            "id": self.name,
            "object": "model",
            "owned_by": "vllm-srun",
            "artifact": self.artifact,
            "family": model.family if model else None,
            "surfaces": sorted(model.surfaces) if model else [],
            "repo": facts.repo if facts else None,
            "revision": facts.revision if facts else None,
            "model_sha256": self.sha256,
            "manifest_sha256": facts.manifest_sha256 if facts else None,
            "parameters": facts.parameters if facts else None,
            "licence": facts.licence if facts else None,
            "package_date": package_date(self.folder) if self.folder is not None else None,
            "dtype": model.dtype if model else self.args.dtype,
            "device": self.device,
            "accelerator": accelerator,
            "accelerator_validated": accelerator in VALIDATED_ACCELERATORS,
            "engine": model.engine.name if model else None,
            **self.profile_fields(),
            "numerics": promise.numerics if promise else None,
            # R-BAT-5: how many counted tokens a merged forward of an exact model may hold
            "merged_forward_tokens": model.invariant_tokens if model and promise and promise.batch_invariant else None,
            "engine_args": {
                "max_num_seqs": limits.max_num_seqs if limits else self.args.max_num_seqs,
                "max_num_seqs_source": limits.seqs_source if limits else None,
                "max_num_batched_tokens": limits.max_num_batched_tokens if limits else self.args.max_num_batched_tokens,
                "max_num_batched_tokens_source": limits.tokens_source if limits else None,
                "memory_class": limits.memory_class if limits else None,  # R-DEV-1: the row unset limits came from
                "calibration": self.serving.calibration if self.serving else None,  # R-DEV-2: GPU workers only
                "batch_window_ms": self.args.batch_window_ms,
                "dtype": self.args.dtype,
                # the value in force: a decision model's (family default on), False for families without the path
                "enable_shared_context": model.enable_shared_context if model else self.args.enable_shared_context,
                "max_model_len": self.args.max_model_len,
            },
            # the input budget (upstream's deployment `input`): most tokens an input may have (None: the
            # model's limit) and the overflow a request gets when it sets none
            "input": {"max_tokens": self.args.input_max_tokens, "overflow": self.args.input_overflow},
            "limits": {
                "max_input_tokens": model.max_input_tokens if model else None,
                "max_inputs": MAX_INPUTS,
                "max_request_tokens": self.max_request_tokens,
            },
            "caps": [
                {
                    "lane": lane.name,
                    "accounting": lane.accounting.value,
                    "cap_tokens": lane.cap_tokens,
                    "cap_seconds": lane.cap_seconds,
                }
                for lane in (model.lanes if model else ())
            ],
            "admission": (
                {
                    "max_queue": self.admission.limits.max_queue,
                    "max_queued_tokens": self.admission.limits.max_queued_tokens,
                }
                if self.admission is not None
                else None
            ),
            "golden": dict(self.golden),
            "plugins": list(self.serving.plugins) if self.serving else [],
            "status": self.status.value,
            "reason": self.reason,
            "ready": self.ready,
            "created": int(time.time()),
        }
        if self.serving is not None and self.serving.forwards is not None:
            card["threads"] = self.serving.forwards.card()
        if promise is not None and promise.determinism is not None:
            card["deterministic"] = {"method": promise.determinism}
        if model is not None:
            section = dict(model.card_section())
            card["limits"].update(section.pop("limits", None) or {})  # a family's own limits (options, levels, images)
            card.update(section)
            for head in card.get("heads") or ():  # how a request that sets no overflow reads a long input
                head["overflow"] = self.args.input_overflow
                if self.args.input_overflow == "window":  # one window as long as an input may be, no overlap
                    most = min(self.args.input_max_tokens or model.max_input_tokens, model.max_input_tokens)
                    head["window"] = {"tokens": most, "overlap": 0}
        if self.media is not None:
            card["media"] = {**card.get("media", {}), **self.media.card()}
        return card
