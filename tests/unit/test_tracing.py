"""Tracing's switch (the OTEL_* variables), the no-op port, and that tracing off imports nothing
of OpenTelemetry (docs/tracing.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_srun.adapters.tracing.port import NOOP, PASS_THROUGH, TracingUnavailable, incoming_trace_headers
from vllm_srun.adapters.tracing.setup import exporters_asked, tracer_from_env

PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ()),
        ({"OTEL_TRACES_EXPORTER": ""}, ()),
        ({"OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "OTLP, console,otlp"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, ()),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, ("console",)),
    ],
)
def test_tracing_is_off_unless_an_exporter_is_named(env: dict[str, str], expected: tuple[str, ...]) -> None:
    assert exporters_asked(env) == expected


def test_an_unknown_exporter_is_refused_in_one_line() -> None:
    with pytest.raises(TracingUnavailable) as refused:
        tracer_from_env({"OTEL_TRACES_EXPORTER": "zipkin"}, "vllm-srun")
    assert "'zipkin'" in str(refused.value) and "\n" not in str(refused.value)


def test_off_is_the_no_op_tracer_that_passes_the_clients_context_through() -> None:
    tracer = tracer_from_env({"OTEL_TRACES_EXPORTER": "none"}, "vllm-srun")
    assert tracer is NOOP and not tracer.enabled
    span = tracer.front_request({"headers": []})
    assert span is PASS_THROUGH  # the same object every request: nothing allocated
    scope = {"headers": [(b"host", b"x"), (b"traceparent", PARENT), (b"tracestate", b"a=1"), (b"accept", b"*/*")]}
    assert span.context_headers(scope) == ((b"traceparent", PARENT), (b"tracestate", b"a=1"))
    assert span.context_headers({"headers": [(b"host", b"x")]}) == ()


def test_incoming_trace_headers_keeps_only_the_w3c_ones() -> None:
    assert incoming_trace_headers([(b"x-traceparent", b"1"), (b"tracestate", b"b=2")]) == ((b"tracestate", b"b=2"),)


CHECK_IMPORTS = """
import json, sys
from vllm_srun.adapters.config.loader import load_config_data
from vllm_srun.adapters.http import app as worker_app
from vllm_srun.adapters.serving import scheduler_loop
from vllm_srun.app.bootstrap import bootstrap_front, bootstrap_worker
config = load_config_data({"global": {"model_catalog": {"deployments": {}}}})
front = bootstrap_front(config, socket_dir="/nonexistent")
front.app()
tracer = bootstrap_worker().tracer()
ours = ("opentelemetry.trace", "opentelemetry.sdk", "opentelemetry.context", "opentelemetry.exporter", "opentelemetry.propagat")
print(json.dumps({"enabled": tracer.enabled, "otel": sorted(m for m in sys.modules if m.startswith(ours))}))
"""


def _imports(env: dict[str, str]) -> dict[str, object]:
    """Whether the tracer is on, and which of the OpenTelemetry modules tracing uses are imported
    once the front's app and the worker's tracer are built. (litestar's app probes for its own
    OpenTelemetry plugin, importing `opentelemetry` and `opentelemetry.semconv` when they are
    installed: not ours, and not counted.)"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORTS], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_tracing_off_imports_nothing_of_opentelemetry() -> None:
    off = _imports({})
    assert off == {"enabled": False, "otel": []}
    disabled = _imports({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert disabled == {"enabled": False, "otel": []}


def test_tracing_on_imports_the_sdk() -> None:
    pytest.importorskip("opentelemetry.sdk")
    on = _imports({"OTEL_TRACES_EXPORTER": "console"})
    assert on["enabled"] is True and "opentelemetry.sdk.trace" in on["otel"]  # type: ignore[operator]


WITHOUT_OTLP = """
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("opentelemetry.exporter"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
from vllm_srun.adapters.tracing.setup import tracer_from_env
try:
    tracer_from_env({"OTEL_TRACES_EXPORTER": "otlp"}, "vllm-srun")
except ValueError as exc:
    print(exc)
"""


def test_otlp_without_its_package_is_a_one_line_refusal() -> None:
    pytest.importorskip("opentelemetry.sdk")
    done = subprocess.run([sys.executable, "-c", WITHOUT_OTLP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert "\n" not in line and "opentelemetry-exporter-otlp" in line and "vllm-srun[tracing]" in line
