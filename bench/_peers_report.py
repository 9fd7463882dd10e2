"""What `bench/peers.py` prints and writes: per-shape tables, every target's ratio with met/MISSED.

`results` is the JSON document peers.py writes (`--json`): servers (wrk figures per shape, RSS,
parity), offline peers (texts/s per shape), the FP32 ceilings, and the shapes' token and GFLOP
figures. `targets(results)` derives the ratios from it, so a saved document can be re-read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OURS = "ours"
FRONT = "ours (front)"
FRONT_WHOLE = "ours (front, worker at the whole CPU budget)"  # VLLM_SRUN_CPU_THREADS=cores (R-CPU-1's override)
INT8 = "ours int8"
VLLM = "vLLM CPU"
INFINITY = "Infinity"
ST = "sentence-transformers"
ORT_FP32 = "ORT FP32"
ORT_INT8 = "ORT int8"
RSS_TARGET = 0.5  # "well under vLLM's": read here as at most half


@dataclass
class Ratio:
    what: str
    shape: str
    value: float | None
    target: str
    met: bool | None
    note: str = ""

    def line(self) -> str:
        shown = "   -  " if self.value is None else f"{self.value:6.2f}"
        verdict = "not measured" if self.met is None else ("met" if self.met else "MISSED")
        note = f"  ({self.note})" if self.note else ""
        return f"  {self.what:34s} {self.shape:6s} {shown}  target {self.target:12s} {verdict}{note}"


def rps(results: dict[str, Any], name: str, shape: str) -> float | None:
    """req/s of a server or texts/s of an offline peer, on SHAPE; None when it did not run."""
    if name in results["servers"]:
        got = results["servers"][name]["shapes"].get(shape)
        return got["load"]["rps"] if got else None
    got = results["offline"].get(name, {}).get(shape)
    return got["rate"] if got else None


def load_at(results: dict[str, Any], name: str, shape: str, connections: int) -> dict[str, Any] | None:
    """A server's load on SHAPE at CONNECTIONS (the main one, the lone request's or a sweep's)."""
    got = results["servers"].get(name, {}).get("shapes", {}).get(shape)
    if not got:
        return None
    loads = [got["load"], *([got["lone"]] if got.get("lone") else []), *got.get("sweep", [])]
    return next((x for x in loads if x["connections"] == connections), None)


def _lone_p50(results: dict[str, Any], name: str, shape: str) -> float | None:
    got = results["servers"].get(name, {}).get("shapes", {}).get(shape)
    return got["lone"]["p50_ms"] if got and got.get("lone") else None


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def targets(results: dict[str, Any]) -> list[Ratio]:
    """Every target of issue 21 (and the earlier Infinity / sentence-transformers ones), per shape."""
    out: list[Ratio] = []
    ours_names = [n for n, s in results["servers"].items() if s.get("role") == "ours"]
    for shape in results["shapes"]:
        for name in ours_names:
            ours = rps(results, name, shape)
            for peer, target in ((VLLM, 1.2), (ORT_FP32, 1.5), (INFINITY, 2.5), (ST, 1.1)):
                r = _div(ours, rps(results, peer, shape))
                out.append(Ratio(f"{name} ÷ {peer}", shape, r, f">= {target}", None if r is None else r >= target))
            mine, theirs = _lone_p50(results, name, shape), _lone_p50(results, VLLM, shape)
            r = _div(mine, theirs)
            out.append(
                Ratio(
                    f"{name} lone p50 ÷ {VLLM}'s",
                    shape,
                    r,
                    "<= 1.0",
                    None if r is None else r <= 1.0,
                    "" if r is None else f"{mine:.1f} vs {theirs:.1f} ms, 1 connection",
                )
            )
        r = _div(rps(results, INT8, shape), rps(results, ORT_INT8, shape))
        cos = results["servers"].get(INT8, {}).get("shapes", {}).get(shape, {}).get("cosine_to_ours")
        ok = None if r is None or cos is None else (r >= 1.2 and cos["min"] >= 0.99)
        note = "no --int8-package" if INT8 not in results["servers"] else ""
        if cos is not None:
            note = f"min cosine to ours FP32 {cos['min']:.4f} (target >= 0.99)"
        out.append(Ratio(f"{INT8} ÷ {ORT_INT8}", shape, r, ">= 1.2", ok, note))
        for name, why in ((FRONT, ""), (FRONT_WHOLE, "; worker threads as direct")):
            front = results["servers"].get(name, {}).get("shapes", {}).get(shape)
            c = front["load"]["connections"] if front else None
            direct = load_at(results, OURS, shape, c) if c else None
            r = _div(front["load"]["rps"] if front else None, direct["rps"] if direct else None)
            note = f"both at {c} connections{why}" if r is not None else ""
            out.append(Ratio(f"{name} ÷ {OURS} direct", shape, r, ">= 0.95", None if r is None else r >= 0.95, note))
    ours_rss = results["servers"].get(OURS, {}).get("rss_after_mib")
    vllm_rss = results["servers"].get(VLLM, {}).get("rss_after_mib")
    r = _div(ours_rss, vllm_rss)
    note = "" if r is None else f"{ours_rss:.0f} vs {vllm_rss:.0f} MiB, process trees after the loads"
    out.append(
        Ratio(f"{OURS} RSS ÷ {VLLM}'s", "all", r, f"<= {RSS_TARGET}", None if r is None else r <= RSS_TARGET, note)
    )
    return out


def print_report(results: dict[str, Any]) -> list[Ratio]:
    ceiling = results["ceiling"]
    print(f"\n# after: {results['load_after']}")
    print(f"# FP32 peak (derived): {ceiling['peak_derivation']}")
    print(
        f"# measured FP32 ceiling: oneDNN linear {ceiling['onednn_gflops']:.0f} GFLOP/s "
        f"({ceiling['onednn_shape']}, best of {ceiling['repeats']}, {ceiling['threads']} threads); "
        f"MKL sgemm (torch.matmul) {ceiling['sgemm_gflops']:.0f} GFLOP/s ({ceiling['sgemm_shape']}). "
        "÷ceil below is GFLOP/s ÷ the oneDNN figure"
    )
    names = list(results["servers"]) + list(results["offline"])
    width = max(22, *(len(n) for n in names))
    for shape, info in results["shapes"].items():
        print(
            f"\n## {shape} texts ({info['tokens_mean']:.1f} tokens, {info['tokens_min']}–{info['tokens_max']}; "
            f"{info['gflop_per_request']:.3f} GFLOP per request on average)"
        )
        print(
            f"{'':{width}s} {'conn':>4s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'lone p50':>9s} {'GFLOP/s':>8s} "
            f"{'÷ceil':>6s}"
        )
        for name in names:
            rate = rps(results, name, shape)
            if rate is None:
                continue
            server = results["servers"].get(name)
            if server is not None:
                got = server["shapes"][shape]
                load, lone = got["load"], got.get("lone")
                lat = f"{load['connections']:4d} {rate:8.1f} {load['p50_ms']:8.1f} {load['p99_ms']:8.1f} " + (
                    f"{lone['p50_ms']:9.1f}" if lone else f"{'-':>9s}"
                )
                errors = f"  {load['errors']} errors (429s...) not counted" if load["errors"] else ""
            else:
                lat = f"{'-':>4s} {rate:8.1f} {'-':>8s} {'-':>8s} {'-':>9s}"
                errors = f"  (offline, batch {results['offline'][name][shape]['batch']})"
            achieved = rate * info["gflop_per_request"]
            print(f"{name:{width}s} {lat} {achieved:8.1f} {achieved / ceiling['onednn_gflops']:6.2f}{errors}")
    print("\n## memory (VmRSS summed over each server's process tree)")
    for name, server in results["servers"].items():
        print(
            f"  {name:{width}s} {server['rss_ready_mib']:7.0f} MiB when ready, {server['rss_after_mib']:7.0f} MiB "
            f"after the loads ({server['processes']} processes)"
        )
    parity = [
        (n, shape, s["shapes"][shape]["cosine_to_ours"])
        for n, s in results["servers"].items()
        for shape in s["shapes"]
        if s["shapes"][shape].get("cosine_to_ours")
    ]
    if parity:
        print("\n## same model? (cosine of each server's embeddings to ours FP32, same texts)")
        for name, shape, cos in parity:
            print(f"  {name:{width}s} {shape:6s} min {cos['min']:.6f}  mean {cos['mean']:.6f}  ({cos['texts']} texts)")
    ort = results.get("ort")
    if ort:
        cos = ", ".join(f"{s} min {c['min']:.3f} mean {c['mean']:.3f}" for s, c in ort["cosine_int8_vs_fp32"].items())
        print(f"\n## ONNX Runtime {ort['onnxruntime']}: fusions {ort['fusions']}; int8 vs FP32 cosine: {cos}")
        diff = ", ".join(f"{s} {d:.1e}" for s, d in ort["fp32_max_abs_vs_torch"].items())
        print(f"  FP32 graph vs the torch model it was exported from, largest |difference|: {diff}")
    if results["skipped"]:
        print("\n## not run")
        for name, why in results["skipped"].items():
            print(f"  {name}: {why}")
    ratios = targets(results)
    print("\n## targets (issue 21; measured side by side in this run)")
    for ratio in ratios:
        print(ratio.line())
    return ratios


def ratios_json(ratios: list[Ratio]) -> list[dict[str, Any]]:
    return [asdict(r) for r in ratios]
