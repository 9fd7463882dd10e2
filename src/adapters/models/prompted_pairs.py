"""(query, document) pairs for yes/no rerankers (the Qwen3-Reranker recipe): one prompt per pair.

A decoder reranker reads each pair as one text, `prefix + query_template(instruction, query,
document) + suffix`, and answers with the next token: `yes` or `no`. The prompt and the answer
tokens come from the package's `srun.json` key `rerank` (`RerankPrompt.from_manifest`; every field
optional, the defaults are the published Qwen3-Reranker ones):

    {"yes": "yes", "no": "no", "prefix": "...", "suffix": "...",
     "query_template": "<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {document}",
     "instruction": "Given a web search query, retrieve relevant passages that answer the query"}

`PromptedPairTokenizer.encode_pairs` tokenizes that text with no special tokens beyond the
prompt's own (type ids 0). Asked to truncate, it cuts the tail of the DOCUMENT's tokens only, so the
suffix stays whole and the row's last token is still the suffix's (the one the answer follows).
Overflow windows are refused. Single texts (`encode`, embeddings of such a package) are tokenized
as `TextTokenizer` does.
"""

from __future__ import annotations

import string
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from vllm_srun.adapters.models.manifest import read_manifest
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer

DEFAULT_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
DEFAULT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_TEMPLATE = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
TEMPLATE_FIELDS = frozenset({"instruction", "query", "document"})
WINDOW_REFUSAL = "overflow window is not supported by yes/no rerankers; use truncate"


@dataclass(frozen=True)
class RerankPrompt:
    """How a yes/no reranker reads a pair, and which tokens answer (srun.json `rerank`)."""

    yes: str = "yes"
    no: str = "no"
    prefix: str = DEFAULT_PREFIX
    suffix: str = DEFAULT_SUFFIX
    query_template: str = DEFAULT_TEMPLATE
    instruction: str = DEFAULT_INSTRUCTION

    def __post_init__(self) -> None:
        seen: list[str] = []
        try:
            parsed = list(string.Formatter().parse(self.query_template))
        except ValueError as exc:
            raise ValueError(f"srun.json rerank.query_template is not a valid template: {exc}") from None
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            if name not in TEMPLATE_FIELDS or spec or conversion:
                raise ValueError(
                    f"srun.json rerank.query_template has field {{{name}}}: only {{instruction}}, {{query}} and "
                    "{document} (no format specs) are allowed"
                )
            seen.append(name)
        if seen.count("document") != 1:
            raise ValueError("srun.json rerank.query_template must contain {document} exactly once")

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> RerankPrompt:
        """The manifest's `rerank` section over the defaults (all defaults when it has none)."""
        raw = manifest.get("rerank")
        raw = {} if raw is None else raw
        if not isinstance(raw, Mapping):
            raise ValueError(
                "srun.json rerank must be an object (yes, no, prefix, suffix, query_template, instruction)"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"srun.json rerank has unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
        for key, value in raw.items():
            if not isinstance(value, str):
                raise ValueError(f"srun.json rerank.{key} must be a string")
        for key in ("yes", "no"):
            if key in raw and not raw[key]:
                raise ValueError(f"srun.json rerank.{key} must name a token")
        return cls(**dict(raw))

    @classmethod
    def from_folder(cls, folder: Path) -> RerankPrompt:
        return cls.from_manifest(read_manifest(Path(folder)))

    def render(self, query: str, document: str) -> tuple[str, int, int]:
        """The whole prompt for one pair, and where the document lies in it (characters [start, end))."""
        parts = [self.prefix]
        at = len(self.prefix)
        start = end = at
        values = {"instruction": self.instruction, "query": query, "document": document}
        for literal, name, _, _ in string.Formatter().parse(self.query_template):
            parts.append(literal)
            at += len(literal)
            if name is None:
                continue
            value = values[name]
            if name == "document":
                start, end = at, at + len(value)
            parts.append(value)
            at += len(value)
        parts.append(self.suffix)
        return "".join(parts), start, end

    def answer_ids(self, tokenizer: Tokenizer) -> tuple[int, int]:
        """The token ids of the `yes` and `no` answers; ValueError when the vocabulary lacks one."""
        out = []
        for key in ("yes", "no"):
            token = getattr(self, key)
            found = tokenizer.token_to_id(token)
            if found is None:
                raise ValueError(f"srun.json rerank.{key} token {token!r} is not in the tokenizer's vocabulary")
            out.append(found)
        if out[0] == out[1]:
            raise ValueError("srun.json rerank.yes and rerank.no name the same token")
        return out[0], out[1]


def _document_tokens(offsets: Sequence[tuple[int, int]], start: int, end: int) -> range:
    """The tokens (a contiguous range) whose characters overlap the document's [start, end)."""
    if start == end:
        return range(0)
    hits = [i for i, (a, b) in enumerate(offsets) if b > start and a < end]
    return range(hits[0], hits[-1] + 1) if hits else range(0)


class PromptedPairTokenizer(TextTokenizer):
    """A `TextTokenizer` whose pairs are a yes/no reranker's prompts (module doc)."""

    def __init__(self, tokenizer: Tokenizer, prompt: RerankPrompt | None = None) -> None:
        super().__init__(tokenizer)
        self.prompt = prompt or RerankPrompt()

    @classmethod
    def from_folder(cls, folder: Path) -> PromptedPairTokenizer:
        path = Path(folder) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        return cls(Tokenizer.from_file(str(path)), RerankPrompt.from_folder(folder))

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], max_length: int | None = None, truncate: bool = False
    ) -> list[Encoded]:
        if not pairs:
            return []
        rendered = [self.prompt.render(query, document) for query, document in pairs]
        encodings = self.tokenizer.encode_batch([text for text, _, _ in rendered], add_special_tokens=False)
        out = []
        for enc, (_, start, end) in zip(encodings, rendered, strict=True):
            ids, n = list(enc.ids), len(enc.ids)
            cut = False
            if max_length is not None and truncate and n > max_length:
                doc = _document_tokens(enc.offsets, start, end)
                drop = n - max_length
                if drop > len(doc):
                    raise ValueError(
                        f"max_length {max_length} leaves no room for the document after the prompt's "
                        f"{n - len(doc)} tokens"
                    )
                ids = ids[: doc.stop - drop] + ids[doc.stop :]
                cut = True
            out.append(Encoded(ids, [0] * len(ids), cut, n))
        return out

    windows_pairs = False  # the surfaces refuse `overflow: window` on pairs before any work

    def windowing(self, length: int, overlap: int, pair: bool) -> tuple[Tokenizer, threading.Lock]:
        """Single texts window as `TextTokenizer` does; pairs cannot (the prompt is not a text pair)."""
        if pair:
            raise ValueError(WINDOW_REFUSAL)
        return super().windowing(length, overlap, pair)
