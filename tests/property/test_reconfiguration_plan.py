"""R-REP-2, a whole config: `plan_reconfiguration` keeps every worker it can, retires each other
current worker once (those of removed deployments too), keeps a deployment as it is only when
nothing about it changed, and carries the reference card and front cache over only with a kept
worker."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.fleet.reconfiguration import CachePlan, Deployed, Wanted, plan_reconfiguration

KEYS = st.sampled_from(["cpu", "cuda:0", ("endpoint", "m")])
CONFIGS = st.sampled_from(["v1", "v2"])
DEPLOYMENTS = st.sampled_from(["a", "b", "c"])


@st.composite
def current_deployments(draw: st.DrawFn) -> dict[str, Deployed[str]]:
    names = draw(st.lists(DEPLOYMENTS, unique=True, max_size=3))
    out: dict[str, Deployed[str]] = {}
    for name in names:
        keys = draw(st.lists(KEYS, min_size=1, max_size=4))
        workers = tuple((f"{name}/{i}", key) for i, key in enumerate(keys))
        out[name] = Deployed(draw(CONFIGS), workers, has_cache=len(keys) == 1)
    return out


WANTED = st.dictionaries(
    DEPLOYMENTS, st.builds(Wanted, CONFIGS, st.lists(KEYS, min_size=1, max_size=4).map(tuple)), max_size=3
)


@given(current=current_deployments(), wanted=WANTED)
def test_every_current_worker_is_kept_once_or_retired(
    current: dict[str, Deployed[str]], wanted: dict[str, Wanted]
) -> None:
    plan = plan_reconfiguration(current, wanted)
    assert list(plan.changes) == list(wanted) and set(plan.removed) == set(current) - set(wanted)
    everyone = [worker for deployed in current.values() for worker, _ in deployed.workers]
    kept = [worker for change in plan.changes.values() for worker in change.kept]
    assert sorted(kept + list(plan.retired)) == sorted(everyone)
    assert plan.started == sum(len(w.keys) for w in wanted.values()) - len(kept)
    for name, change in plan.changes.items():
        mine = dict(current[name].workers) if name in current else {}
        assert all(worker in mine for worker in change.kept)  # a worker stays in its own deployment
        for worker, key in zip(change.match.kept, wanted[name].keys):
            assert worker is None or mine[worker] == key
        assert name not in plan.added or not change.kept


@given(current=current_deployments(), wanted=WANTED)
def test_unchanged_reference_and_cache(current: dict[str, Deployed[str]], wanted: dict[str, Wanted]) -> None:
    plan = plan_reconfiguration(current, wanted)
    for name, change in plan.changes.items():
        before = current.get(name)
        same = (
            before is not None
            and before.config == wanted[name].config
            and Counter(key for _, key in before.workers) == Counter(wanted[name].keys)
        )
        assert change.unchanged == same  # the same workers wanted again (in any order): nothing to do
        assert change.keeps_reference == bool(change.kept)
        if len(wanted[name].keys) != 1:
            assert change.cache is CachePlan.NONE
        else:
            kept_cache = before is not None and before.has_cache and len(change.kept) == 1
            assert change.cache is (CachePlan.KEEP if kept_cache else CachePlan.NEW)


def test_examples() -> None:
    current = {"a": Deployed("v1", (("a/0", "cpu"),), has_cache=True), "gone": Deployed("v1", (("gone/0", "cpu"),))}
    plan = plan_reconfiguration(current, {"a": Wanted("v1", ("cpu", "cpu")), "new": Wanted("v1", ("cpu",))})
    grown, new = plan.changes["a"], plan.changes["new"]
    assert grown.kept == ("a/0",) and not grown.unchanged and grown.cache is CachePlan.NONE
    assert new.cache is CachePlan.NEW and not new.keeps_reference and plan.added == ("new",)
    assert plan.retired == ("gone/0",) and plan.started == 2
    same = plan_reconfiguration(current, {"a": Wanted("v1", ("cpu",))}).changes["a"]
    assert same.unchanged and same.cache is CachePlan.KEEP
    edited = plan_reconfiguration(current, {"a": Wanted("v2", ("cpu",))}).changes["a"]
    assert not edited.unchanged and edited.kept == ("a/0",) and edited.cache is CachePlan.KEEP
