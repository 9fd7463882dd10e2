"""Hugging Face Hub ids and the Hugging Face cache (R-PKG-5), through `huggingface_hub`.

A model argument `ORG/NAME`, `ORG/NAME@REV` (or `ORG/NAME` with `--revision REV`) names a Hub
repository at a branch, a tag or a commit. It resolves from the Hugging Face cache first
(`HF_HUB_CACHE`, `HF_HOME/hub`, or `--cache-dir`; branches and tags through the cache's `refs/`,
a 40-hex commit directly), without any network. Only when the cache lacks it, and only when the
process is not offline (`--offline`, `HF_HUB_OFFLINE=1`), it downloads the snapshot at that
revision into the cache, with huggingface_hub's progress bars. The folder it resolves to is the
cache's `snapshots/<commit>` folder, so where a served folder came from (`repo`, the 40-hex
`revision`) is read back from its path (`hub_origin`) without any record of ours.

Every failure is one line (`ModelNotFound`): a malformed id, a gated or missing repository, a
revision that does not exist, no network, an incomplete or unreadable cache entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_srun.domain.errors import ModelNotFound

# ORG/NAME as the Hub spells repository ids (letters, digits, `-`, `_`, `.`; no `--` or `..`), and
# an optional @REVISION (a branch, a tag such as `v1.0`, `refs/pr/1`, or a commit hash)
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]{{0,254}}))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# what a served package never reads: other frameworks' weights and exports (a repository often
# holds several copies of its weights); safetensors, configs, tokenizers and sentence-transformers
# module folders are kept
IGNORED_FILES = [
    "*.bin",
    "*.pth",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "*.onnx_data",
    "*.gguf",
    "*.tflite",
    "*.mlmodel",
    "onnx/*",
    "openvino/*",
    "coreml/*",
    "*.mlpackage/*",
]
_SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HubRef:
    """A Hub repository id and the revision asked for (None: the repository's default branch)."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def parse_hub_id(text: str, revision: str | None = None) -> HubRef | None:
    """TEXT as a Hub id (`ORG/NAME` or `ORG/NAME@REV`), or None when it is not written as one.

    REVISION (`--revision`) applies when TEXT names none; naming two different ones is refused.
    """
    match = HUB_ID.match(text)
    if match is None or ".." in text or "--" in match["repo"]:
        return None
    own = match["revision"]
    if own is not None and revision is not None and own != revision:
        raise ModelNotFound(f"{text} names revision {own} and --revision names {revision}: give one")
    return HubRef(match["repo"], own or revision)


def looks_like_hub_id(text: str) -> bool:
    """Whether TEXT is written as a Hub id (and not as a path: no leading `/`, `.`, `~`)."""
    try:
        return parse_hub_id(text) is not None
    except ModelNotFound:
        return True


def hub_origin(folder: Path) -> tuple[str, str] | None:
    """(repo, 40-hex revision) of a folder inside a Hugging Face cache snapshot, else None."""
    folder = Path(folder)
    commit, snapshots, repo_dir = folder.name, folder.parent, folder.parent.parent
    if not COMMIT.match(commit) or snapshots.name != "snapshots":
        return None
    match = _SNAPSHOT.match(repo_dir.name)
    if match is None:
        return None
    return f"{match['org']}/{match['name']}", commit


@dataclass(frozen=True)
class HubCache:
    """Where Hub snapshots are found and placed, and whether the network may be used."""

    cache_dir: Path | None = None  # None: huggingface_hub's own (HF_HUB_CACHE, HF_HOME/hub)
    offline: bool = False
    endpoint: str | None = None  # None: huggingface_hub's own (HF_ENDPOINT, default the public Hub)

    def resolve(self, ref: HubRef, progress: Progress) -> Path:
        """The snapshot folder of REF: from the cache without network, else downloaded (not offline)."""
        cached = self._cached(ref)
        if cached is not None:
            return cached
        if self.offline:
            raise ModelNotFound(
                f"{ref} is not in the Hugging Face cache ({self._where()}) and the runtime is offline "
                "(--offline or HF_HUB_OFFLINE=1): download it once without --offline"
            )
        progress(f"pull: downloading {ref} from the Hugging Face Hub into {self._where()}")
        folder = self._download(ref)
        origin = hub_origin(folder)
        progress(f"pull: {ref} ready at revision {origin[1] if origin else '?'} ({folder})")
        return folder

    def _where(self) -> str:
        if self.cache_dir is not None:
            return str(self.cache_dir)
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)

    def _cached(self, ref: HubRef) -> Path | None:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, IncompleteSnapshotError, LocalEntryNotFoundError

        try:
            folder = snapshot_download(
                ref.repo,
                revision=ref.revision,
                cache_dir=self.cache_dir,
                local_files_only=True,
                ignore_patterns=IGNORED_FILES,
            )
        except HFValidationError as exc:
            raise ModelNotFound(f"{ref} is not a valid Hugging Face repository id: {_first_line(exc)}") from None
        except IncompleteSnapshotError as exc:
            if self.offline:
                raise ModelNotFound(f"{ref}: the cached snapshot is incomplete: {_first_line(exc)}") from None
            return None
        except (LocalEntryNotFoundError, FileNotFoundError):
            return None
        except OSError as exc:
            raise ModelNotFound(f"{ref}: the Hugging Face cache entry cannot be read: {_first_line(exc)}") from None
        return _checked(Path(str(folder)), ref)

    def _download(self, ref: HubRef) -> Path:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            folder = snapshot_download(
                ref.repo,
                revision=ref.revision,
                cache_dir=self.cache_dir,
                ignore_patterns=IGNORED_FILES,
                endpoint=self.endpoint,
            )
        except GatedRepoError:
            raise ModelNotFound(
                f"{ref} is a gated repository: accept its terms on the Hub and set HF_TOKEN to a token with access"
            ) from None
        except RevisionNotFoundError:
            raise ModelNotFound(f"{ref}: revision {ref.revision} does not exist in {ref.repo}") from None
        except RepositoryNotFoundError:
            raise ModelNotFound(
                f"{ref}: no such repository on the Hub (or it is private: set HF_TOKEN to a token with access)"
            ) from None
        except LocalEntryNotFoundError as exc:
            cause = exc.__cause__
            why = f" ({type(cause).__name__})" if cause is not None else ""
            raise ModelNotFound(
                f"{ref} is not in the Hugging Face cache and the Hub cannot be reached{why}: "
                "check the network (HF_ENDPOINT) or copy the model into the cache"
            ) from None
        except HfHubHTTPError as exc:
            raise ModelNotFound(f"{ref}: the Hub answered {_first_line(exc)}") from None
        except OSError as exc:
            raise ModelNotFound(f"{ref}: the download failed: {_first_line(exc)}") from None
        return _checked(Path(str(folder)), ref)


def _checked(folder: Path, ref: HubRef) -> Path:
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise ModelNotFound(f"{ref} holds no config.json: it is not a model package in Hugging Face layout")
    return folder


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
