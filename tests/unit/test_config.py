"""The canonical config of `vllm-sr serve`: validation (one line per problem), migration of
removed settings, and CLI flags written into the config (R-ARG, R-REP-1, R-REP-2, R-REP-5)."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from vllm_srun.adapters.config.loader import (
    ConfigError,
    dump_config,
    load_config_data,
    load_config_text,
)
from vllm_srun.adapters.config.migrate import MigrationError, migrate_config_text
from vllm_srun.adapters.config.overrides import apply_cli_overrides
from vllm_srun.adapters.config.schema import FrontConfig, ReplicaConfig
from vllm_srun.domain.fleet.ejection import OutlierDetection

CANONICAL = """
global:
  router: {enabled: false}
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: all-MiniLM-L6-v2
        replicas: [{device: cpu}, {device: cpu}]
        max_num_seqs: 256
        timeout_ms: 5000
        outlier_detection: {consecutive_timeouts: 3, base_ejection_ms: 30000}
system:
  decision_model: {deployment: primary}
"""


def deployment_yaml(body: str, name: str = "primary") -> str:
    """A config with one deployment whose fields are `body` (YAML lines)."""
    fields = textwrap.indent(textwrap.dedent(body).strip(), " " * 8)
    return f"global:\n  model_catalog:\n    deployments:\n      {name}:\n{fields}\n"


def problems_of(text: str, source: str = "config.yaml") -> list[str]:
    with pytest.raises(ConfigError) as refused:
        load_config_text(text, source=source)
    return refused.value.problems


def only_problem(text: str) -> str:
    problems = problems_of(text)
    assert len(problems) == 1, problems
    return problems[0]


# ---- loading and dumping --------------------------------------------------------------------
def test_the_canonical_example_loads_and_round_trips() -> None:
    config = load_config_text(CANONICAL)
    primary = config.deployments["primary"]
    assert primary.placement() == [ReplicaConfig(device="cpu"), ReplicaConfig(device="cpu")]
    assert primary.max_num_seqs == 256 and primary.timeout_ms == 5000
    assert primary.outlier_policy() == OutlierDetection(consecutive_timeouts=3, base_ejection_ms=30000)
    assert config.default_deployment_name() == "primary"
    assert load_config_text(dump_config(config)) == config
    assert "max_num_batched_tokens" not in dump_config(config)  # unset stays unset


def test_an_empty_file_is_an_empty_config_and_the_shorthand_is_one_auto_worker() -> None:
    assert load_config_text("") == FrontConfig()
    config = load_config_text(deployment_yaml("artifact: a"))
    assert config.deployments["primary"].placement() == [ReplicaConfig(device="auto")]
    attached = load_config_text(deployment_yaml("artifact: a\nendpoint: http://h:8100\nmodel: m"))
    assert attached.deployments["primary"].placement() == [ReplicaConfig(endpoint="http://h:8100", model="m")]


def test_every_problem_is_reported_at_once_one_line_each() -> None:
    problems = problems_of(
        deployment_yaml(
            """
            artifact: a
            max_num_seqs: 0
            batch_window_ms: -1
            dtype: fp32
            colour: blue
            """
        )
    )
    assert problems == [
        "deployments.primary.max_num_seqs: expected an integer >= 1, got 0",
        "deployments.primary.batch_window_ms: expected a number >= 0.0, got -1",
        "deployments.primary.dtype: expected one of auto, float32, bfloat16, float16, got 'fp32'",
        "deployments.primary.colour: unknown field",
    ]
    assert all("\n" not in problem for problem in problems)


def test_problems_name_their_deployment_and_list_entry_in_the_order_of_the_file() -> None:
    text = """
    global:
      model_catalog:
        deployments:
          fine: {artifact: a}
          second:
            artifact: ''
            max_num_seqs: 0
            replicas: [1, {device: gpu}, cpu, {device: cpu, threads: 2}]
          third: {dtype: fp8}
          1: {artifact: c}
    """
    assert problems_of(textwrap.dedent(text)) == [
        # msgspec names no mapping entry; each line still names its deployment
        "deployments.second.artifact: expected a string of length >= 1, got ''",  # and no
        "deployments.second.max_num_seqs: expected an integer >= 1, got 0",  # "missing artifact"
        "deployments.second.replicas[0]: expected a mapping, got 1",
        "deployments.second.replicas[1].device: expected one of cpu, cuda:N, rocm:N, mps, auto, got 'gpu'",
        "deployments.second.replicas[2]: expected a mapping, got 'cpu'",  # indices as written
        "deployments.second.replicas[3].threads: unknown field",
        "deployments.third.dtype: expected one of auto, float32, bfloat16, float16, got 'fp8'",
        "deployments.third: missing required field 'artifact'",
        "deployments.1: a deployment name is letters, digits, '.', '_' or '-', starting with a letter or digit",
    ]
    assert problems_of(deployment_yaml("artifact: a\n3: x")) == ["deployments.primary.3: unknown field"]


# ---- placement rules -------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["device: cuda:0", "endpoint: http://h:1", "model: m"])
def test_replicas_cannot_be_combined_with_a_deployment_level_placement(field: str) -> None:
    name = field.split(":")[0]
    problems = problems_of(deployment_yaml(f"artifact: a\n{field}\nreplicas: [{{device: cpu}}]"))
    assert (
        f"deployments.primary: 'replicas' cannot be combined with a deployment-level '{name}'"
        " (give each replica its own)"
    ) in problems


def test_attached_and_managed_replicas_name_models_correctly() -> None:
    problems = problems_of(
        deployment_yaml(
            """
            artifact: a
            replicas:
              - {endpoint: http://host:8100}
              - {device: cuda:0, model: m}
              - {}
              - {device: cpu, endpoint: http://host:8101, model: m}
              - {endpoint: http://host:8102, model: m}
              - {endpoint: http://host:8102, model: m}
            """
        )
    )
    assert problems == [
        "deployments.primary.replicas[0]: an attached replica ('endpoint') names its model with 'model'",
        "deployments.primary.replicas[1]: 'model' is only for an attached runtime ('endpoint'); "
        "a managed worker serves the deployment's artifact",
        "deployments.primary.replicas[2]: needs 'device' (a managed worker) or 'endpoint' (an attached runtime)",
        "deployments.primary.replicas[3]: 'device' cannot be combined with 'endpoint' "
        "(an attached runtime places itself)",
        "deployments.primary.replicas[5]: endpoint http://host:8102 is already replicas[4] "
        "(one runtime is one replica; run another runtime to add capacity)",
    ]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://host:8100", "http://host:8100/"),
        ("http://HOST:80", "http://host"),
        ("https://host", "https://host:443/"),
        ("http://[fd00::2]:8100", "http://[FD00::2]:8100"),
    ],
)
def test_one_runtime_is_one_replica_however_its_endpoint_is_spelled(first: str, second: str) -> None:
    text = f"artifact: a\nreplicas: [{{endpoint: '{first}', model: m}}, {{endpoint: '{second}', model: other}}]"
    assert only_problem(deployment_yaml(text)).startswith(
        f"deployments.primary.replicas[1]: endpoint {second} is already replicas[0]"
    )


def test_distinct_endpoints_and_paths_are_distinct_runtimes() -> None:
    load_config_text(
        deployment_yaml(
            "artifact: a\nreplicas: [{endpoint: 'http://h:8100', model: m}, {endpoint: 'http://h:8101', model: m},"
            " {endpoint: 'https://h:8100', model: m}, {endpoint: 'http://h:8100/b', model: m}]"
        )
    )


def test_one_runtime_model_cannot_serve_two_deployments() -> None:
    text = """
        global:
          model_catalog:
            deployments:
              a: {artifact: x, replicas: [{endpoint: 'http://h:8100', model: m}]}
              b: {artifact: x, endpoint: 'http://h:8100/', model: m}
              c: {artifact: y, endpoint: 'http://h:8100', model: n}
        """
    assert problems_of(textwrap.dedent(text)) == [
        "deployments.b: http://h:8100/ model m is already a replica of deployments.a "
        "(two deployments would each count its load as their own)"
    ]


@pytest.mark.parametrize("port", [0, 65536, 99999])
def test_an_endpoint_port_out_of_range_is_refused(port: int) -> None:
    endpoint = f"http://h:{port}"
    assert only_problem(deployment_yaml(f"artifact: a\nreplicas: [{{endpoint: '{endpoint}', model: m}}]")) == (
        f"deployments.primary.replicas[0].endpoint: port {port} is out of range (1-65535), got '{endpoint}'"
    )


def test_deployment_level_endpoint_needs_model_and_model_needs_endpoint() -> None:
    assert only_problem(deployment_yaml("artifact: a\nendpoint: https://h/v1")) == (
        "deployments.primary: an attached deployment ('endpoint') names its model with 'model'"
    )
    assert only_problem(deployment_yaml("artifact: a\nmodel: m")) == (
        "deployments.primary: 'model' names the model of an attached runtime and needs 'endpoint'"
    )


@pytest.mark.parametrize("field", ["max_model_len", "max_request_tokens", "max_queue", "max_queued_tokens"])
@pytest.mark.parametrize(
    "placement",
    [
        "endpoint: http://h:1\nmodel: m",
        "replicas: [{device: cuda:0}, {endpoint: http://h:1, model: m}]",
    ],
)
def test_worker_limits_are_refused_where_an_attached_runtime_serves(placement: str, field: str) -> None:
    assert only_problem(deployment_yaml(f"artifact: a\n{placement}\n{field}: 4096")) == (
        f"deployments.primary.{field}: refused on a deployment with an attached endpoint; "
        f"pass --{field.replace('_', '-')} to the attached runtime itself"
    )
    load_config_text(deployment_yaml(f"artifact: a\ndevice: rocm:0\n{field}: 4096"))


@pytest.mark.parametrize("device", ["cpu", "auto", "mps", "cuda:0", "cuda:12", "rocm:3"])
def test_device_names_that_load(device: str) -> None:
    load_config_text(deployment_yaml(f"artifact: a\ndevice: '{device}'"))


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:-1", "rocm:x", "CPU", "xpu:0", "cuda:0 "])
def test_device_names_that_are_refused(device: str) -> None:
    assert only_problem(deployment_yaml(f"artifact: a\ndevice: '{device}'")) == (
        f"deployments.primary.device: expected one of cpu, cuda:N, rocm:N, mps, auto, got '{device}'"
    )


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://h",
        "https://h.example:8100",
        "http://10.0.0.2:80/v1",
        "http://[fd00::2]:8100",
        "http://vllm-srun-worker-0.vllm-srun-worker.default.svc.cluster.local:8100",
        "unix:///tmp/s",  # an attached runtime on a Unix socket (upstream's spelling)
        "unix:///run/vllm-srun/worker.sock",
    ],
)
def test_endpoints_that_load(endpoint: str) -> None:
    load_config_text(deployment_yaml(f"artifact: a\nreplicas: [{{endpoint: '{endpoint}', model: m}}]"))


@pytest.mark.parametrize(
    "endpoint",
    [
        "h:8100",
        "ftp://h",
        "http://",
        "unix://tmp/s",
        "unix:///",
        "unix:///tmp/s/",
        "http://h:8100 x",
        "http://h/?a=1",
        "http://u@h",
        "http://[h]",
    ],
)
def test_endpoints_that_are_refused(endpoint: str) -> None:
    problem = only_problem(deployment_yaml(f"artifact: a\nendpoint: '{endpoint}'\nmodel: m"))
    assert problem.startswith("deployments.primary.endpoint: expected an http:// or https:// URL")


# ---- value ranges and types --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("max_num_seqs: 0", "max_num_seqs: expected an integer >= 1, got 0"),
        ("max_num_seqs: '8'", "max_num_seqs: expected an integer, got '8'"),
        ("max_num_seqs: true", "max_num_seqs: expected an integer, got True"),
        # the worker's bound (domain/settings/bounds.py): fewer than 8 tokens never started a worker
        ("max_num_batched_tokens: 7", "max_num_batched_tokens: expected an integer >= 8, got 7"),
        ("batch_window_ms: 10000.5", "batch_window_ms: expected a number <= 10000.0, got 10000.5"),
        ("batch_window_ms: .nan", "batch_window_ms: expected a number >= 0.0, got nan"),
        (
            "dtype: float64",
            "dtype: expected one of auto, float32, bfloat16, float16, got 'float64'",
        ),
        ("engine: tensorrt", "engine: unknown engine 'tensorrt': installed are native, onnxruntime (or auto)"),
        (
            "engine: 'tensor rt'",
            "engine: expected auto or an installed engine's name (letters, digits, '.', '_' or '-'), got 'tensor rt'",
        ),
        ("enable_shared_context: 2", "enable_shared_context: expected true or false, got 2"),
        ("result_cache_entries: -1", "result_cache_entries: expected an integer >= 0, got -1"),
        ("timeout_ms: 0", "timeout_ms: expected an integer >= 1, got 0"),
        ("provider: vllm", "provider: expected model_runtime, got 'vllm'"),
        ("artifact: ''", "artifact: expected a string of length >= 1, got ''"),
        ("replicas: []", "replicas: expected between 1 and 64 entries, got 0"),
        (
            "outlier_detection: {consecutive_timeouts: -1}",
            "outlier_detection.consecutive_timeouts: expected an integer >= 0, got -1",
        ),
        (
            "outlier_detection: {base_ejection_ms: 0}",
            "outlier_detection.base_ejection_ms: expected an integer >= 1, got 0",
        ),
        (
            "outlier_detection: {max_ejection_ms: 3600001}",
            "outlier_detection.max_ejection_ms: expected an integer <= 3600000, got 3600001",
        ),
        (
            "outlier_detection: {max_ejection_percent: 101}",
            "outlier_detection.max_ejection_percent: expected an integer <= 100, got 101",
        ),
        (
            "outlier_detection: {base_ejection_ms: 5000, max_ejection_ms: 1000}",
            "outlier_detection.max_ejection_ms: must be at least base_ejection_ms (5000), got 1000",
        ),
        (
            "outlier_detection: {max_ejection_ms: 1000}",
            "outlier_detection.max_ejection_ms: must be at least base_ejection_ms (30000), got 1000",
        ),
    ],
)
def test_values_out_of_range_or_of_the_wrong_type(line: str, problem: str) -> None:
    text = deployment_yaml(line if line.startswith("artifact") else f"artifact: a\n{line}")
    assert only_problem(text) == f"deployments.primary.{problem}"


def test_engine_argument_combinations() -> None:
    assert only_problem(deployment_yaml("artifact: a\ndevice: cpu\ndtype: float16")) == (
        "deployments.primary.dtype: float16 runs on GPUs only, and a worker is on the CPU"
    )
    assert only_problem(deployment_yaml("artifact: a\nengine: onnxruntime\ndtype: bfloat16")) == (
        "deployments.primary.dtype: the onnxruntime engine runs only dtype auto"
    )
    load_config_text(deployment_yaml("artifact: a\nengine: onnxruntime\ndtype: auto"))
    load_config_text(deployment_yaml("artifact: a\ndevice: cuda:0\ndtype: float16"))


def test_unknown_fields_are_named_with_their_path() -> None:
    text = """
    global:
      routr: {}
      model_catalog:
        deployments:
          primary:
            artifact: a
            max_num_seq: 4
            replicas: [{device: cpu, threads: 4}]
            outlier_detection: {consecutive_timeout: 2}
    system: {decision_model: {deployment: primary, fallback: x}}
    extra: 1
    """
    assert problems_of(textwrap.dedent(text)) == [
        "global.routr: unknown field (did you mean 'router'?)",
        "deployments.primary.max_num_seq: unknown field (did you mean 'max_num_seqs'?)",
        "deployments.primary.replicas[0].threads: unknown field",
        "deployments.primary.outlier_detection.consecutive_timeout: unknown field "
        "(did you mean 'consecutive_timeouts'?)",
        "system.decision_model.fallback: unknown field",
        "extra: unknown field",
    ]


def test_structure_and_references() -> None:
    assert only_problem("global: {model_catalog: {deployments: {primary: {device: cpu}}}}") == (
        "deployments.primary: missing required field 'artifact'"
    )
    assert only_problem("- a\n- b") == "config: expected a mapping, got a list"
    assert only_problem("global: {model_catalog: {deployments: []}}") == (
        "global.model_catalog.deployments: expected a mapping, got a list"
    )
    assert only_problem("global: {model_catalog: {deployments: }}") == (
        "global.model_catalog.deployments: expected a mapping, got null"
    )
    assert only_problem(deployment_yaml("artifact: a") + "system: {decision_model: {deployment: b}}") == (
        "system.decision_model.deployment: no deployment named 'b' (primary)"
    )
    assert only_problem(deployment_yaml("artifact: a", name="two words")).startswith(
        "deployments.two words: a deployment name is letters, digits"
    )


def test_yaml_problems_are_one_line_with_their_position() -> None:
    assert only_problem("global: [").startswith("line 1, column 10: invalid YAML")
    assert only_problem(deployment_yaml("artifact: a\nartifact: b")) == "line 6: duplicate key 'artifact'"


def test_llm_routing_is_refused_as_out_of_scope() -> None:
    assert only_problem("global: {router: {enabled: true}}") == (
        "global.router.enabled: LLM routing is out of scope for vllm-sr serve "
        "(it serves non-generative models); set it to false or remove it"
    )
    assert load_config_text("global: {router: {enabled: false}}").global_.router.enabled is False


# ---- removed settings and migration ------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "precision: fp16",
        "batch_size: 8",
        "max_batch_size: 8",
        "use_cpu: true",
        "custom_ops_profile: fast",
        "compilation_cache_dir: /tmp/c",
    ],
)
def test_removed_settings_are_refused_naming_the_migrate_command(line: str) -> None:
    problems = problems_of(deployment_yaml(f"artifact: a\n{line}"), source="/etc/vllm-sr/front.yaml")
    field = line.split(":")[0]
    assert len(problems) == 1
    assert problems[0].startswith(f"deployments.primary.{field}: removed setting (")
    assert problems[0].endswith("run `vllm-sr config migrate /etc/vllm-sr/front.yaml` to rewrite the config")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("device: migraphx:2", "device: 'migraphx:2' is a removed device name (now 'rocm:2')"),
        (
            "replicas: [{device: migraphx:1}]",
            "replicas[0].device: 'migraphx:1' is a removed device name (now 'rocm:1')",
        ),
        ("provider: openvino", "provider: provider 'openvino' was removed (now 'model_runtime')"),
    ],
)
def test_removed_values_are_refused_naming_the_migrate_command(line: str, problem: str) -> None:
    assert only_problem(deployment_yaml(f"artifact: a\n{line}")) == (
        f"deployments.primary.{problem}; run `vllm-sr config migrate config.yaml` to rewrite it"
    )


LEGACY = """\
global:
  router: {enabled: false}
  model_catalog:
    deployments:
      judge:   # the decision model
        provider: candle
        artifact: vllm-sr/d3-edge
        precision: bf16
        max_batch_size: 64
        profile: max_speed
        replicas: [{device: migraphx:0}, {device: migraphx:1}]
        timeout_ms: 5000
      embed:
        provider: ort
        artifact: all-MiniLM-L6-v2
        use_cpu: true
        batch_size: 32
        precision: auto
system:
  decision_model: {deployment: judge}
"""


def test_migration_rewrites_removed_settings_and_the_result_means_the_same() -> None:
    migration = migrate_config_text(LEGACY)
    assert migration.changes == (
        "deployments.judge.provider: candle → model_runtime",
        "deployments.judge.artifact: vllm-sr/d3-edge kept",  # a 0.4.0 provider: every field is said
        "deployments.judge.precision: bf16 → dtype: bfloat16, profile: max_speed (approximate)",
        "deployments.judge.max_batch_size: 64 → max_num_seqs: 64",
        "deployments.judge.profile: max_speed kept",  # a profile of this server (R-PROF)
        "deployments.judge.replicas[0].device: migraphx:0 → rocm:0",
        "deployments.judge.replicas[1].device: migraphx:1 → rocm:1",
        "deployments.embed.provider: ort → model_runtime",
        "deployments.embed.provider: ort → engine: onnxruntime",
        "deployments.embed.artifact: all-MiniLM-L6-v2 kept",
        "deployments.embed.use_cpu: true → device: cpu",
        "deployments.embed.batch_size: 32 → max_num_seqs: 32",
        "deployments.embed.precision: auto → dtype: auto",
        "note: comments of the original file are not kept",
    )
    config = load_config_text(migration.text)
    judge, embed = config.deployments["judge"], config.deployments["embed"]
    assert (judge.engine, judge.dtype, judge.max_num_seqs, judge.timeout_ms, judge.profile) == (
        None,
        "bfloat16",
        64,
        5000,
        "max_speed",
    )
    assert judge.placement() == [ReplicaConfig(device="rocm:0"), ReplicaConfig(device="rocm:1")]
    assert (embed.engine, embed.device, embed.max_num_seqs, embed.dtype) == (
        "onnxruntime",
        "cpu",
        32,
        "auto",
    )
    assert config.default_deployment_name() == "judge"
    assert list(yaml.safe_load(migration.text)["global"]["model_catalog"]["deployments"]["embed"]) == [
        "provider",
        "engine",
        "artifact",
        "device",
        "max_num_seqs",
        "dtype",
    ]  # rewritten keys stay where the old ones were
    again = migrate_config_text(migration.text)
    assert not again.changed and again.text == migration.text


def test_fp16_migrates_to_profile_max_speed_as_upstream_writes_it() -> None:
    legacy = deployment_yaml("artifact: a\nprovider: candle\ndevice: cuda:0\nprecision: fp16\nprofile: fast")
    migration = migrate_config_text(legacy)
    assert "deployments.primary.precision: fp16 → dtype: float16, profile: max_speed (approximate)" in migration.changes
    assert any(
        line.startswith("deployments.primary.profile: removed ('fast' is not a profile") for line in migration.changes
    )
    primary = load_config_text(migration.text).deployments["primary"]
    assert (primary.profile, primary.dtype, primary.device) == ("max_speed", "float16", "cuda:0")
    # a named profile that a half precision contradicts is refused, not silently changed
    with pytest.raises(MigrationError) as refused:
        migrate_config_text(deployment_yaml("artifact: a\nprecision: bf16\nprofile: exact"))
    assert refused.value.problems == [
        "deployments.primary.precision: rewrites to profile: max_speed but profile is exact; keep one of them"
    ]


def test_a_current_config_is_left_untouched() -> None:
    migration = migrate_config_text(CANONICAL)
    assert migration.text == CANONICAL and migration.changes == ()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            "precision: fp16\ndtype: float32",
            "precision: rewrites to dtype: float16 but dtype is float32",
        ),
        (
            "batch_size: 8\nmax_num_seqs: 16",
            "batch_size: rewrites to max_num_seqs: 8 but max_num_seqs is 16",
        ),
        (
            "batch_size: 8\nmax_batch_size: 16",
            "max_batch_size: rewrites to max_num_seqs: 16 but max_num_seqs is 8",
        ),
        ("use_cpu: true\ndevice: cuda:0", "use_cpu: true contradicts device: cuda:0"),
        (
            "use_cpu: true\nreplicas: [{device: rocm:0}]",
            "use_cpu: true contradicts replicas placed on rocm:0",
        ),
        ("precision: int8", "precision: 'int8' has no dtype"),
    ],
)
def test_migration_refuses_rewrites_that_would_change_the_meaning(body: str, problem: str) -> None:
    with pytest.raises(MigrationError) as refused:
        migrate_config_text(deployment_yaml(f"artifact: a\n{body}"))
    assert len(refused.value.problems) == 1
    assert refused.value.problems[0].startswith(f"deployments.primary.{problem}")


PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "auto": "auto"}


@given(
    precision=st.one_of(st.none(), st.sampled_from(sorted(PRECISIONS))),
    seqs=st.one_of(st.none(), st.integers(1, 4096)),
    seqs_key=st.sampled_from(["batch_size", "max_batch_size"]),
    use_cpu=st.one_of(st.none(), st.booleans()),
    gpu=st.one_of(st.none(), st.integers(0, 7)),
    dropped=st.lists(st.sampled_from(["profile", "custom_ops_profile"]), unique=True),
)
def test_any_consistent_legacy_deployment_migrates_to_one_that_loads_and_means_the_same(
    precision: str | None,
    seqs: int | None,
    seqs_key: str,
    use_cpu: bool | None,
    gpu: int | None,
    dropped: list[str],
) -> None:
    assume(not (precision == "fp16" and use_cpu))  # float16 on a CPU is refused, migrated or not
    lines = ["artifact: a"]
    if precision is not None:
        lines.append(f"precision: {precision}")
    if seqs is not None:
        lines.append(f"{seqs_key}: {seqs}")
    if use_cpu is not None:
        lines.append(f"use_cpu: {str(use_cpu).lower()}")
    if gpu is not None and not use_cpu:
        lines.append(f"device: migraphx:{gpu}")
    lines += [f"{key}: x" for key in dropped]
    deployment = load_config_text(migrate_config_text(deployment_yaml("\n".join(lines))).text).deployments["primary"]
    assert deployment.dtype == (PRECISIONS[precision] if precision else None)
    # a half precision asks for max_speed, as upstream's migration writes it; `profile: x` is no profile
    assert deployment.profile == ("max_speed" if precision in ("bf16", "fp16") else None)
    assert deployment.max_num_seqs == seqs
    expected_device = "cpu" if use_cpu else (f"rocm:{gpu}" if gpu is not None else None)
    assert deployment.device == expected_device


# ---- CLI flags into the config -------------------------------------------------------------
def placed(config: FrontConfig, name: str = "primary") -> list[str | None]:
    return [replica.device or replica.endpoint for replica in config.deployments[name].placement()]


def configured(body: str) -> FrontConfig:
    return load_config_text(deployment_yaml(body))


def test_model_alone_keeps_replicas_and_engine_arguments() -> None:
    config = configured(
        "artifact: old\nrevision: v1\nreplicas: [{device: rocm:0}, {device: rocm:1}]\n"
        "max_num_seqs: 64\nbatch_window_ms: 1.0"
    )
    updated = apply_cli_overrides(config, model="vllm-sr/d3-edge")
    primary = updated.deployments["primary"]
    assert primary.artifact == "vllm-sr/d3-edge" and primary.revision is None
    assert placed(updated) == ["rocm:0", "rocm:1"]
    assert (primary.max_num_seqs, primary.batch_window_ms) == (64, 1.0)
    assert updated.decision_deployment == "primary"
    assert updated.global_.model_catalog.system.decision_model.deployment == "primary"  # upstream's place
    assert apply_cli_overrides(config) is config  # no flags, no change


def test_model_without_a_config_creates_the_default_deployment() -> None:
    updated = apply_cli_overrides(FrontConfig(), model="m", engine_args={"max_num_seqs": 256, "dtype": None})
    assert list(updated.deployments) == ["primary"]
    assert updated.deployments["primary"].max_num_seqs == 256
    assert updated.deployments["primary"].dtype is None
    assert placed(updated) == ["auto"]
    assert load_config_text(dump_config(updated)) == updated
    with pytest.raises(ConfigError, match=r"deployments\.primary: no such deployment"):
        apply_cli_overrides(FrontConfig(), data_parallel_size=2, platform="cpu")


@pytest.mark.parametrize(
    ("dp", "ids", "devices"),
    [
        (2, [0], ["rocm:0", "rocm:0"]),  # two workers on one GPU
        (2, [0, 1], ["rocm:0", "rocm:1"]),  # one each
        (None, [3, 1], ["rocm:3", "rocm:1"]),  # ids alone: one worker per id
        (4, [0, 1], ["rocm:0", "rocm:1", "rocm:0", "rocm:1"]),
        (1, [5], ["rocm:5"]),
    ],
)
def test_device_ids_place_the_workers(dp: int | None, ids: list[int], devices: list[str]) -> None:
    updated = apply_cli_overrides(
        FrontConfig(),
        model="vllm-sr/d3-edge",
        platform="rocm",
        data_parallel_size=dp,
        device_ids=ids,
    )
    assert placed(updated) == devices
    assert updated.deployments["primary"].device is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"platform": "cuda", "data_parallel_size": 1, "device_ids": [0, 1]},
            "--device-ids: 2 GPUs for 1 workers",
        ),
        (
            {"platform": "cuda", "data_parallel_size": 2, "device_ids": [0, 0]},
            "--device-ids: list each GPU once",
        ),
        (
            {"platform": "cuda", "data_parallel_size": 2, "device_ids": [-1]},
            "--device-ids: list each GPU once",
        ),
        ({"platform": "cuda", "data_parallel_size": 0}, "-dp: expected a worker count >= 1, got 0"),
        ({"platform": "tpu"}, "--platform: expected one of auto, cpu, cuda, rocm, mps, got 'tpu'"),
        ({"engine": "tensorrt"}, "--engine: unknown engine 'tensorrt': installed are native, onnxruntime (or auto)"),
        ({"engine_args": {"max_num_seq": 4}}, "engine argument 'max_num_seq': unknown"),
        (
            {"engine_args": {"max_num_seqs": 0}},
            "deployments.primary.max_num_seqs: expected an integer >= 1, got 0",
        ),
    ],
)
def test_bad_flags_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        apply_cli_overrides(FrontConfig(), model="m", **kwargs)  # type: ignore[arg-type]


def test_device_ids_need_a_gpu_platform() -> None:
    for platform in ("cpu", "mps", None):
        with pytest.raises(ConfigError, match="--device-ids places workers on GPUs"):
            apply_cli_overrides(FrontConfig(), model="m", platform=platform, device_ids=[0])
    # the platform of an existing GPU placement is kept
    config = configured("artifact: a\nreplicas: [{device: cuda:0}]")
    assert placed(apply_cli_overrides(config, device_ids=[2, 3])) == ["cuda:2", "cuda:3"]


def test_a_new_gpu_placement_takes_the_first_available_gpus_and_never_piles_up() -> None:
    updated = apply_cli_overrides(
        FrontConfig(), model="m", platform="cuda", data_parallel_size=2, available_gpus=[1, 2, 3]
    )
    assert placed(updated) == ["cuda:1", "cuda:2"]
    with pytest.raises(ConfigError) as refused:
        apply_cli_overrides(FrontConfig(), model="m", platform="cuda", data_parallel_size=2, available_gpus=[0])
    assert refused.value.problems == [
        "deployments.primary: 2 cuda worker(s) need 2 GPU(s) but only 1 are available (0); "
        "pass --device-ids to place several workers on one GPU"
    ]


def test_a_cpu_placement_is_n_cpu_workers_and_replaces_another_platform() -> None:
    assert placed(apply_cli_overrides(FrontConfig(), model="m", platform="cpu", data_parallel_size=3)) == [
        "cpu",
        "cpu",
        "cpu",
    ]
    gpus = configured("artifact: a\nreplicas: [{device: cuda:0}, {device: cuda:1}]\nmax_num_seqs: 8")
    moved = apply_cli_overrides(gpus, platform="cpu")
    assert placed(moved) == ["cpu", "cpu"] and moved.deployments["primary"].max_num_seqs == 8


def test_an_existing_placement_is_resized_in_its_declared_order() -> None:
    config = configured("artifact: a\nreplicas: [{device: rocm:3}, {device: rocm:1}]")
    assert placed(apply_cli_overrides(config, data_parallel_size=1)) == ["rocm:3"]
    grown = apply_cli_overrides(config, data_parallel_size=4, available_gpus=[0, 1, 2, 3])
    assert placed(grown) == ["rocm:3", "rocm:1", "rocm:0", "rocm:2"]
    assert placed(apply_cli_overrides(config, platform="rocm", data_parallel_size=2)) == [
        "rocm:3",
        "rocm:1",
    ]
    with pytest.raises(ConfigError, match="1 more rocm worker"):
        apply_cli_overrides(config, data_parallel_size=3, available_gpus=[1, 3])
    cpus = configured("artifact: a\nreplicas: [{device: cpu}]")
    assert placed(apply_cli_overrides(cpus, data_parallel_size=3)) == ["cpu", "cpu", "cpu"]


def test_attached_replicas_can_be_dropped_but_not_invented_or_moved() -> None:
    config = configured(
        "artifact: a\nreplicas: [{endpoint: 'http://a:1', model: m}, {endpoint: 'http://b:1', model: m}]"
    )
    assert placed(apply_cli_overrides(config, data_parallel_size=1)) == ["http://a:1"]
    with pytest.raises(ConfigError, match="attached replicas cannot be added from flags"):
        apply_cli_overrides(config, data_parallel_size=3)
    with pytest.raises(ConfigError, match="has attached replicas"):
        apply_cli_overrides(config, platform="cpu")
    with pytest.raises(ConfigError, match="max_model_len: refused on a deployment with an attached"):
        apply_cli_overrides(config, engine_args={"max_model_len": 4096})


def test_the_single_worker_shorthand_stays_a_shorthand_unless_dp_is_given() -> None:
    config = configured("artifact: a\ndevice: cuda:0")
    assert apply_cli_overrides(config, platform="cuda").deployments == config.deployments
    assert apply_cli_overrides(config, platform="cpu").deployments["primary"].device == "cpu"
    explicit = apply_cli_overrides(config, data_parallel_size=1)
    assert explicit.deployments["primary"].replicas == [ReplicaConfig(device="cuda:0")]
    auto = configured("artifact: a")
    assert apply_cli_overrides(auto, data_parallel_size=1) == apply_cli_overrides(auto, model="a")
    with pytest.raises(ConfigError, match="no placement of one kind to grow"):
        apply_cli_overrides(auto, data_parallel_size=2)


def test_flags_go_to_the_decision_models_deployment_and_nowhere_else() -> None:
    text = deployment_yaml("artifact: a\ndevice: cpu") + "      other:\n        artifact: b\n        device: cpu\n"
    with pytest.raises(ConfigError, match=r"several deployments and no system\.decision_model\.deployment"):
        apply_cli_overrides(load_config_text(text), model="x")
    config = load_config_text(text + "system: {decision_model: {deployment: other}}")
    updated = apply_cli_overrides(config, model="x", engine="native", data_parallel_size=2)
    assert updated.deployments["primary"] == config.deployments["primary"]
    assert updated.deployments["other"].artifact == "x"
    assert updated.deployments["other"].engine == "native"
    assert placed(updated, "other") == ["cpu", "cpu"]


def test_flag_results_load_as_files_do() -> None:
    updated = apply_cli_overrides(
        load_config_data({}),
        model="m",
        platform="rocm",
        data_parallel_size=2,
        device_ids=[0],
        engine_args={"max_num_seqs": 128, "batch_window_ms": 0.0, "enable_shared_context": False},
    )
    assert load_config_text(dump_config(updated)) == updated


# ---- a config as upstream writes it (R-PROF-3, issue 43) --------------------------------------
UPSTREAM_STYLE = """
global:
  router: {enabled: false}
  model_catalog:
    system:
      decision_model: {deployment: judge}
    deployments:
      judge:
        provider: model_runtime
        artifact: /opt/models/tiny-judge
        public_name: acme/judge-1
        device: cpu
        profile: shared_context
        input: {max_tokens: 2048, overflow: window}
      domain:
        provider: model_runtime
        artifact: /opt/models/tiny-domain
        profile: exact
      remote:
        provider: model_runtime
        endpoint: unix:///run/vllm-srun/domain.sock
        served_name: tiny-domain
        profile: batching
"""


def test_an_upstream_style_config_loads() -> None:
    config = load_config_text(UPSTREAM_STYLE)
    judge, domain, remote = (config.deployments[name] for name in ("judge", "domain", "remote"))
    assert config.decision_deployment == "judge" and config.default_deployment_name() == "judge"
    assert (judge.profile, judge.public_name, judge.input_overflow) == ("shared_context", "acme/judge-1", "window")
    assert domain.profile == "exact"  # `profile: exact` loads (it was refused as removed)
    assert remote.placement() == [ReplicaConfig(endpoint="unix:///run/vllm-srun/domain.sock", model="tiny-domain")]
    assert remote.artifact == "tiny-domain" and remote.profile == "batching"
    dumped = yaml.safe_load(dump_config(config))
    assert dumped["global"]["model_catalog"]["system"] == {"decision_model": {"deployment": "judge"}}
    assert load_config_text(dump_config(config)) == config


def test_the_decision_model_may_be_written_in_either_place_when_they_agree() -> None:
    root = deployment_yaml("artifact: a") + "system: {decision_model: {deployment: primary}}\n"
    assert load_config_text(root).decision_deployment == "primary"  # our older root-level place
    both = deployment_yaml("artifact: a") + "    system: {decision_model: {deployment: primary}}\n"
    both = both.replace("    deployments:", "    system: {decision_model: {deployment: primary}}\n    deployments:", 1)
    two = deployment_yaml("artifact: a", name="primary") + "system: {decision_model: {deployment: other}}\n"
    two = two.replace("    deployments:", "    system: {decision_model: {deployment: primary}}\n    deployments:", 1)
    assert problems_of(two) == [
        "system.decision_model.deployment: no deployment named 'other' (primary)",
        "system.decision_model.deployment and global.model_catalog.system.decision_model.deployment "
        "name different deployments (other, primary); keep one",
    ]
    unknown = deployment_yaml("artifact: a").replace(
        "    deployments:", "    system: {decision_model: {deployment: nope}}\n    deployments:", 1
    )
    assert only_problem(unknown) == (
        "global.model_catalog.system.decision_model.deployment: no deployment named 'nope' (primary)"
    )


def test_public_names_are_aliases_no_two_deployments_share() -> None:
    text = deployment_yaml("artifact: a\npublic_name: acme/a", name="one") + (
        "      two:\n        artifact: b\n        public_name: acme/a\n"
        "      three:\n        artifact: c\n        public_name: one\n"
    )
    assert problems_of(text) == [
        "deployments.two.public_name: 'acme/a' is published by deployments.one too",
        "deployments.three.public_name: 'one' is the name of another deployment",
    ]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            "artifact: a\nprofile: fastest",
            "deployments.primary.profile: expected one of exact, shared_context, batching",
        ),
        (
            "artifact: a\nprofile: batching\nenable_shared_context: true",
            "deployments.primary: --enable-shared-context contradicts profile batching",
        ),
        (
            "artifact: a\nprofile: exact\ndtype: bfloat16\ndevice: cpu",
            "deployments.primary: profile exact serves the published precision only (float32 on a CPU)",
        ),
    ],
)
def test_a_deployments_profile_is_checked_with_its_other_settings(body: str, problem: str) -> None:
    assert only_problem(deployment_yaml(body)).startswith(problem)
