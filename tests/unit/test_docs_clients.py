"""What README and docs/examples import is installable as they say: every third-party module an
example imports comes from a dependency of the server or from the `clients` extra that README's
client section and each example's docstring name (`pip install -e '.[clients]'`)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
CLIENT_DISTRIBUTIONS = {"openai", "cohere", "typesafe-sdk"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "vllm_srun"}


def test_every_example_import_is_a_dependency_or_in_the_clients_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    server = {_name(r) for r in project["dependencies"]}
    clients = {_name(r) for r in project["optional-dependencies"]["clients"]}
    assert clients == CLIENT_DISTRIBUTIONS
    owners = packages_distributions()
    for example in sorted(EXAMPLES.glob("*.py")):
        for module in _imports(example):
            dists = {_name(d) for d in owners.get(module, [module])}
            assert dists & (server | clients), f"{example.name} imports {module} ({dists}): in no install extra"
            if dists & clients and not dists & server:
                assert "'.[clients]'" in example.read_text(), f"{example.name} does not say how to get {module}"


def test_readme_says_where_the_openai_client_comes_from() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("The official clients work unmodified") :][:600]
    assert "'.[clients]'" in section and "import openai" in section
