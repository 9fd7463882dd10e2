"""`vllm-sr`: the deployment front (see issue on `vllm-sr serve`)."""

from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print("vllm-sr: not yet: the deployment front is not built in this release", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
