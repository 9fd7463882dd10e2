"""Server-Timing's seven phases (parse, tokenize, queue, forward, post, serialize, total) come
from the marks a request's serving sets (`RequestTiming`); a phase whose marks were not set is 0."""

from __future__ import annotations

import re

from vllm_srun.adapters.request_timing import RequestTiming

PHASES = ["parse", "tokenize", "queue", "forward", "post", "serialize", "total"]


def test_the_phases_come_from_the_marks() -> None:
    t = RequestTiming(start=100.0, parse_ms=2.0, queue_ms=3.0, forward_ms=4.0)
    t.admitted, t.run_start, t.run_end = 100.003, 100.010, 100.020
    t.encode_start, t.encode_end = 100.025, 100.026
    phases = t.phases(now=100.030)
    assert list(phases) == PHASES
    assert abs(phases["tokenize"] - 7.0) < 1e-6  # admitted → its rows' submit
    assert abs(phases["post"] - 5.0) < 1e-6  # its rows back → the answer built
    assert abs(phases["serialize"] - 1.0) < 1e-6 and abs(phases["total"] - 30.0) < 1e-6
    assert (phases["parse"], phases["queue"], phases["forward"]) == (2.0, 3.0, 4.0)


def test_a_cache_hit_is_all_tokenize_and_an_error_has_no_post() -> None:
    hit = RequestTiming(start=10.0, parse_ms=1.0)
    hit.encode_start, hit.encode_end = 10.005, 10.006
    assert abs(hit.phases(now=10.007)["tokenize"] - 4.0) < 1e-6 and hit.phases(now=10.007)["post"] == 0.0
    failed = RequestTiming(start=10.0, parse_ms=1.0)  # refused while it was prepared
    assert {k: v for k, v in failed.phases(now=10.002).items() if k != "total"} == {
        "parse": 1.0,
        "tokenize": 0.0,
        "queue": 0.0,
        "forward": 0.0,
        "post": 0.0,
        "serialize": 0.0,
    }


def test_the_header_lists_every_phase_in_order() -> None:
    header = RequestTiming().header()
    assert [m.group(1) for m in re.finditer(r"(\w+);dur=\d+\.\d{3}", header)] == PHASES
