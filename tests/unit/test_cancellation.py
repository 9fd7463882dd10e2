"""`adapters/cancellation.race`: the work's own outcome, or 499 when the client went away, or 504
at the deadline; a cancellation from outside (shutdown) is never turned into either, and the
task is left as it was found (its cancel count), so later timeouts in it still work."""

from __future__ import annotations

import asyncio

import pytest

from vllm_srun.adapters.cancellation import race
from vllm_srun.domain.errors import Cancelled, DeadlineExceeded


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def forever() -> None:
    await asyncio.Event().wait()


def test_the_work_answers_when_nothing_ends_it() -> None:
    async def main() -> tuple[int, int]:
        async def work() -> int:
            await asyncio.sleep(0)
            return 7

        answer = await race(work, deadline_s=5, disconnected=forever, deadline_message="late")
        task = asyncio.current_task()
        assert task is not None
        return answer, task.cancelling()

    assert run(main()) == (7, 0)


def test_the_works_own_error_passes_unchanged() -> None:
    async def work() -> None:
        await asyncio.sleep(0)
        raise KeyError("its own")

    with pytest.raises(KeyError, match="its own"):
        run(race(work, deadline_s=5, disconnected=None, deadline_message="late"))


def test_the_deadline_cancels_the_work_and_answers_504() -> None:
    seen: list[str] = []

    async def work() -> None:
        try:
            await forever()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> int:
        with pytest.raises(DeadlineExceeded, match="took too long"):
            await race(work, deadline_s=0.01, disconnected=forever, deadline_message="took too long")
        with pytest.raises(TimeoutError):  # the task still times out normally afterwards
            async with asyncio.timeout(0.01):
                await forever()
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert run(main()) == 0
    assert seen == ["cancelled"]


def test_a_client_that_goes_away_cancels_the_work_and_answers_499() -> None:
    async def main() -> tuple[list[str], int]:
        gone = asyncio.Event()
        seen: list[str] = []

        async def work() -> None:
            asyncio.get_running_loop().call_later(0.01, gone.set)
            try:
                await forever()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        with pytest.raises(Cancelled):
            await race(work, deadline_s=None, disconnected=gone.wait, deadline_message="late")
        task = asyncio.current_task()
        assert task is not None
        return seen, task.cancelling()

    assert run(main()) == (["cancelled"], 0)


def test_a_watch_that_fails_says_nothing_about_the_client() -> None:
    async def broken() -> None:
        raise OSError("receive failed")

    async def work() -> str:
        await asyncio.sleep(0.02)
        return "answered"

    assert run(race(work, deadline_s=None, disconnected=broken, deadline_message="late")) == "answered"


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await forever()

        inner = asyncio.ensure_future(race(work, deadline_s=None, disconnected=forever, deadline_message="late"))
        await started.wait()
        inner.cancel()  # the server shuts down
        with pytest.raises(asyncio.CancelledError):
            await inner

    run(main())


def test_outside_cancellation_on_top_of_ours_still_propagates() -> None:
    """Our deadline and a shutdown land together: the shutdown wins (no 504 answered to a
    server that is going away)."""

    async def main() -> None:
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await forever()

        inner = asyncio.ensure_future(race(work, deadline_s=0, disconnected=None, deadline_message="late"))
        await started.wait()
        inner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inner

    run(main())


def test_work_that_turns_our_cancellation_into_its_error_leaves_the_task_as_found() -> None:
    async def main() -> int:
        async def work() -> None:
            try:
                await forever()
            except asyncio.CancelledError:
                raise RuntimeError("rows dropped") from None

        with pytest.raises(RuntimeError, match="rows dropped"):
            await race(work, deadline_s=0.01, disconnected=None, deadline_message="late")
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert run(main()) == 0
