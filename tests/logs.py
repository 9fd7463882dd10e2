"""Where tests put the logs of the servers they start: a folder of pytest's own temporary tree
(`tmp_path_factory`, set by tests/conftest.py for the session; pytest keeps the last few runs
and removes older ones), never the system temp directory itself."""

from __future__ import annotations

import tempfile
from pathlib import Path

_folder: Path | None = None


def use_folder(folder: Path) -> None:
    """Put this session's server logs in FOLDER (tests/conftest.py, once per session)."""
    global _folder
    _folder = folder


def log_path(name: str) -> Path:
    """The path of the server log NAME (outside pytest: a fresh folder of its own)."""
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="vllm-srun-test-logs-"))
    return _folder / name
