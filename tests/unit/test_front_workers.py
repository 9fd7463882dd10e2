"""The front's pure helpers: restart backoff, worker command lines, card compatibility, CPU
budget from cgroup files, body rewriting and outcome mapping (R-REP-1/2/4, R-CPU-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.front import bodies
from vllm_srun.adapters.front.proxy import outcome_of
from vllm_srun.adapters.http.request_body import decode_document
from vllm_srun.adapters.workers.command import worker_settings
from vllm_srun.adapters.workers.compat import calibrated_limits, card_problem, pick_card
from vllm_srun.adapters.workers.cpu_budget import managed_worker_threads, quota_cpus
from vllm_srun.domain.errors import InvalidRequest
from vllm_srun.domain.fleet.replicas import Outcome
from vllm_srun.domain.fleet.restarts import RestartBackoff
from vllm_srun.domain.worker.threads import InvalidThreadOverride


# ---- restart backoff ---------------------------------------------------------------------------
def test_restart_delay_doubles_to_a_cap_and_resets_after_a_stable_run() -> None:
    backoff = RestartBackoff()
    delays = [backoff.next_delay(started_at=0.0, died_at=1.0) for _ in range(9)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff.next_delay(started_at=0.0, died_at=61.0) == 1  # it ran 61 s: stable
    assert backoff.next_delay(started_at=100.0, died_at=100.5) == 2


def test_restart_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RestartBackoff(initial_s=0)
    with pytest.raises(ValueError):
        RestartBackoff(initial_s=5, max_s=1)


# ---- worker command lines --------------------------------------------------------------------
def test_worker_settings_pass_only_what_the_deployment_sets() -> None:
    plain = worker_settings(DeploymentConfig(artifact="m"), device="cpu", uds="/s/w0.sock", threads=3)
    argv = plain.to_argv()  # flags in the settings record's order
    # a CPU replica says so: the worker's own default is `--device auto` (the best device present)
    assert argv[:2] == ["serve", "m"] and sorted(argv[2:]) == [
        "--device=cpu",
        "--log-level=warning",
        "--threads=3",
        "--uds=/s/w0.sock",
    ]
    assert plain.problems() == []
    full = DeploymentConfig(
        artifact="m",
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        batch_window_ms=0.0,
        dtype="float32",
        max_model_len=512,
        result_cache_entries=0,
        engine="native",
        enable_shared_context=False,
        max_request_tokens=9000,
        max_queue=32,
        max_queued_tokens=70000,
    )
    args = worker_settings(full, device="cuda:1", uds="/s/w1.sock", threads=3, max_request_bytes=1000).to_argv()
    text = " ".join(args)
    assert "--device=cuda:1" in args
    assert "--engine=native --max-num-seqs=64 --max-num-batched-tokens=4096 --batch-window-ms=0 --dtype=float32" in text
    assert "--no-enable-shared-context --max-model-len=512" in text and "--result-cache-entries=0" in args
    assert {"--max-request-tokens=9000", "--max-queue=32", "--max-queued-tokens=70000"} <= set(args)
    assert not any(arg.startswith("--threads") for arg in args)  # a GPU worker: R-CPU-1 is about CPU workers
    assert f"--max-request-bytes={1000 + 64 * 1024}" in args


def test_worker_settings_the_worker_would_refuse_are_named() -> None:
    # a DeploymentConfig built in code is not validated; the settings still are
    odd = DeploymentConfig(artifact="-m", batch_window_ms=20_000.0, max_num_batched_tokens=4)
    settings = worker_settings(odd, device="cpu", uds="/s/w0.sock", threads=0)
    assert settings.problems() == [
        "model '-m': a model is named by a non-empty string that does not start with '-'",
        "max_num_batched_tokens must be >= 8 (got 4)",
        "batch_window_ms must be between 0 and 10000 (got 20000.0)",
        "threads must be >= 1 (got 0)",
    ]


# ---- card compatibility (R-REP-2) ---------------------------------------------------------------
def card(**changes: object) -> dict:
    base = {
        "id": "tiny",
        "model_sha256": "abc",
        "revision": None,
        "family": "encoder",
        "surfaces": ["embeddings"],
        "dtype": "float32",
        "engine_args": {
            "max_num_seqs": 8192,
            "max_num_seqs_source": "class",
            "max_num_batched_tokens": 65536,
            "max_num_batched_tokens_source": "class",
            "batch_window_ms": 2.0,
            "dtype": "auto",
            "enable_shared_context": None,
            "max_model_len": None,
        },
        "limits": {"max_input_tokens": 128},
    }
    for key, value in changes.items():
        if key in base["engine_args"]:
            base["engine_args"][key] = value
        else:
            base[key] = value
    return base


def test_unset_batch_limits_may_differ_but_set_ones_are_pinned() -> None:
    unset = DeploymentConfig(artifact="m")
    assert card_problem(card(max_num_batched_tokens=12288), unset, card()) is None
    pinned = DeploymentConfig(artifact="m", max_num_batched_tokens=65536)
    assert card_problem(card(), pinned, None) is None
    problem = card_problem(card(max_num_batched_tokens=12288), pinned, card())
    assert problem == "reports max_num_batched_tokens 12288 but the deployment sets 65536"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_sha256": "other"}, "model_sha256"),
        ({"surfaces": ["classify"]}, "surfaces"),
        ({"batch_window_ms": 0.0}, "engine_args.batch_window_ms"),
        ({"limits": {"max_input_tokens": 64}}, "limits"),
    ],
)
def test_everything_else_must_match_the_reference(change: dict, field: str) -> None:
    problem = card_problem(card(**change), DeploymentConfig(artifact="m"), card())
    assert problem is not None and problem.startswith(field)


def test_pick_card_and_calibrated_limits() -> None:
    cards = [card(id="a"), card(id="b")]
    assert pick_card(cards, "b")["id"] == "b"
    assert pick_card(cards, None) is None and pick_card(cards[:1], None)["id"] == "a"
    assert calibrated_limits(card())["max_num_batched_tokens_source"] == "class"
    assert calibrated_limits(None) == {}


# ---- CPU budget (R-CPU-1) -------------------------------------------------------------------------
def test_quota_is_read_from_cgroup_v2_then_v1(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert quota_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quota_cpus(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("400000")
    (v1 / "cpu.cfs_period_us").write_text("100000")
    assert quota_cpus(tmp_path) == 4.0


def test_worker_threads_follow_the_budget_and_the_override(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU
    assert managed_worker_threads({}, tmp_path) == 1
    assert managed_worker_threads({"VLLM_SRUN_CPU_THREADS": "8"}, tmp_path) == 1  # capped by the budget
    with pytest.raises(InvalidThreadOverride):
        managed_worker_threads({"VLLM_SRUN_CPU_THREADS": "lots"}, tmp_path)


# ---- bodies ------------------------------------------------------------------------------------------
def parse_body(raw: bytes) -> dict:
    return decode_document(raw, None, 1 << 20)[0]


def test_bodies_are_read_and_renamed_without_touching_the_rest() -> None:
    raw = b'{"model":"primary","input":["a"],"options":{"deadline_ms":50,"return_meta":true}}'
    doc = parse_body(raw)
    assert bodies.requested_model(doc) == "primary" and bodies.deadline_ms(doc) == 50.0
    assert bodies.wants_meta(doc)
    sent = parse_body(bodies.for_worker(doc, raw, "tiny", must_name=False))
    assert sent == {**doc, "model": "tiny"}
    unnamed = b'{"input":"a"}'
    assert bodies.for_worker(parse_body(unnamed), unnamed, "tiny", must_name=False) is unnamed
    assert parse_body(bodies.for_worker({"input": "a"}, unnamed, "m", must_name=True))["model"] == "m"
    answer = b'{"data":[{"model":"tiny"}],"model":"tiny"}'
    assert parse_body(bodies.for_client(answer, "tiny", "primary")) == {
        "data": [{"model": "tiny"}],
        "model": "primary",
    }
    error = b'{"error":{"code":"x","message":"y"}}'
    assert bodies.for_client(error, "tiny", "primary") is error
    # a decisions answer's further states name the model too (the contract's DecisionStateResponse)
    states = b'{"model":"tiny","answers":{},"states":{"s":{"model":"tiny","answers":{"q":{"noul":0.5}}}}}'
    assert parse_body(bodies.for_client(states, "tiny", "primary")) == {
        "model": "primary",
        "answers": {},
        "states": {"s": {"model": "primary", "answers": {"q": {"noul": 0.5}}}},
    }


@pytest.mark.parametrize("raw", [b"", b"[1]", b'{"a":', b"\xff"])
def test_a_body_that_is_not_a_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        parse_body(raw)


def test_cache_key_ignores_answer_neutral_fields() -> None:
    a = bodies.cache_key("/v1/embeddings", {"model": "x", "user": "u", "input": "t", "options": {"deadline_ms": 5}})
    b = bodies.cache_key("/v1/embeddings", {"input": "t"})
    assert a == b
    assert a != bodies.cache_key("/v1/classify", {"input": "t"})
    assert a != bodies.cache_key("/v1/embeddings", {"input": "t", "options": {"overflow": "truncate"}})


@pytest.mark.parametrize(
    "status, outcome",
    [
        (200, Outcome.OK),
        (400, Outcome.OK),
        (404, Outcome.OK),
        (429, Outcome.REJECTED),
        (503, Outcome.REJECTED),
        (504, Outcome.TIMEOUT),
        (500, Outcome.FAILED),
        (502, Outcome.FAILED),
    ],
)
def test_worker_answers_map_to_outcomes(status: int, outcome: Outcome) -> None:
    assert outcome_of(status) is outcome
