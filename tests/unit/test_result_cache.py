"""R-PERF-3: the bounded LRU (domain) against a simple model, and the canonical request key."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_srun.adapters.schemas.embeddings import EmbeddingsOptions, EmbeddingsRequest
from vllm_srun.adapters.schemas.encoder import EncoderUsage, RerankResponse, RerankResult
from vllm_srun.adapters.serving.result_cache import ResultCache, canonical_request
from vllm_srun.domain.worker.cache import LruCache

ops = st.lists(st.tuples(st.sampled_from(["get", "put"]), st.integers(0, 9), st.integers(0, 40)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 5), max_weight=st.one_of(st.none(), st.integers(1, 100)), script=ops)
def test_lru_matches_a_simple_model(capacity: int, max_weight: int | None, script: list) -> None:  # type: ignore[type-arg]
    cache: LruCache[int] = LruCache(capacity, max_weight=max_weight)
    model: list[tuple[int, int, int]] = []  # (key, value, weight), least recently used first
    for op, key, weight in script:
        found = next((e for e in model if e[0] == key), None)
        if op == "get":
            got = cache.get(key)
            assert got == (found[1] if found and capacity else None)
            if found and capacity:
                model.remove(found)
                model.append(found)
        else:
            stored = cache.put(key, key * 100 + weight, weight)
            if capacity == 0 or (max_weight is not None and weight > max_weight):
                assert not stored
                continue
            if found:
                model.remove(found)
            model.append((key, key * 100 + weight, weight))
            while len(model) > capacity or (max_weight is not None and sum(e[2] for e in model) > max_weight):
                model.pop(0)
        assert len(cache) == len(model) <= capacity
        assert cache.weight == sum(e[2] for e in model)
        assert all(e[0] in cache for e in model)


def test_hits_and_misses_are_counted() -> None:
    cache: LruCache[str] = LruCache(2)
    cache.put("a", "A")
    assert cache.get("a") == "A" and cache.get("b") is None
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_answer_neutral_fields_do_not_change_the_key() -> None:
    plain = EmbeddingsRequest(input="hi")
    same = EmbeddingsRequest(
        input="hi", model="other-name", user="u1", options=EmbeddingsOptions(return_meta=True, deadline_ms=50)
    )
    assert canonical_request(plain) == canonical_request(same)
    assert canonical_request(plain) != canonical_request(EmbeddingsRequest(input="hi", dimensions=8))
    assert canonical_request(plain) != canonical_request(EmbeddingsRequest(input=["hi"]))
    key = ResultCache.key
    assert key("sha-a", "embeddings", plain) != key("sha-b", "embeddings", plain)
    assert key("sha-a", "embeddings", plain) != key("sha-a", "classify", plain)


def test_result_cache_round_trips_answers_and_can_be_off() -> None:
    counted: list[dict] = []  # type: ignore[type-arg]

    class Counter:
        def inc(self, labels: dict) -> None:  # type: ignore[type-arg]
            counted.append(labels)

    answer = RerankResponse(model="m", results=[RerankResult(1, 0.75)], usage=EncoderUsage.of(3), id="x")
    cache = ResultCache(4, Counter())
    assert cache.get("k", "m") is None
    assert cache.put("k", answer)
    assert cache.get("k", "m") == answer
    assert [c["outcome"] for c in counted] == ["miss", "hit"]
    off = ResultCache(0)
    assert not off.enabled and not off.put("k", answer) and off.get("k", "m") is None
