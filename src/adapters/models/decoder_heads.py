"""The heads a decoder backbone carries on the encoder surfaces, as transformers defines them over
Qwen3 / Qwen2 / Llama / Qwen3.5 (`GenericForSequenceClassification`, `GenericForTokenClassification`),
and the Qwen3-Reranker's yes/no recipe.

- `ScoreHead` (`…ForSequenceClassification`): `score` (a linear layer without bias) on the hidden
  state of the token transformers reads for each row: the last one whose id is not the config's
  `pad_token_id` (so a row that ends in pad ids — a tokenizer that closes every text with the pad
  token — is read before them; a row of pad ids only is read at its first token); with no
  `pad_token_id` in config.json, the last token (what transformers does for a batch of one). Since
  the backbone is causal, reading the hidden state there equals reading the last token of the row
  cut after it: `head_rows` cuts the rows so (the family applies it before any forward), and the
  head then reads each row's last real token, on every engine path and in merged forwards.
- `YesNoHead` (srun.json `rerank`): one logit (lm_head[yes] − lm_head[no]) · h at each row's last
  token, so sigmoid(logit) = P(yes) / (P(yes) + P(no)), the recipe's score.
- `read_score_token_head` (`…ForTokenClassification`): `score.weight` [labels, hidden] and
  `score.bias` (absent when config.json says `token_classification_bias: false`) over every
  token's last hidden state; the encoder family's token machinery (aggregation, spans) runs it.
Both sequence heads have `reads_first_token = False` (`encoder_arch.EncoderHead`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import nn

from vllm_srun.adapters.models.weights import Weights, WeightsError

if TYPE_CHECKING:
    from vllm_srun.adapters.contracts import Encoded
    from vllm_srun.adapters.models.token_classifier import TokenClassificationHead

HEAD_TENSORS = frozenset({"lm_head.weight", "score.weight", "score.bias"})  # not the backbone's
SEQUENCE_HEAD = "ForSequenceClassification"
TOKEN_HEAD = "ForTokenClassification"


def head_kind(architectures: Sequence[str]) -> str | None:
    """`sequence`, `token` or None: the head config.json's ARCHITECTURES name."""
    if any(a.endswith(TOKEN_HEAD) for a in architectures):
        return "token"
    if any(a.endswith(SEQUENCE_HEAD) for a in architectures):
        return "sequence"
    return None


def last_tokens(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Each row's last real token [B, H] (right or left padding; MASK None: every row is full)."""
    if mask is None:
        return hidden[:, -1]
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    last = (mask.to(positions.dtype) * positions).argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class YesNoHead(nn.Module):
    """The yes/no reranker's answer as one logit: (lm_head[yes] − lm_head[no]) · h at each row's last
    token, so sigmoid(logit) = softmax([no, yes])[yes] (the Qwen3-Reranker score)."""

    reads_first_token = False

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden, 1, bias=False)

    @classmethod
    def from_rows(cls, yes: torch.Tensor, no: torch.Tensor) -> YesNoHead:
        with torch.device("meta"):
            head = cls(yes.shape[0])
        direction = (yes.float() - no.float()).to(yes.dtype)[None]
        head.score.weight = nn.Parameter(direction.contiguous(), requires_grad=False)
        return head.eval()

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.score(last_tokens(hidden, mask))


class ScoreHead(nn.Module):
    """`…ForSequenceClassification`'s head on a decoder: `score` (no bias) at each row's last token
    (after `head_rows` has cut the rows where transformers reads them: module doc)."""

    reads_first_token = False

    def __init__(self, hidden: int, num_labels: int, pad_token_id: int | None = None) -> None:
        super().__init__()
        self.score = nn.Linear(hidden, num_labels, bias=False)
        self.pad_token_id = pad_token_id  # config.json's, or None: what transformers reads by

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.score(last_tokens(hidden, mask))


def score_head(w: Weights, hidden: int, num_labels: int, pad_token_id: int | None, source: str) -> ScoreHead:
    """The `score.weight` of W as a `ScoreHead` (its row count is the label count; the caller checks
    it against config.json)."""
    from vllm_srun.adapters.models.encoder_parts import assign

    score = w.take("score.weight")
    if score.ndim != 2 or score.shape[1] != hidden:
        raise WeightsError(f"score.weight of {source} has shape {tuple(score.shape)}, not [labels, {hidden}]")
    with torch.device("meta"):
        head = ScoreHead(hidden, num_labels)
    head = assign(head, {"score.weight": score}, source)
    head.pad_token_id = pad_token_id
    return head


class HeadConfig(Protocol):
    """What `decoder_head` reads of a decoder encoder's config."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def architectures(self) -> tuple[str, ...]: ...
    @property
    def config_pad_token_id(self) -> int | None: ...


_C = TypeVar("_C")


def decoder_head(
    folder: Path, w: Weights, cfg: HeadConfig, output_rows: Callable[[], torch.Tensor]
) -> YesNoHead | ScoreHead | None:
    """The head of a decoder package in FOLDER (its tensors W): the yes/no head when srun.json asks
    for a reranker and the checkpoint has no `score` of its own (two rows of OUTPUT_ROWS(), the
    LM's output table: tied embeddings or `lm_head.weight`), the `score` head of a
    `…ForSequenceClassification` checkpoint, else None (a token head is the family's to read)."""
    from vllm_srun.adapters.models.manifest import asks_for_yes_no, read_manifest

    manifest = read_manifest(folder)
    has_score = "score.weight" in w
    if not has_score and asks_for_yes_no(manifest):
        from tokenizers import Tokenizer

        from vllm_srun.adapters.models.prompted_pairs import RerankPrompt

        prompt = RerankPrompt.from_manifest(manifest)
        if not (folder / "tokenizer.json").is_file():
            raise ValueError(f"a yes/no reranker needs its tokenizer.json (not in {folder})")
        yes, no = prompt.answer_ids(Tokenizer.from_file(str(folder / "tokenizer.json")))
        try:
            table = output_rows()
        except WeightsError:
            raise WeightsError(f"a yes/no reranker needs lm_head.weight (untied) and {folder} has none") from None
        if max(yes, no) >= table.shape[0]:
            raise ValueError(
                f"srun.json rerank yes/no token ids {yes}/{no} are outside the {table.shape[0]} output rows"
            )
        return YesNoHead.from_rows(table[yes].detach(), table[no].detach())
    if has_score and head_kind(cfg.architectures) != "token":
        rows = w.take("score.weight").shape[0]
        return score_head(w, cfg.hidden_size, rows, cfg.config_pad_token_id, str(folder))
    return None


def labelled(cfg: _C, head: nn.Module | None) -> _C:
    """CFG with the label count of HEAD: one for the yes/no head; the `score` rows where config.json
    said otherwise (named LABEL_i as transformers names them)."""
    if isinstance(head, YesNoHead):
        return replace(cfg, num_labels=1, id2label={0: "LABEL_0"})  # type: ignore[type-var]
    if isinstance(head, ScoreHead) and head.score.out_features != getattr(cfg, "num_labels", None):
        labels = head.score.out_features
        return replace(cfg, num_labels=labels, id2label={i: f"LABEL_{i}" for i in range(labels)})  # type: ignore[type-var]
    return cfg


def tokenizer_pad_id(folder: Path) -> int | None:
    """The pad id the package's tokenizer names (tokenizer_config.json `pad_token`), if any: what
    pads rows when config.json names none."""
    import json

    from tokenizers import Tokenizer

    try:
        cfg = json.loads((Path(folder) / "tokenizer_config.json").read_text(encoding="utf-8"))
        token = cfg.get("pad_token")
        token = token.get("content") if isinstance(token, dict) else token
        if not isinstance(token, str):
            return None
        return Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).token_to_id(token)
    except Exception:
        return None


def cut_after_last_non_pad(row: Encoded, pad: int) -> Encoded:
    """ROW up to its last token that is not PAD (its first token when every one is PAD)."""
    ids = row.ids
    end = len(ids)
    while end > 1 and ids[end - 1] == pad:
        end -= 1
    if end == len(ids):
        return row
    return replace(row, ids=ids[:end], type_ids=row.type_ids[:end])


def _unchanged(rows: Sequence[Encoded]) -> Sequence[Encoded]:
    return rows


def head_rows(head: object) -> Callable[[Sequence[Encoded]], Sequence[Encoded]]:
    """What the family does to the rows of HEAD's forwards before running them: a decoder's
    `ScoreHead` with a pad id reads each row at its last token that is not the pad id (module
    doc); any other head reads the rows as they are."""
    pad = getattr(head, "pad_token_id", None) if isinstance(head, ScoreHead) else None
    if pad is None:
        return _unchanged

    def cut(rows: Sequence[Encoded]) -> Sequence[Encoded]:
        return [cut_after_last_non_pad(row, pad) for row in rows]

    return cut


def read_score_token_head(
    folder: Path, hidden: int, num_labels: int, config: dict[str, Any]
) -> TokenClassificationHead:
    """The `score` layer of a decoder's `…ForTokenClassification` checkpoint in FOLDER (float32): a
    WeightsError when it is missing or does not fit HIDDEN and NUM_LABELS."""
    from vllm_srun.adapters.models.token_classifier import TokenClassificationHead

    w = _score_tensors(folder)
    if "score.weight" not in w:
        raise WeightsError(f"a token-classification package needs score.weight in {folder}")
    weight = w.take("score.weight")
    wants_bias = config_flag(config, "token_classification_bias", True)
    if wants_bias and "score.bias" not in w:
        raise WeightsError(f"score.bias is missing from {folder} (config.json: token_classification_bias)")
    bias = w.take("score.bias") if wants_bias else torch.zeros(weight.shape[0], dtype=weight.dtype)
    weight, bias = weight.float(), bias.float()
    if tuple(weight.shape) != (num_labels, hidden) or tuple(bias.shape) != (num_labels,):
        raise WeightsError(
            f"score.weight {tuple(weight.shape)} / bias {tuple(bias.shape)} do not fit "
            f"{num_labels} labels over hidden size {hidden}"
        )
    return TokenClassificationHead(weight, bias)


def _score_tensors(folder: Path) -> Weights:
    """The `score.*` tensors of FOLDER's checkpoint, nothing else read."""
    from safetensors import safe_open

    from vllm_srun.adapters.models.weights import safetensors_files

    found: dict[str, torch.Tensor] = {}
    for file in safetensors_files(Path(folder)):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                if key in ("score.weight", "score.bias"):  # transformers keeps the head at the top
                    found[key] = f.get_tensor(key)
    return Weights(found, str(folder))


def config_flag(config: dict[str, Any], key: str, default: bool) -> bool:
    """CONFIG[KEY] at the top level or in its `text_config` (a multimodal checkpoint's), else DEFAULT."""
    for part in (config, config.get("text_config") or {}):
        if isinstance(part, dict) and isinstance(part.get(key), bool):
            return bool(part[key])
    return default
