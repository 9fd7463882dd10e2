"""`vllm-srun serve --models FILE` (R-ARG, R-ADM-1): per-model served name, device, engine
arguments and admission limits; every problem one line, exit 2, before anything loads; refused
together with MODEL arguments."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.server import running_server
from tests.integration.serving import serving
from vllm_srun.adapters.config.model_args import ModelArgs
from vllm_srun.adapters.config.models_file import load_models_file
from vllm_srun.adapters.config.schema import ConfigError
from vllm_srun.app.cli import build_parser, main, model_specs, serve_settings
from vllm_srun.domain.scheduling.admission import AdmissionLimits
from vllm_srun.domain.settings.dtypes import dtype_refusal
from vllm_srun.domain.settings.engine_args import EngineArgs


def refusal_lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_every_problem_is_one_line_and_nothing_loads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text(
        "models:\n"
        "  - artifact: a\n"
        "    max_num_seqs: 0\n"
        "    colour: red\n"
        "  - name: b\n"
        "  - artifact: c\n"
        "    dtype: fp8\n"
        "    device: gpu\n"
    )
    lines = refusal_lines(capsys, "--models", str(bad))
    assert lines == [
        f"vllm-srun: error: {bad}: models[0].max_num_seqs: expected an integer >= 1, got 0",
        f"vllm-srun: error: {bad}: models[0].colour: unknown field",
        f"vllm-srun: error: {bad}: models[1]: missing required field 'artifact'",
        f"vllm-srun: error: {bad}: models[2].dtype: expected one of auto, float32, bfloat16, float16, got 'fp8'",
        f"vllm-srun: error: {bad}: models[2].device: expected one of cpu, cuda:N, rocm:N, mps, auto, got 'gpu'",
    ]


def test_relations_between_fields_are_refused_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text(
        "models:\n  - artifact: /x/tiny\n  - artifact: /y/tiny\n  - {artifact: z, name: zz, dtype: float16, device: cpu}\n"
    )
    lines = refusal_lines(capsys, "--models", str(bad))
    assert len(lines) == 2
    assert "models[1]: the served name 'tiny' is taken by models[0]" in lines[0]
    assert "models[2].dtype:" in lines[1] and "float16" in lines[1]


def test_refused_with_model_arguments_and_when_unreadable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("models: [{artifact: a}]\n")
    assert refusal_lines(capsys, "a", "--models", str(tmp_path / "m.yaml")) == [
        "vllm-srun: error: --models FILE is refused together with MODEL arguments"
    ]
    (line,) = refusal_lines(capsys, "--models", str(tmp_path / "missing.yaml"))
    assert line.startswith("vllm-srun: error: --models ") and "No such file" in line
    (tmp_path / "empty.yaml").write_text("models: []\n")
    (line,) = refusal_lines(capsys, "--models", str(tmp_path / "empty.yaml"))
    assert line == f"vllm-srun: error: {tmp_path / 'empty.yaml'}: models: expected at least 1 entry, got 0"


def test_flags_are_the_defaults_an_entry_overrides(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  - {artifact: /m/one, name: first, max_num_seqs: 4, max_queue: 3}\n"
        "  - {artifact: /m/two, batch_window_ms: 0, device: cpu, max_queued_tokens: 99}\n"
    )
    ns = build_parser().parse_args(
        ["serve", "--models", str(path), "--max-num-seqs", "16", "--batch-window-ms", "5", "--max-queue", "7"]
    )
    first, second = model_specs(serve_settings(ns), "cpu")
    assert (first.served_name, second.served_name) == ("first", "two")
    assert first.args == EngineArgs(max_num_seqs=4, batch_window_ms=5.0)
    assert second.args == EngineArgs(max_num_seqs=16, batch_window_ms=0.0)
    assert first.admission == AdmissionLimits(3, 65_536) and second.admission == AdmissionLimits(7, 99)
    assert first.device == second.device == "cpu"


def test_each_model_is_served_with_its_own_arguments(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "models.yaml"
    path.write_text(
        f"models:\n"
        f"  - {{artifact: {encoder_fixture('embed')}, name: vectors, max_num_seqs: 4, max_queue: 5}}\n"
        f"  - {{artifact: {encoder_fixture('classify')}, batch_window_ms: 0}}\n"
    )
    specs = load_models_file(
        path,
        flags=ModelArgs(max_num_seqs=16),
        device="cpu",
        dtype_refusal=dtype_refusal,
    )
    with serving(list(specs)) as (client, _rt):
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert set(cards) == {"vectors", "tiny-classify"}
        assert cards["vectors"]["engine_args"]["max_num_seqs"] == 4
        assert cards["vectors"]["admission"] == {"max_queue": 5, "max_queued_tokens": 65_536}
        assert cards["tiny-classify"]["engine_args"]["max_num_seqs"] == 16
        assert cards["tiny-classify"]["engine_args"]["batch_window_ms"] == 0
        r = client.post("/v1/embeddings", json={"model": "vectors", "input": "hello"})
        assert r.status_code == 200 and r.json()["model"] == "vectors"


def test_a_models_file_served_by_a_real_worker(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "models.yaml"
    path.write_text(
        f"models:\n"
        f"  - {{artifact: {encoder_fixture('embed')}, name: vectors, max_num_seqs: 2}}\n"
        f"  - {{artifact: {encoder_fixture('rerank')}, name: ranker}}\n"
    )
    with running_server("--models", str(path), "--max-num-seqs", "8") as base:
        cards = {c["id"]: c for c in httpx.get(f"{base}/v1/models").json()["data"]}
        assert cards["vectors"]["engine_args"]["max_num_seqs"] == 2
        assert cards["ranker"]["engine_args"]["max_num_seqs"] == 8
        r = httpx.post(f"{base}/v1/rerank", json={"model": "ranker", "query": "q", "documents": ["a", "b"]})
        assert r.status_code == 200 and r.json()["model"] == "ranker"


def test_the_loader_reports_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("models: {artifact: a}\n")
    with pytest.raises(ConfigError) as refused:
        load_models_file(
            path,
            flags=ModelArgs(max_queue=1, max_queued_tokens=1),
            device="cpu",
            dtype_refusal=dtype_refusal,
        )
    assert refused.value.problems == [f"{path}: models: expected a list, got a mapping"]


def test_an_entry_names_its_own_engine_through_the_plugin_registry(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n  - {artifact: a, engine: onnxruntime}\n  - {artifact: b}\n  - {artifact: c, engine: nope}\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_models_file(path, flags=ModelArgs(engine="native"), device="cpu", dtype_refusal=dtype_refusal)
    assert refused.value.problems == [
        f"{path}: models[2].engine: unknown engine 'nope': installed are native, onnxruntime (or auto)"
    ]
    path.write_text("models:\n  - {artifact: a, engine: onnxruntime}\n  - {artifact: b}\n")
    first, second = load_models_file(path, flags=ModelArgs(engine="native"), device="cpu", dtype_refusal=dtype_refusal)
    assert (first.engine, second.engine) == ("onnxruntime", "native")  # left out: the worker's --engine


# ---- upstream's entry fields: profile, revision, family, memory_budget_gib, options (R-PROF) ----
UPSTREAM_MODELS = """\
models:
  - model: /srv/models/vela-like-domain      # upstream spells the artifact `model`
    name: domain
    device: cpu
    profile: batching
    family: encoder
    memory_budget_gib: 1.5
  - model: acme/tiny-judge
    revision: 0123456789abcdef0123456789abcdef01234567
    name: judge
    profile: shared_context
    options: {break_even_tokens: 0}
"""


def test_an_upstream_shaped_models_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(UPSTREAM_MODELS)
    domain, judge = load_models_file(path, flags=ModelArgs(), device="cpu", dtype_refusal=dtype_refusal)
    assert (domain.artifact, domain.name, domain.device, domain.args.profile) == (
        "/srv/models/vela-like-domain",
        "domain",
        "cpu",
        "batching",
    )
    assert (domain.family, domain.memory_budget_gib, domain.revision, dict(domain.options)) == (
        "encoder",
        1.5,
        None,
        {},
    )
    assert (judge.artifact, judge.revision, judge.args.profile) == (
        "acme/tiny-judge",
        "0123456789abcdef0123456789abcdef01234567",
        "shared_context",
    )
    assert dict(judge.options) == {"break_even_tokens": 0} and judge.family is None
    # a profile given as a flag is every entry's default
    (only,) = load_models_file(
        _write(tmp_path, "models:\n  - model: a\n"),
        flags=ModelArgs(profile="max_speed"),
        device="cpu",
        dtype_refusal=dtype_refusal,
    )
    assert only.args.profile == "max_speed"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "entry.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            "{model: acme/x, revision: main}",
            "models[0].revision: expected a 40-hex commit of the Hub repository, got 'main'",
        ),
        (
            "{model: ./local, revision: 0123456789abcdef0123456789abcdef01234567}",
            "models[0]: revision: ./local is not a Hub id (ORG/NAME)",
        ),
        (
            "{model: a, profile: fastest}",
            "models[0].profile: expected one of exact, shared_context, batching, max_speed",
        ),
        (
            "{model: a, profile: exact, enable_shared_context: true}",
            "models[0]: profile: --enable-shared-context contradicts profile exact",
        ),
        (
            "{model: a, profile: batching, dtype: bfloat16, device: cpu}",
            "models[0]: profile: profile batching serves the published precision only (float32 on a CPU)",
        ),
        ("{model: a, memory_budget_gib: 0}", "models[0].memory_budget_gib: expected a number >= 1e-06, got 0"),
        ("{model: a, options: [1, 2]}", "models[0].options: expected a mapping"),
    ],
)
def test_upstream_fields_are_refused_in_one_line(tmp_path: Path, entry: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_models_file(
            _write(tmp_path, f"models:\n  - {entry}\n"), flags=ModelArgs(), device="cpu", dtype_refusal=dtype_refusal
        )
    (line,) = refused.value.problems
    assert problem in line, line


def test_profile_flag_contradictions_stop_the_worker_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = refusal_lines(capsys, "--profile", "exact", "--enable-shared-context", "some-model")
    assert line.startswith("vllm-srun: error: --enable-shared-context contradicts profile exact")
    (line,) = refusal_lines(capsys, "--profile", "fastest", "some-model")
    assert "argument --profile: invalid choice: 'fastest'" in line


def test_a_profile_a_package_cannot_serve_is_refused_before_it_loads(
    capsys: pytest.CaptureFixture[str], encoder_fixture
) -> None:  # type: ignore[no-untyped-def]
    folder = str(encoder_fixture("embed"))
    (line,) = refusal_lines(capsys, folder, "--profile", "exact", "--dtype", "bfloat16", "--device", "cpu")
    assert line == (
        "vllm-srun: error: profile exact serves the published precision only (float32 on a CPU); "
        "--dtype bfloat16 needs profile max_speed"
    )
    (line,) = refusal_lines(capsys, folder, "--profile", "shared_context", "--device", "cpu")
    assert line == (
        "vllm-srun: error: profile shared_context applies to decision models only (a shared-context path); "
        "this is an encoder model"
    )
