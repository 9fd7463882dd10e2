"""One model's forwards on the device thread at their declared thread count, with the adaptive
learner's warm-up rerun and shadow forwards (R-CPU-2).

`ForwardRunner.run(batch, payloads)` is what the scheduler loop calls on the device thread:
1. it asks the learner (`domain/worker/adaptive_threads.py`) how this forward runs (`ThreadPlan`),
   declares the serving count in the process's `ThreadContext` and runs the forward (timed);
2. when the plan says so, it queues, on the same device thread and right behind this forward
   (so the requests are answered first and the next forward waits for it), the warm-up rerun at
   the configured count and the shadow forwards at other counts: each is timed and compared bit
   for bit with the served answer, and the learner is told.
The served answer is always the one computed at the plan's serving count; a shadow's answer is
never returned. Without a learner (adaptive threads off, an engine that fixes its own threads,
a GPU) a forward only declares the configured count (when there is one), or, where the runtime
found the model's answers the same bits at both counts (`same_answers_at`),
the LONE count (the worker's whole budget) when no other forward of the device runs as it starts:
with `--concurrent-forwards N` a request alone would otherwise run on one of N teams while the
others idle (R-CPU-1). A forward that starts while another runs takes its own team as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import LoadedModel, ThreadContext
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.worker.adaptive_threads import Phase, ThreadLearner, ThreadPlan

log = logging.getLogger("vllm_srun.forward_threads")

RunLane = Callable[[str, Sequence[Any]], Sequence[Any]]
Enqueue = Callable[..., Any]  # queue a call on the device thread, behind the running one
ShadowObserver = Callable[[int, bool], None]  # (thread count, matched)


def same_bits(a: Any, b: Any) -> bool:
    """Two forward outputs hold the same bits: arrays by dtype, shape and bytes; lists and tuples
    element by element; anything else by equality."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    return bool(a == b)


LONE_ENV = "VLLM_SRUN_LONE_FORWARD"  # 0: a lone forward keeps its team's count (A/B)


def lone_forward_off(env: Mapping[str, str]) -> str | None:
    """Why a lone forward may not widen by configuration (None: it may)."""
    value = env.get(LONE_ENV, "").strip().lower()
    return f"turned off ({LONE_ENV}={env[LONE_ENV]})" if value in ("0", "off", "false", "no") else None


def same_answers_at(model: LoadedModel, declare: Callable[[int], None], counts: Sequence[int]) -> bool | None:
    """Whether MODEL answers its probe rows, each alone and all together, with the same bits at
    every thread count of COUNTS (declared on the calling device thread; the first again at the
    end); None when the family offers no probe rows."""
    rows = model.probe_payloads()
    if not rows:
        return None
    lane = model.lanes[0].name
    answers = []
    try:
        for count in counts:
            declare(count)
            answers.append([*(model.run(lane, [row])[0] for row in rows), *model.run(lane, rows)])
    finally:
        declare(counts[0])
    first, *others = answers
    return all(same_bits(first, other) for other in others)


def lone_forward_threads(
    model: LoadedModel,
    context: ThreadContext | None,
    *,
    team: int | None,
    budget: int | None,
    workers: int,
    learning: bool,
    deterministic: bool,
    call: Callable[..., Any],
    env: Mapping[str, str],
) -> tuple[int | None, str | None]:
    """The count a forward alone on the device runs on (BUDGET), or None and why not: only with
    concurrent forwards (WORKERS > 1) on teams smaller than the budget, no adaptive learner (it
    times one count at a time), no `--deterministic` (one thread count), and the model's answers
    checked the same bits at both counts (`same_answers_at`, run on the device thread by CALL)."""
    if context is None or team is None or budget is None or workers < 2:
        return None, "one forward at a time, or no CPU thread count"
    if budget <= team:
        return None, f"a forward's team already has the whole budget ({budget})"
    why = lone_forward_off(env)
    if why is None and learning:
        why = "adaptive threads time one count at a time"
    if why is None and deterministic:
        why = "--deterministic answers at one thread count"
    if why is not None:
        return None, why
    same = call(same_answers_at, model, context.declare, [team, budget])
    if not same:
        return None, f"answers differ between {team} and {budget} threads" if same is False else "no probe rows"
    return budget, None


class ForwardRunner:
    def __init__(
        self,
        run: RunLane,
        *,
        context: ThreadContext | None,
        configured: int | None,
        learner: ThreadLearner | None,
        clock: Clock,
        enqueue: Enqueue | None = None,
        on_shadow: ShadowObserver | None = None,
        why_not_adaptive: str | None = None,
        lone: int | None = None,
        busy: Callable[[], int] | None = None,
        why_not_lone: str | None = None,
    ) -> None:
        if learner is not None and (context is None or configured is None or enqueue is None):
            raise ValueError("an adaptive learner needs a thread context, a configured count and a device queue")
        self._run = run
        self.context = context
        self.configured = configured
        self.learner = learner
        self._clock = clock
        self._enqueue = enqueue
        self._on_shadow = on_shadow
        self.why_not_adaptive = why_not_adaptive
        if lone is not None and (learner is not None or context is None or busy is None):
            raise ValueError("a lone-forward count needs a thread context, the device's busy count and no learner")
        self.lone = lone
        self._busy = busy
        self.why_not_lone = why_not_lone
        self.lone_forwards = 0  # forwards that ran on the LONE count

    def _declare(self, threads: int | None) -> None:
        if self.context is not None and threads is not None:
            self.context.declare(threads)

    def run(self, batch: ForwardBatch, payloads: list[Any]) -> Sequence[Any]:
        learner = self.learner
        if learner is None:
            self._declare(self._count_now())
            return self._run(batch.lane, payloads)
        plan = learner.plan(batch.tokens, self._clock.now())
        self._declare(plan.serve)
        started = self._clock.now()
        outputs = self._run(batch.lane, payloads)
        learner.served(batch.tokens, plan.serve, self._clock.now() - started)
        if plan.warm_up or plan.shadows:
            assert self._enqueue is not None
            self._enqueue(self._explore, batch, payloads, outputs, plan)
        return outputs

    def _count_now(self) -> int | None:
        """The count a forward starting now runs on: LONE when it is the device's only call."""
        if self.lone is not None and self._busy is not None and self._busy() <= 1:
            self.lone_forwards += 1
            return self.lone
        return self.configured

    def _explore(self, batch: ForwardBatch, payloads: list[Any], served: Sequence[Any], plan: ThreadPlan) -> None:
        """The warm-up rerun and the shadows of one served forward (on the device thread)."""
        learner = self.learner
        assert learner is not None and self.configured is not None
        try:
            if plan.warm_up:
                self._declare(self.configured)
                learner.warmed_up(same_bits(self._run(batch.lane, payloads), served), self._clock.now())
            for count in plan.shadows:
                if learner.phase is not Phase.LEARNING:
                    break
                self._declare(count)
                started = self._clock.now()
                shadow = self._run(batch.lane, payloads)
                seconds = self._clock.now() - started
                matched = same_bits(shadow, served)
                learner.shadow(batch.tokens, count, seconds, matched)
                if self._on_shadow is not None:
                    self._on_shadow(count, matched)
                if not matched:
                    log.warning("adaptive threads stopped: %s", learner.reason)
        except Exception:  # a shadow that fails never fails a request; it ends the learning
            log.exception("a shadow forward failed; adaptive threads stop")
            learner.stop("a shadow forward failed")

    def golden_done(self, status: str) -> None:
        """R-CPU-2: exploration starts only after the golden check passed (`matched`)."""
        if self.learner is None:
            return
        if status == "matched":
            self.learner.golden_passed()
        else:
            self.learner.golden_not_passed(status)

    def card(self, budget: int | None, wait_policy: str | None) -> dict[str, Any]:
        """The card's `threads` entry: the configured count, the budget, the OpenMP wait policy
        and the adaptive learner's table."""
        adaptive: dict[str, Any]
        if self.learner is not None:
            adaptive = self.learner.table()
        else:
            adaptive = {"mode": 0, "phase": "off", "reason": self.why_not_adaptive}
        lone = {"threads": self.lone, "forwards": self.lone_forwards, "reason": self.why_not_lone}
        return {
            "forward": self.configured,
            "budget": budget,
            "omp_wait_policy": wait_policy,
            "adaptive": adaptive,
            "lone_forward": lone,
        }
