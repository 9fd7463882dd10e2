"""Type-check the real files under `src/` as the package `vllm_srun` (mypy; `.ci/run`).

Our packaging maps the import name `vllm_srun` onto the folder `src/` (setup.py
`package_dir`), and an editable install reaches it through an import hook that mypy cannot see.
So this script shows mypy the mapping itself: a temporary folder holding one symlink,
`vllm_srun -> <repo>/src`, goes on mypy's search path, mypy checks the package `vllm_srun`
(whose files are the real files under `src/`), and every path in its report is written back
as `src/...`. Settings (strict for `vllm_srun.domain`, checked for the rest) live in
pyproject.toml `[tool.mypy]`.

    python tools/typecheck.py [mypy options]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from mypy import api

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="srun-typecheck-") as tmp:
        (Path(tmp) / "vllm_srun").symlink_to(REPO / "src", target_is_directory=True)
        os.environ["MYPYPATH"] = tmp
        cwd = os.getcwd()
        os.chdir(tmp)  # mypy names files relative to the working folder: vllm_srun/...
        try:
            out, err, status = api.run(["--config-file", str(REPO / "pyproject.toml"), "-p", "vllm_srun", *argv])
        finally:
            os.chdir(cwd)
    for line in out.splitlines():
        print("src/" + line[len("vllm_srun/") :] if line.startswith("vllm_srun/") else line)
    if err:
        print(err, file=sys.stderr, end="")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
