"""Draw what `bench/peers.py --json OUT` measured (matplotlib: `pip install -e '.[bench]'`):

  peers_throughput.png  requests/s per text shape and peer (servers: wrk at the run's connection
                        count; offline peers: texts/s at their best batch size, hatched);
  peers_latency.png     p50 and p99 against offered load (wrk connections), one panel per shape,
                        a line per server (the runs of `--sweep`, with the main load and the lone
                        request).

The run's conditions (connections, seconds, CPUs, load before and after) go in the titles.

    python bench/plot_peers.py OUT.json [--out docs/img]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _peers_report import rps

DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def conditions(results: dict[str, Any]) -> str:
    c = results["conditions"]
    return (
        f"{c['model']}, {c['cpus']} CPUs, wrk {c['connections']} conn × {c['seconds']:g} s, "
        f"one text per request; {c['started']}"
    )


def _other_connections(results: dict[str, Any], name: str) -> str:
    """' (N conn)' where a server's main load ran at another count than the run's (the front)."""
    counts = {g["load"]["connections"] for g in results["servers"][name]["shapes"].values()}
    main = results["conditions"]["connections"]
    return "" if counts <= {main} else f" ({', '.join(str(c) for c in sorted(counts))} conn)"


def throughput(results: dict[str, Any], out: Path) -> Path:
    import matplotlib.pyplot as plt

    shapes = list(results["shapes"])
    names = [n for n in [*results["servers"], *results["offline"]] if any(rps(results, n, s) for s in shapes)]
    fig, ax = plt.subplots(figsize=(10, 5.2))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [rps(results, name, s) or 0.0 for s in shapes]
        offline = name in results["offline"]
        label = name + (" (offline)" if offline else _other_connections(results, name))
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(shapes))]
        bars = ax.bar(xs, values, width, label=label, hatch="//" if offline else None)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{s}\n({results['shapes'][s]['tokens_mean']:.0f} tokens)" for s in shapes])
    ax.set_yscale("log")
    ax.set_ylabel("requests/s (offline: texts/s), log scale")
    ax.set_title(f"Throughput by text shape\n{conditions(results)}", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    path = out / "peers_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _points(server: dict[str, Any], shape: str) -> list[dict[str, Any]]:
    """A server's loads on SHAPE: the main one, the lone request's, the sweep's."""
    got = server["shapes"].get(shape)
    if not got:
        return []
    return [got["load"], *([got["lone"]] if got.get("lone") else []), *got.get("sweep", [])]


def latency(results: dict[str, Any], out: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, ScalarFormatter

    shapes = list(results["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.6 * len(shapes), 4.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for i, (name, server) in enumerate(results["servers"].items()):
            if not _points(server, shape):
                continue
            points = {p["connections"]: p for p in _points(server, shape)}
            xs = sorted(points)
            color = f"C{i}"
            ax.plot(xs, [points[c]["p50_ms"] for c in xs], "o-", color=color, label=f"{name} p50")
            ax.plot(xs, [points[c]["p99_ms"] for c in xs], "s--", color=color, alpha=0.6, label=f"{name} p99")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({p["connections"] for s in results["servers"].values() for p in _points(s, shape)})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.set_xlabel("offered load: wrk connections")
        ax.set_ylabel("latency, ms (log)")
        ax.set_title(f"{shape} ({results['shapes'][shape]['tokens_mean']:.0f} tokens)", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"p50 / p99 against offered load — {conditions(results)}", fontsize=9)
    fig.tight_layout()
    path = out / "peers_latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="the JSON file bench/peers.py --json wrote")
    ap.add_argument("--out", type=Path, default=DOCS_IMG, help="folder for the PNGs")
    args = ap.parse_args()
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_peers: matplotlib is not installed (pip install -e '.[bench]')")
    matplotlib.use("Agg")
    try:
        results = json.loads(args.results.read_text())
        missing = [k for k in ("conditions", "shapes", "servers", "offline") if k not in results]
        if missing:
            raise KeyError(", ".join(missing))
    except (OSError, ValueError, KeyError) as exc:
        sys.exit(f"plot_peers: {args.results} is not a bench/peers.py --json document ({exc})")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (throughput(results, args.out), latency(results, args.out)):
        print(path)


if __name__ == "__main__":
    main()
