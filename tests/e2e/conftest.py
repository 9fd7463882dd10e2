from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server import running_server


@pytest.fixture(scope="session")
def minilm_server(minilm_dir: Path) -> Iterator[str]:
    """The embedded default, served the way the README says: `vllm-srun serve` with no MODEL."""
    # the batching tests count forwards of repeated texts: no result cache here (test_encoder_e2e has it on)
    with running_server("--max-request-bytes", "200000", "--result-cache-entries", "0") as base:
        yield base
