"""Which GPUs this host offers, for placing new GPU workers (R-REP-1). Imports torch only when
asked, so a CPU front never pays for it."""

from __future__ import annotations


def detect_gpus() -> tuple[str, list[int]]:
    """(platform, usable GPU ids): ("cuda"|"rocm", [0, 1, …]) or ("cpu", [])."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cpu", []
    if not torch.cuda.is_available():
        return "cpu", []
    platform = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return platform, list(range(torch.cuda.device_count()))
