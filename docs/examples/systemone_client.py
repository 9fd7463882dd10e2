"""Ask a served decision model three typed questions with the official `typesafe-sdk` client.

    pip install -e '.[clients]'      # the typesafe-sdk client (not a dependency of the server)
    vllm-srun fixture /tmp/tiny-decision --family decision      # or serve SmolLM2-135M-Instruct
    vllm-srun serve /tmp/tiny-decision &
    until curl -sf localhost:8100/health > /dev/null; do sleep 1; done
    python docs/examples/systemone_client.py http://127.0.0.1:8100 tiny-decision

(tests/e2e/test_decisions_e2e.py runs this file against a real server.)
"""

from __future__ import annotations

import sys

from typesafe_sdk import Choice, Noul, Score, TypeSafeClient


def main(base_url: str, model: str) -> None:
    # the API key is required by the client and ignored by vllm-srun
    with TypeSafeClient(api_key="unused", base_url=base_url, model=model) as client:
        result = client.system_one(
            state="I was charged twice. Please help.",
            questions={
                "billing": Noul(instructions="Is this about billing?"),
                "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": "An upset message"}),
                "urgency": Score(instructions="How urgent is it?", criteria=["Can wait", "This week", "Today"]),
            },
        )
    print(f"billing: P(yes) = {result.nouls['billing'].noul:.3f}")
    print(f"tone: {result.choices['tone'].choice} ({result.choices['tone'].confidence:.3f})")
    print(f"urgency: {result.scores['urgency'].score:.2f} of {max(result.scores['urgency'].legend)}")
    print(f"input tokens: {result.usage.input_tokens}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
