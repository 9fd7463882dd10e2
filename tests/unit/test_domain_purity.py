"""The domain stays pure (R-BAT-8): no torch, no I/O, no event loop, no clock reads."""

from __future__ import annotations

import ast
from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[2] / "src" / "domain"
FORBIDDEN = {
    "torch",
    "numpy",
    "anyio",
    "asyncio",
    "litestar",
    "yaml",
    "httpx",
    "onnxruntime",
    "triton",
    "uvicorn",
    "socket",
    "subprocess",
    "os",
    "io",
    "time",
    "random",
    "threading",
    "multiprocessing",
    "pathlib",
    "shutil",
    "tempfile",
    "requests",
    "urllib",
    "http",
    "logging",
    "sys",
    "signal",
    "select",
    "datetime",
    "prometheus_client",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_domain_modules_exist() -> None:
    assert len(list(DOMAIN.rglob("*.py"))) >= 8


def test_domain_imports_no_io_or_device_library() -> None:
    offenders = {}
    for path in sorted(DOMAIN.rglob("*.py")):
        bad = _imports(path) & FORBIDDEN
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_domain_never_imports_adapters_or_app() -> None:
    for path in sorted(DOMAIN.rglob("*.py")):
        text = path.read_text()
        assert "vllm_srun.adapters" not in text and "vllm_srun.app" not in text, path.name


def test_purity_check_catches_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom time import monotonic\n")
    assert _imports(bad) & FORBIDDEN == {"torch", "time"}
