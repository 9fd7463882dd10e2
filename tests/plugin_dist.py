"""Install a plugin distribution the way pip would, as far as entry points go: a
`NAME-VERSION.dist-info` folder with `METADATA` and `entry_points.txt` in a site folder, found by
`importlib.metadata` once the folder is on `sys.path` (a subprocess's PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.stores import subprocess_env

REPO = Path(__file__).resolve().parents[1]
# the test plugin distribution: the torch-free fake family and its engine, and `acme`, an engine
# for our encoder family that wraps the native one and refuses settings of its own
FAKE_PLUGINS = {
    "vllm_srun.families": {"fake": "tests.fake_family:FakeFamily"},
    "vllm_srun.engines": {"fake": "tests.fake_family:FakeEnginePlugin", "acme": "tests.plugin_engine:AcmeEnginePlugin"},
}


def write_distribution(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> Path:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")
    return info


def plugin_env(site: Path) -> dict[str, str]:
    """The environment of a process that sees the distributions in SITE and imports `tests`."""
    path = os.pathsep.join(filter(None, [str(site), str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess_env({"PYTHONPATH": path})
