"""Which tracer a process runs with, from the standard `OTEL_*` variables (docs/tracing.md).

Off unless `OTEL_TRACES_EXPORTER` names an exporter (`console`, `otlp`, or both comma-separated;
`none` or empty: off); `OTEL_SDK_DISABLED=true` turns it off whatever the exporter. Off, nothing
of OpenTelemetry is imported. On, the SDK (`otel.py`) is imported; an exporter this install
lacks (the SDK, or `opentelemetry-exporter-otlp` for `otlp`) or does not know is
`TracingUnavailable`, one line, and the CLIs refuse to start with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_srun.adapters.tracing.port import NOOP, Tracer, TracingUnavailable

EXPORTERS = ("console", "otlp")
INSTALL = "pip install 'vllm-srun[tracing]'"


def exporters_asked(env: Mapping[str, str]) -> tuple[str, ...]:
    """The exporters ENV asks for; () when tracing is off. TracingUnavailable: one it does not know."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    names = tuple(n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip())
    names = tuple(n for n in names if n != "none")
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise TracingUnavailable(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']}: unknown exporter {unknown[0]!r} "
            f"(this build has {', '.join(EXPORTERS)}, or none)"
        )
    return tuple(dict.fromkeys(names))


def tracer_from_env(env: Mapping[str, str], service: str) -> Tracer:
    """The tracer ENV asks for; SERVICE names this process where `OTEL_SERVICE_NAME` does not."""
    exporters = exporters_asked(env)
    if not exporters:
        return NOOP
    try:
        from vllm_srun.adapters.tracing import otel
    except ImportError as exc:
        raise TracingUnavailable(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']} needs opentelemetry-sdk ({exc.name} is missing: {INSTALL})"
        ) from None
    return otel.tracer_for(exporters, env, service)
