"""Our own Qwen3.5 text backbone in torch: Gated DeltaNet and gated full-attention layers in the
package's `layer_types` order (`qwen3_5_layers.py`), read from a Hugging Face folder with no
`transformers` at run time.

Rows never pad: a forward lays its rows back to back ([N] token ids and their `Segments`), every
row starting fresh (the convolution, the recurrence and attention restart at its first token).
Public calls:
- `hidden_states(ids, cu_seqlens)` → final-normed hidden states [N, hidden] (what heads read);
- `packed_logits(ids, lengths)` → next-token logits after each row's last token [R, vocab];
- `logits_at(input_ids, attention_mask, positions)` → the decoder API of `DecoderLM` over
  right-padded rows (each row runs only up to the position asked: later tokens cannot change it);
- shared context (R-SC): `prefix_kv(state)` runs a state once and keeps what its continuations
  need per layer (`LayerState`: a linear layer's conv tail and recurrent state, a full layer's
  keys and values); `branch_logits(state, questions)` runs the questions as rows of one forward,
  each continuing the state and never seeing another question.

Weights: `model.*` (text-only checkpoints) or `model.language_model.*` (multimodal ones; the
vision tower `model.visual.*` (read by `qwen3_5_mm.Qwen35VisionLM`) and the multi-token-prediction
`mtp.*` weights are not read here).

`attention_mode` (srun.json or config.json, default `causal`; `qwen3_5_layers.Visibility`) says
what the full-attention layers' queries see when a row is a state followed by a question: the
packed calls take each row's state length (`state_lengths`; without them a whole row is state),
`prefix_kv` runs a state as all state, and `branch_logits` runs questions that see the whole state.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from vllm_srun.adapters.models.gated_delta import Segments
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config
from vllm_srun.adapters.models.qwen3_5_kernels import TORCH_KERNELS, HybridKernels, LayerState
from vllm_srun.adapters.models.qwen3_5_layers import (
    ATTENTION_MODES,
    CAUSAL,
    Qwen35Layer,
    Visibility,
    ZeroCenteredRMSNorm,
)

MULTIMODAL_PREFIX = "model.language_model."
SKIPPED_PREFIXES = ("model.visual.", "mtp.", "model.mtp.")


@dataclass
class HybridState:
    """A shared state run once (`prefix_kv`): what each layer leaves for its continuations, its
    token count, and the rotary position its continuations start at (None: its length; after
    images or videos the multimodal positions run shorter than the tokens)."""

    layers: list[LayerState]
    length: int
    position: int | None = None

    @property
    def next_position(self) -> int:
        return self.length if self.position is None else self.position


def read_attention_mode(folder: str | Path) -> str:
    """The package's `attention_mode`: srun.json's, else config.json's, else `causal`; ValueError
    for a value we do not know."""
    import json

    for name in ("srun.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            raw = json.loads(path.read_text(encoding="utf-8"))
            value = raw.get("attention_mode") if isinstance(raw, dict) else None
            if value is not None:
                if value not in ATTENTION_MODES:
                    raise ValueError(f"{name} attention_mode {value!r} is not one of {', '.join(ATTENTION_MODES)}")
                return str(value)
    return "causal"


class Qwen35Body(nn.Module):
    """`model.*` of the checkpoints: the embeddings, the blocks, the final norm."""

    def __init__(self, c: Qwen35Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Qwen35Layer(c, kind) for kind in c.layer_types)
        self.norm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)

    @property
    def blocks(self) -> list[Qwen35Layer]:
        return cast("list[Qwen35Layer]", list(self.layers))


class Qwen35LM(nn.Module):
    """The Qwen3.5 text model with its LM head (None with `head=False`: heads of other kinds)."""

    # rows with images and videos: only `qwen3_5_mm.Qwen35VisionLM` (the decoder engine reads it)
    reads_media: bool = False

    def __init__(self, config: Qwen35Config, head: bool = True) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen35Body(config)
        untied = head and not config.tie_word_embeddings
        self.lm_head: nn.Linear | None = (
            nn.Linear(config.hidden_size, config.vocab_size, bias=False) if untied else None
        )
        self.has_head = head
        # branches on a CPU attend the state once for all rows (`GatedAttention._split`)
        self.split_attention = True
        # what runs the delta rule, the convolution and the layer loop (`qwen3_5_kernels.py`);
        # an engine sets its own (engines/cpu_hybrid.py on a CPU in FP32)
        self.kernels: HybridKernels = TORCH_KERNELS
        self.attention_mode = "causal"  # module doc; from_pretrained reads the package's

    # ---------------------------------------------------------------- building
    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        *,
        head: bool = True,
    ) -> Qwen35LM:
        folder = Path(folder)
        config = Qwen35Config.from_folder(folder)
        state = read_text_weights(folder, with_head=head and not config.tie_word_embeddings)
        state = {k: v.to(dtype).to(device) for k, v in state.items()}
        with torch.device("meta"):
            model = cls(config, head=head)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"weights in {folder} do not fit the Qwen3.5 layout: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        model.attention_mode = read_attention_mode(folder)
        return model.eval().requires_grad_(False)

    @classmethod
    def random(
        cls, config: Qwen35Config, seed: int = 0, std: float = 0.02, dtype: torch.dtype = torch.float32
    ) -> Qwen35LM:
        """Random weights (normal(0, std); norm weights near 0 (1 + w) or 1 (gated); decays in range)."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=gen)
                if name.endswith("linear_attn.norm.weight"):
                    p.copy_(1.0 + 0.1 * noise)
                elif name.endswith("norm.weight"):
                    p.copy_(0.1 * noise)
                elif name.endswith("A_log"):
                    p.copy_(torch.rand(p.shape, generator=gen) * 2.0 - 1.0)
                elif name.endswith("dt_bias"):
                    p.copy_(1.0 + 0.1 * noise)
                elif name.endswith("conv1d.weight"):
                    p.copy_(0.3 * noise)
                else:
                    p.copy_(std * noise)
        return model.to(dtype).eval().requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    # ---------------------------------------------------------------- pieces
    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [N, 1, rotary_dim] for POSITIONS [N], computed in FP32 like the reference."""
        dim = self.config.rotary_dim
        inv = 1.0 / (
            self.config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=positions.device) / dim)
        )
        freqs = positions.float()[:, None] * inv
        angles = torch.cat((freqs, freqs), dim=-1)[:, None]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def visibility(self, state_lengths: Sequence[int] | None = None) -> Visibility:
        """What the full-attention queries see under this model's attention_mode (module doc)."""
        if self.attention_mode == "causal":
            return CAUSAL
        return Visibility(self.attention_mode, None if state_lengths is None else tuple(int(n) for n in state_lengths))

    def _run(
        self,
        ids: torch.Tensor,
        seg: Segments,
        start: int = 0,
        prefix: HybridState | None = None,
        keep: bool = False,
        kernels: HybridKernels | None = None,
        vis: Visibility = CAUSAL,
    ) -> tuple[torch.Tensor, list[LayerState]]:
        """Final-normed hidden states [N, H] of the rows of SEG (positions from START), and what
        every layer leaves for continuations (KEEP: complete; else it may be empty or lack the
        recurrent states). KERNELS: these instead of the model's own."""
        x = self.model.embed_tokens(ids)
        return self._layers(x, seg, self.rotary(seg.offset + start), prefix, vis, keep, kernels)

    def _layers(
        self,
        x: torch.Tensor,
        seg: Segments,
        rope: tuple[torch.Tensor, torch.Tensor],
        prefix: HybridState | None = None,
        vis: Visibility = CAUSAL,
        keep: bool = False,
        kernels: HybridKernels | None = None,
    ) -> tuple[torch.Tensor, list[LayerState]]:
        """The blocks and the final norm over input embeddings X [N, H] with rotary ROPE; every
        layer in one call where KERNELS can and the queries see causally (VIS), else layer by layer."""
        kernels = kernels or self.kernels
        before = prefix.layers if prefix is not None else None
        if vis.mode == "causal":
            stacked = kernels.layers(self, x, seg, rope, before, keep)
            if stacked is not None:
                return stacked
        kept = []
        split = self.split_attention
        for i, layer in enumerate(self.model.blocks):
            x, state = layer(x, seg, rope, before[i] if before is not None else None, split, kernels, keep, vis)
            kept.append(state)
        return self.model.norm(x), kept

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        if not self.has_head:
            raise ValueError("this Qwen3.5 model was loaded without its LM head")
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight)

    def _ids(self, ids) -> torch.Tensor:
        return torch.as_tensor(ids).to(device=self.device, dtype=torch.long)

    # ---------------------------------------------------------------- packed rows
    @torch.inference_mode()
    def hidden_states(
        self,
        ids: torch.Tensor | Sequence[int],
        cu_seqlens: torch.Tensor | Sequence[int],
        kernels: HybridKernels | None = None,
        state_lengths: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [N, hidden] of rows laid back to back: IDS [N], CU_SEQLENS
        [R+1] (0, end of row 0, end of row 1, …); KERNELS: these instead of the model's own;
        STATE_LENGTHS: each row's state tokens (module doc)."""
        cu = [int(c) for c in torch.as_tensor(cu_seqlens).tolist()]
        if len(cu) < 2 or cu[0] != 0 or any(b <= a for a, b in itertools.pairwise(cu)):
            raise ValueError("cu_seqlens must start at 0 and grow by at least one token per row")
        tokens = self._ids(ids).reshape(-1)
        if tokens.shape[0] != cu[-1]:
            raise ValueError(f"{tokens.shape[0]} token ids for rows of {cu[-1]} tokens")
        seg = Segments.of([b - a for a, b in itertools.pairwise(cu)], self.device)
        return self._run(tokens, seg, kernels=kernels, vis=self.visibility(state_lengths))[0]

    @torch.inference_mode()
    def packed_logits(self, rows: Sequence[Sequence[int]], state_lengths: Sequence[int] | None = None) -> torch.Tensor:
        """Next-token logits [R, vocab] after the last token of each row (rows of ≥ 1 token)."""
        seg = Segments.of([len(r) for r in rows], self.device)
        ids = self._ids([t for r in rows for t in r])
        h, _ = self._run(ids, seg, vis=self.visibility(state_lengths))
        return self.head_logits(h[seg.ends - 1])

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed hidden states [B, T, H] of right-padded rows (zeros after each row's end)."""
        ids = self._ids(input_ids)
        b, t = ids.shape
        lengths = attention_mask.sum(1).tolist() if attention_mask is not None else [t] * b
        seg = Segments.of(lengths, self.device)
        h = self._run(ids[seg.row, seg.offset], seg)[0]
        out = torch.zeros(b, t, h.shape[-1], dtype=h.dtype, device=h.device)
        out[seg.row, seg.offset] = h
        return out

    @torch.inference_mode()
    def logits_at(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        state_lengths: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Next-token logits [B, V] at one position per row of right-padded IDS (default: each
        row's last real token); each row runs packed, only up to that position (STATE_LENGTHS:
        module doc)."""
        ids = self._ids(input_ids)
        b, t = ids.shape
        if positions is None:
            positions = attention_mask.sum(1) - 1 if attention_mask is not None else torch.full((b,), t - 1)
        upto = [int(p) + 1 for p in torch.as_tensor(positions).tolist()]
        if any(not 0 < n <= t for n in upto):
            raise ValueError(f"positions must lie within the rows' {t} tokens")
        seg = Segments.of(upto, self.device)
        h, _ = self._run(ids[seg.row, seg.offset], seg, vis=self.visibility(state_lengths))
        return self.head_logits(h[seg.ends - 1])

    # ---------------------------------------------------------------- shared context (R-SC)
    @torch.inference_mode()
    def prefix_kv(self, state_ids: torch.Tensor | Sequence[int]) -> HybridState:
        """Run a state ([S] or [1, S]) once and keep every layer's continuation state."""
        ids = self._ids(state_ids).reshape(-1)
        if ids.shape[0] < 1:
            raise ValueError("a shared state needs at least one token")
        _, kept = self._run(ids, Segments.of([ids.shape[0]], self.device), keep=True, vis=self.visibility())
        return HybridState(kept, ids.shape[0])

    @torch.inference_mode()
    def branch_logits(
        self,
        state: HybridState,
        branch_ids: torch.Tensor | Sequence[Sequence[int]],
        lengths: torch.Tensor | Sequence[int] | None = None,
        *,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Logits [Q, V] after each question's last token; question q continues the state, then
        itself causally. `branch_ids`: token lists, or a right-padded [Q, L] tensor with `lengths`.
        `chunk` bounds the questions run in one forward (memory)."""
        rows = _rows(branch_ids, lengths)
        if not rows:
            return torch.empty(0, self.config.vocab_size, dtype=self.dtype, device=self.device)
        step = chunk or len(rows)
        out = []
        for lo in range(0, len(rows), step):
            part = rows[lo : lo + step]
            seg = Segments.of([len(r) for r in part], self.device)
            vis = self.visibility([0] * len(part))  # question tokens only: they see the whole state
            h, _ = self._run(
                self._ids([t for r in part for t in r]), seg, start=state.next_position, prefix=state, vis=vis
            )
            out.append(self.head_logits(h[seg.ends - 1]))
        return torch.cat(out)


def _rows(branch_ids, lengths) -> list[list[int]]:
    """Token lists from lists or a right-padded tensor with LENGTHS; each needs ≥ 1 token."""
    if isinstance(branch_ids, torch.Tensor):
        ids = branch_ids.cpu().tolist()
        lens = [len(r) for r in ids] if lengths is None else [int(n) for n in torch.as_tensor(lengths).tolist()]
        rows = [r[:n] for r, n in zip(ids, lens, strict=True)]
        if any(n > len(r) for r, n in zip(ids, lens, strict=True)):
            raise ValueError("a question's length is past its padded width")
    else:
        rows = [list(r) for r in branch_ids]
    if any(len(r) < 1 for r in rows):
        raise ValueError("every question needs at least one token")
    return rows


def read_text_weights(folder: Path, *, with_head: bool) -> dict[str, torch.Tensor]:
    """The text model's tensors of FOLDER's safetensors, named as a text-only checkpoint names them
    (`model.language_model.X` → `model.X`); vision tower and MTP weights are not read, nor
    `lm_head.weight` unless WITH_HEAD."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                if key.startswith(SKIPPED_PREFIXES) or (key == "lm_head.weight" and not with_head):
                    continue
                name = "model." + key[len(MULTIMODAL_PREFIX) :] if key.startswith(MULTIMODAL_PREFIX) else key
                if not (name.startswith("model.") or name == "lm_head.weight"):
                    continue  # another head's weights (a classifier's `score`): not the LM's
                state[name] = f.get_tensor(key)
    if with_head and "lm_head.weight" not in state:
        raise ValueError(f"{folder}: untied Qwen3.5 weights without lm_head.weight")
    return state
