#!/usr/bin/env bash
# One embeddings request with meta: how long it queued, how long its forward took, and
# how many padded tokens that forward counted.
#     bash docs/examples/embeddings_meta.sh [BASE_URL]
set -euo pipefail
base="${1:-http://127.0.0.1:8100}"
curl -sS -i "$base/v1/embeddings" -H 'content-type: application/json' \
  -d '{"input": ["route this to billing", "is this a medical question?"], "encoding_format": "base64", "options": {"return_meta": true}}'
