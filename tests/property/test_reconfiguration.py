"""R-REP-2 reconfiguration: a worker whose key is still wanted keeps its identity, equal keys pair
in declared order, every current worker is kept once or retired, and a wanted key is started
new only when no worker with it is left."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.fleet.reconfiguration import match_replicas

KEYS = st.sampled_from(["cpu", "cuda:0", "cuda:1", ("endpoint", "m")])


@given(current=st.lists(KEYS, max_size=8), wanted=st.lists(KEYS, max_size=8))
def test_matching_keeps_what_it_can_and_retires_the_rest(current: list[object], wanted: list[object]) -> None:
    workers = [(f"w{i}", key) for i, key in enumerate(current)]
    key_of = dict(workers)
    match = match_replicas(workers, wanted)
    assert len(match.kept) == len(wanted)
    kept = [worker for worker in match.kept if worker is not None]
    assert sorted(kept + list(match.retired)) == sorted(key_of)  # each current worker once
    for worker, key in zip(match.kept, wanted):
        assert worker is None or key_of[worker] == key
    # as many kept per key as both sides have: nothing restarted that could have stayed
    have, want = Counter(current), Counter(wanted)
    assert Counter(key_of[w] for w in kept) == have & want
    assert match.started == len(wanted) - len(kept)
    # equal keys pair in declared order: the kept ones are the first workers of their key
    for key in want:
        mine = [w for w, k in workers if k == key]
        assert [w for w in kept if key_of[w] == key] == mine[: min(have[key], want[key])]
    assert list(match.retired) == [w for w, _ in workers if w not in kept]


def test_the_seed_examples() -> None:
    # add a replica, remove one, change the model (every key changes)
    assert match_replicas([("a/0", "cpu")], ["cpu", "cpu"]).kept == ("a/0", None)
    shrink = match_replicas([("a/0", "cpu"), ("a/1", "cpu")], ["cpu"])
    assert shrink.kept == ("a/0",) and shrink.retired == ("a/1",)
    changed = match_replicas([("a/0", ("m1", "cpu"))], [("m2", "cpu")])
    assert changed.kept == (None,) and changed.retired == ("a/0",) and changed.started == 1
