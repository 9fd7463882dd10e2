"""`GET /health/live`: always 200 while the process answers HTTP (worker and front alike), with
the contract version it speaks (`{api_version, status: "alive"}`)."""

from __future__ import annotations

from litestar import Response, get

from vllm_srun.adapters.schemas.common import json_encoder
from vllm_srun.adapters.schemas.health import LIVE

BODY = json_encoder.encode(LIVE)


@get("/health/live")
async def live() -> Response[bytes]:
    return Response(content=BODY, media_type="application/json")
