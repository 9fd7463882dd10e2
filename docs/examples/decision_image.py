"""Ask a decision model that reads images a yes/no question about a picture (stdlib only).

    vllm-srun fixture /tmp/tiny-vision --family decision --variant qwen3_5_vision
    vllm-srun serve /tmp/tiny-vision &
    until curl -sf localhost:8100/health > /dev/null; do sleep 1; done
    python docs/examples/decision_image.py http://127.0.0.1:8100 tiny-vision picture.png

The picture travels in the request as a data URL (nothing is fetched from elsewhere); a video goes
the same way under "videos" (MP4, WebM, QuickTime or Matroska). The fixture's weights are random,
so its answers mean nothing; a real Qwen3.5 package with its vision tower answers the same way.
(tests/e2e/test_decision_media_e2e.py runs this file against a real server.)
"""

from __future__ import annotations

import base64
import json
import mimetypes
import sys
import urllib.error
import urllib.request


def main(base_url: str, model: str, picture: str) -> None:
    kind = mimetypes.guess_type(picture)[0] or "image/png"
    with open(picture, "rb") as f:
        url = f"data:{kind};base64," + base64.b64encode(f.read()).decode("ascii")
    body = {
        "model": model,
        "state": "A photo sent with a support ticket.",
        "images": [url],  # in front of the state's text, in this order
        "questions": {"outdoors": {"type": "noul", "instructions": "Was this taken outdoors?"}},
    }
    request = urllib.request.Request(
        f"{base_url}/v1/decisions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as refused:  # e.g. 400 invalid_request for a picture it cannot read
        sys.exit(f"{refused.code}: {json.load(refused)['error']['message']}")
    print(f"outdoors: P(yes) = {answer['answers']['outdoors']['noul']:.3f}")
    print(f"input tokens: {answer['usage']['input_tokens']} (the picture's included)")


if __name__ == "__main__":
    main(*sys.argv[1:4])
