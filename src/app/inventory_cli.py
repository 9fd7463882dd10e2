"""`vllm-srun models`, `vllm-srun plugins`, `vllm-srun devices`: what this install can serve,
with what, and where (docs/serving.md; R-PKG-6, R-DEV-4).

- `models`: the built-in catalog (`adapters/catalog.py`): each name, its family, its size, what
  it is, the Hugging Face repository its weights come from, how they arrive, and whether the model
  store holds it yet (a table; `--json` for a list of objects);
- `plugins`: JSON of the installed families and engines with their distributions, versions and
  capabilities, and the profiles (`adapters/plugin_report.py`);
- `devices`: JSON of each device present, what it offers, and what `--device auto` (the
  default of `serve`) takes (`adapters/devices/report.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    models = sub.add_parser("models", help="list the built-in models: what each is and where its weights come from")
    models.add_argument("--json", action="store_true", help="print a JSON list instead of a table (default: a table)")
    sub.add_parser("plugins", help="print the installed families and engines, with their capabilities, as JSON")
    sub.add_parser("devices", help="print the devices here, what each offers, and what --device auto takes, as JSON")


def catalog_rows() -> list[dict[str, Any]]:
    """The built-in catalog, one object per model (`vllm-srun models --json`)."""
    from vllm_srun.adapters.catalog import CATALOG, DEFAULT_MODEL
    from vllm_srun.adapters.model_store import LocalModelStore

    root = LocalModelStore.from_env().root
    return [
        {
            "name": entry.name,
            "family": entry.family,
            "size": entry.size or None,
            "what": entry.what,
            "repo": entry.repo,
            "weights": entry.weights(),
            "in_store": (root / entry.name / "config.json").is_file(),
            "default": entry.name == DEFAULT_MODEL,
        }
        for entry in CATALOG.values()
    ]


def models(ns: argparse.Namespace) -> int:
    rows = catalog_rows()
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("NAME", "FAMILY", "SIZE", "REPO", "STORE", "WHAT", "WEIGHTS")]
    for row in rows:
        store = "pulled" if row["in_store"] else f"not yet (vllm-srun pull {row['name']})"
        table.append(
            (row["name"], row["family"], row["size"] or "?", row["repo"] or "-", store, row["what"], row["weights"])
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1])
    return 0


def plugins(_ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.devices.torch_devices import open_device
    from vllm_srun.adapters.engines.registry import installed_engines
    from vllm_srun.adapters.families.registry import FamilyRegistry
    from vllm_srun.adapters.plugin_report import plugin_report

    devices = [open_device("cpu")]
    auto = open_device("auto")
    if auto.name != "cpu":
        devices.append(auto)
    print(json.dumps(plugin_report(FamilyRegistry(), installed_engines(), devices), indent=2))
    return 0


def devices(_ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.devices.report import device_report
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget

    print(json.dumps(device_report(cpus=front_cpu_budget()), indent=2))
    sys.stdout.flush()
    return 0


def run(ns: argparse.Namespace) -> int:
    command = {"models": models, "plugins": plugins, "devices": devices}[ns.command]
    return command(ns)
