"""`GET /health/live`: always 200 while the process answers HTTP (worker and front alike)."""

from __future__ import annotations

from litestar import Response, get


@get("/health/live")
async def live() -> Response[bytes]:
    return Response(content=b'{"status":"alive"}', media_type="application/json")
