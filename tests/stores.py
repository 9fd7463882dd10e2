"""The model store the tests use: the user's store for packages (MiniLM, SmolLM2 are pulled there
once), but an engine cache of the test session's own, so kernel timings measured while the suite
loads the machine never reach a user's store.

In-process runtimes get it by overriding the container's `store` provider; processes the tests
start get it through `subprocess_env()` (`VLLM_SRUN_ENGINE_CACHE`). Nothing mutates os.environ.
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm_srun.adapters.model_store import ENGINE_CACHE_ENV, LocalModelStore

_engine_cache: Path | None = None  # set once per session by tests/conftest.py


def set_engine_cache(path: Path) -> None:
    global _engine_cache
    _engine_cache = path


def session_store() -> LocalModelStore:
    return LocalModelStore(LocalModelStore.from_env().root, _engine_cache)


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if _engine_cache is not None:
        env[ENGINE_CACHE_ENV] = str(_engine_cache)
    env.update(extra or {})
    return env
