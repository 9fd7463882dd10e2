"""`adapters/serving/load_failures` (R-LOAD-1): which load failures are worth another attempt."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vllm_srun.adapters.serving.load_failures import PackageSnapshot, transient_cause
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound


class OutOfMemoryError(RuntimeError):
    """Named as torch names its device out-of-memory error (matched by name: no torch import)."""


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        (OSError(errno.EIO, "Input/output error"), "EIO"),
        (OSError(errno.EBUSY, "Device or resource busy"), "EBUSY"),
        (OSError(errno.ESTALE, "Stale file handle"), "ESTALE"),
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of memory"),
        (RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable"), "busy"),
        (RuntimeError("HIP out of memory"), "out of memory"),
        (MemoryError(), "host is out of memory"),
    ],
)
def test_transient_failures(exc: BaseException, why: str) -> None:
    cause = transient_cause(exc)
    assert cause is not None and why in cause


def test_a_cause_under_a_wrapper_counts() -> None:
    wrapped = ValueError("could not read the weights")
    wrapped.__cause__ = OSError(errno.EIO, "Input/output error")
    assert transient_cause(wrapped) is not None


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory"),  # a package that lacks a file
        PermissionError(errno.EACCES, "Permission denied"),
        ValueError("the encoder family's model lacks embed"),  # a capability
        InvalidRequest("tiny: no model family serves this package"),  # the package
        ModelNotFound("acme/x is not in the Hugging Face cache and the runtime is offline"),
        RuntimeError("size mismatch for encoder.layer.0.weight"),
        KeyError("embeddings.word_embeddings.weight"),
    ],
)
def test_final_failures(exc: BaseException) -> None:
    assert transient_cause(exc) is None


def test_a_domain_error_is_final_whatever_it_wraps() -> None:
    refused = InvalidRequest("tiny: srun.json names unknown family 'x'")
    refused.__cause__ = OSError(errno.EIO, "Input/output error")
    assert transient_cause(refused) is None


def test_a_package_that_changed_while_read_is_read_again(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = PackageSnapshot.of(tmp_path)
    assert PackageSnapshot.of(tmp_path) == before  # nothing moved: the same files
    assert transient_cause(ValueError("truncated"), changed=False) is None
    with open(tmp_path / "model.safetensors", "ab") as still_written:
        still_written.write(b"more")
    assert PackageSnapshot.of(tmp_path) != before
    assert "changed while it was read" in (transient_cause(ValueError("truncated"), changed=True) or "")
    os.remove(tmp_path / "config.json")
    assert PackageSnapshot.of(tmp_path) != before
    assert PackageSnapshot.of(None) == PackageSnapshot.of(tmp_path / "nowhere") == PackageSnapshot(frozenset())
