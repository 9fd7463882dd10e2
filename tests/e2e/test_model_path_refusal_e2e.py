"""`vllm-srun serve` with a model path that does not exist, on the command line or in a models
file, is refused before anything loads: one line on stderr naming the path, exit status 2, no
server left running (it used to print a traceback and serve /health 503 `failed` forever). The
package-level refusals say "an encoder model" (the article follows the family)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vllm_srun.app.preflight import looks_like_path, missing_path_refusal


def serve(*argv: str) -> subprocess.CompletedProcess[str]:
    # port 9: were anything to listen, it would fail loudly rather than wait; the refusal comes first
    command = [sys.executable, "-m", "vllm_srun.app.cli", "serve", *argv, "--port", "9"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_model_path_that_does_not_exist_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "tiny-decision"
    line = one_line(serve(str(missing)))
    assert f"the model path {missing} does not exist" in line, line
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"x")
    assert f"the model path {weights} is not a folder" in one_line(serve(str(weights)))


def test_a_models_file_path_that_does_not_exist_is_refused_naming_it(tmp_path: Path, encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "judge"
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - artifact: {encoder_fixture('embed')}\n  - artifact: {missing}\n    name: judge\n")
    line = one_line(serve("--models", str(models)))
    assert "model judge:" in line and f"the model path {missing} does not exist" in line, line


def test_the_refusal_says_an_encoder_model(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    line = one_line(serve(str(encoder_fixture("embed")), "--max-model-len", "64"))
    assert "is an encoder model" in line, line


def test_a_name_neither_in_the_store_nor_the_catalog_is_refused_in_one_line() -> None:
    line = one_line(serve("nope-model"))
    assert "model 'nope-model' is not a folder, not in the model store, not a built-in name" in line, line


def test_a_name_is_not_a_path_and_keeps_its_resolution(tmp_path: Path) -> None:
    class Store:
        asked: list[str] = []

        def resolve(self, artifact: str, progress: object) -> Path:
            self.asked.append(artifact)
            return tmp_path

    store = Store()
    for name in ("all-MiniLM-L6-v2", "SmolLM2-135M-Instruct", "my-model"):
        assert not looks_like_path(name) and missing_path_refusal(name, store) is None  # type: ignore[arg-type]
    assert store.asked == [
        "my-model"
    ]  # a built-in name is left to the load (which may pull it); a store name is looked up
    for path in ("/models/x", "./x", "../x", "~/x", "models/x"):
        assert looks_like_path(path)
