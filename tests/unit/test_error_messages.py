"""Error messages go back to clients: never a filesystem path (the log keeps it), never a
client's value echoed whole (R-API-9)."""

from __future__ import annotations

from pathlib import Path

from vllm_srun.adapters.serving.load_failures import public_reason
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import quoted, without_paths
from vllm_srun.domain.settings.engine_args import EngineArgs


def test_paths_become_their_last_part() -> None:
    assert without_paths("no such file: '/srv/models/m/model.safetensors'") == "no such file: 'model.safetensors'"
    assert without_paths("under /var/lib/x/ and ~/y/z.bin") == "under <path> and z.bin"
    assert without_paths("3/4 of http://host:8100/v1 and a/b") == "3/4 of http://host:8100/v1 and a/b"


def test_echoed_values_are_cut() -> None:
    assert quoted("abc") == "'abc'"
    long = quoted("m" * 1_000_000)
    assert len(long) < 100 and long.endswith("(1000002 characters)")


def test_a_failed_models_reason_names_the_model_not_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "store" / "tiny"
    served = ServedModel(name="tiny", artifact=str(folder), args=EngineArgs(), device="cpu", folder=folder)
    reason = public_reason(OSError(f"cannot read {folder}/model.safetensors: bad header"), served)
    assert reason == "OSError: cannot read tiny/model.safetensors: bad header"
    assert str(tmp_path) not in public_reason(ValueError(f"{tmp_path}/elsewhere/x.json is broken"), served)
