"""Tracing (OpenTelemetry, docs/tracing.md): the port and its no-op (`port.py`), the choice from the
`OTEL_*` variables (`setup.py`) and the SDK behind it (`otel.py`, imported only when tracing is on)."""
