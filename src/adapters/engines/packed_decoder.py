"""The decision family's decoder LM on a CPU in FP32, packed: rows back to back without padding,
every layer and the final norm in one C++ call, the output layer on each row's last token only.

It reuses what serves the same backbones as embedders and rerankers (`models/decoder_encoder.py`):
the LM is wrapped as a `DecoderEncoder` (q/k/v and gate/up concatenated; the LM's own projections
become views of them, so no weight is held twice), its block linears get oneDNN packed copies
(`cpu_onednn.PackedEncoder`), and `DecoderEncoder.packed_forward` runs the rows through
`srun_cpu::decoder_layers` (`engines/cpu_stacks.DecoderStack`, via `cpu_op_library.VarlenOps`).
Of the final hidden states only each row's last token is kept. A decision reads the output layer
(`lm_head`, or the embeddings when they are tied) at its answer tokens only: `answer_logits` takes
each row's few dot products (`models/answer_logits.answer_rows`) instead of all V rows (151,936 ×
1,024 on Qwen3: 0.6 GB of FP32 read for every forward, and as much again held as a packed copy,
before 2026-12-06). `logits_at` (every row, [R, V]) stays for the load-time check and the tests.

Every step gives a row the same bits whatever else the forward holds (the packed linears on row
buckets, attention one task per row and head, norms and rotary row by row, `cpu_onednn`), so the
engine is batch-invariant and rows share forwards even under `exact` (R-BAT-5's probe still
decides at load). `packed_decoder` builds it only where the packed answers match the eager
forward's on a probe within `NUMERICS_TOL`; anywhere else (not x86, no oneDNN, no C++ op library,
`VLLM_SRUN_ONEDNN=0`, another dtype, a shape the stack does not run) the caller keeps the eager
`NativeDecoder` and its card says why.

The shared-context branch layout (`prefix_kv` / `branch_logits`, R-SC) stays on the eager LM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from vllm_srun.adapters.contracts import Determinism, Encoded
from vllm_srun.adapters.engines.cpu_onednn import ENV, PackedEncoder, onednn_mode, onednn_unsupported
from vllm_srun.adapters.engines.cpu_op_library import cpu_ops
from vllm_srun.adapters.models.answer_logits import answer_rows, pick
from vllm_srun.adapters.models.decoder import DecoderLM, SharedState
from vllm_srun.adapters.models.decoder_encoder import DecoderEncoder, DecoderEncoderConfig
from vllm_srun.adapters.models.unpadded import ForwardOps, PackedRows
from vllm_srun.domain.scheduling.lanes import Accounting
from vllm_srun.domain.worker.kernels import bucket_rows

if TYPE_CHECKING:
    from vllm_srun.adapters.models.encoder_arch import EncoderModule

NUMERICS_TOL = 1e-5  # largest |packed − eager| over the probe's logits, relative to their size
WARM_UP_TO = 64  # oneDNN primitives built at load for forwards of up to this many token rows
PROBE_LENGTHS = (19, 8, 8, 3, 1)  # the load-time numerics probe: ragged rows, a run of two, a lone token
Progress = Callable[[str], None]


def _probe_rows(vocab: int, limit: int) -> list[list[int]]:
    return [[(97 * r + 31 * i + 5) % vocab for i in range(min(n, limit))] for r, n in enumerate(PROBE_LENGTHS)]


class PackedDecoder:
    """The decoder port over a `DecoderLM` on the packed CPU kernels (module doc)."""

    name = "native"
    accounting = Accounting.PACKED  # rows laid back to back: a forward computes only real tokens
    forward_threads = True  # oneDNN and the C++ stack read the count each forward declares
    kernel_switch_tokens = None  # the same kernels at every size
    # a row's bits are its own in any forward (module doc); the load-time probe confirms
    determinism = Determinism.BATCH_INVARIANT

    def __init__(self, lm: DecoderLM, encoder: DecoderEncoder, packed: PackedEncoder, ops: ForwardOps) -> None:
        self.lm = lm
        self.encoder = encoder
        self.packed = packed
        self.ops = ops
        self.linears = packed.layer_linears
        weight = lm.model.embed_tokens.weight if lm.lm_head is None else lm.lm_head.weight
        self.output_weight = weight.detach()  # the LM's own tensor: no copy (module doc)
        self.kernels: dict[str, Any] = {}

    @property
    def vocab_size(self) -> int:
        return int(self.lm.config.vocab_size)

    def describe(self) -> dict[str, Any]:
        return {"kernels": dict(self.kernels)}

    def hidden_last(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Each row's final-normed hidden state at its last token, [R, H], in the caller's order."""
        if not rows or any(len(r) < 1 for r in rows):
            raise ValueError("every row needs at least one token")
        batch = [Encoded(list(r), (), False, len(r)) for r in rows]
        packed = PackedRows.build(batch, "cpu", bucket_rows)
        ends = packed.starts + packed.lengths - 1
        # the last layer's linears run on a row bucket of these tokens (the last one repeated)
        keep = torch.cat([ends, ends[-1:].expand(bucket_rows(len(rows)) - len(rows))])
        hidden = self.encoder.packed_forward(packed, self.linears, self.ops, keep=keep)
        return packed.unsort(hidden[: len(rows)])

    @torch.inference_mode()
    def logits_at(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Every row of the output layer, [R, V] (the load-time check and the tests)."""
        return torch.nn.functional.linear(self.hidden_last(rows), self.output_weight)

    @torch.inference_mode()
    def answer_logits(self, rows: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """The output layer at each row's TOKENS only (module doc), flat."""
        if len(tokens) != len(rows):
            raise ValueError(f"{len(rows)} rows for {len(tokens)} answer sets")
        return answer_rows(self.hidden_last(rows), self.output_weight, tokens)

    def prefix_kv(self, state_ids: Sequence[int]) -> SharedState:
        return self.lm.prefix_kv(list(state_ids))

    def branch_logits(self, state: SharedState, branches: Sequence[Sequence[int]], *, chunk: int) -> torch.Tensor:
        return self.lm.branch_logits(state, [list(b) for b in branches], chunk=chunk)

    def warm(self, up_to_rows: int = WARM_UP_TO) -> None:
        """Build oneDNN's primitives for every bucket of token rows up to UP_TO_ROWS at load, so
        short forwards never pay that in serving (`PackedEncoder.warm`: each linear at its own
        input width)."""
        self.packed.warm(up_to_rows)


def right_padded(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """ROWS as one right-padded [R, longest] id matrix on the host and each row's last position:
    what the eager LMs' `logits_at` take (the eager engines and this engine's reference)."""
    if not rows or any(len(r) < 1 for r in rows):
        raise ValueError("every row needs at least one token")
    ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return ids, torch.tensor([len(r) - 1 for r in rows])


def eager_logits(lm: DecoderLM, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """The reference: RIGHT-padded rows through the eager LM, logits after each row's last token."""
    ids, ends = right_padded(rows)
    return lm.logits_at(ids, positions=ends)


def _probe_tokens(vocab: int, rows: int) -> list[list[int]]:
    """Each probe row's answer tokens: eight spread over the vocabulary, its ends included."""
    return [sorted({0, vocab - 1, *((4099 * r + 613 * i + 11) % vocab for i in range(6))}) for r in range(rows)]


def numerics_gap(engine: PackedDecoder) -> float:
    """Largest |packed − eager| over a probe's answer logits (what a decision reads, at tokens
    spread over the vocabulary), relative to the eager logits' size (inf if not finite)."""
    rows = _probe_rows(engine.vocab_size, engine.lm.config.max_position_embeddings)
    tokens = _probe_tokens(engine.vocab_size, len(rows))
    got = engine.answer_logits(rows, tokens)
    want_all = eager_logits(engine.lm, rows)
    want = pick(want_all, tokens)
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - want).abs().max()) / max(1.0, float(want_all.abs().max()))


def packed_decoder(lm: DecoderLM, progress: Progress, env: Mapping[str, str] = os.environ) -> PackedDecoder | str:
    """LM on the packed kernels (module doc), or one line saying why it cannot be (the caller keeps
    the eager engine). Says each load step it takes in PROGRESS."""
    if onednn_mode(env) == "off":  # the encoders' switch keeps the eager decoder too
        return f"turned off ({ENV}={env[ENV]})"
    dtype = lm.dtype
    unsupported = onednn_unsupported(str(lm.device), dtype)
    if unsupported is None and dtype != torch.float32:
        unsupported = f"the one-call decoder layers are FP32; this model is {str(dtype).removeprefix('torch.')}"
    if unsupported is not None:
        return unsupported
    ops, attention = cpu_ops(dtype, progress, env)
    c = lm.config
    config = DecoderEncoderConfig(
        decoder=c,
        model_type=c.model_type,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        max_position_embeddings=c.max_position_embeddings,
    )
    try:
        encoder = DecoderEncoder(config, lm).eval().requires_grad_(False)
        progress(f"load: packing {c.num_layers} decoder layers' linears for oneDNN")
        # the loaders hand a DecoderEncoder over as an `EncoderModule` the same way (encoders.py)
        packed = PackedEncoder(cast("EncoderModule", encoder), None)
        if not ops.runs_stack(encoder, packed.layer_linears):
            return f"the one-call decoder layers do not run this model ({attention})"
        engine = PackedDecoder(lm, encoder, packed, ops)
        with torch.inference_mode():
            gap = numerics_gap(engine)
        if gap <= NUMERICS_TOL:
            engine.warm()
    except (RuntimeError, ValueError) as exc:  # an op oneDNN or the stack refuses for these shapes
        return f"packing failed: {exc}"[:200]
    if not gap <= NUMERICS_TOL:
        return f"packed answers differ from eager by {gap:.1e} (> {NUMERICS_TOL:g})"
    engine.kernels = {
        "linear": "onednn_packed",
        "layers": ops.stack_card,
        "attention": attention,
        "output_layer": "each row's last token at its answer tokens only",
        "dtype": "float32",
        "numerics_gap": float(f"{gap:.1e}"),
        "reason": f"every forward packed, rows back to back; logits within {NUMERICS_TOL:g} of eager",
        "shared_context": "eager torch (prefix_kv / branch_logits)",
    }
    progress(f"load: decoder layers in one C++ call on oneDNN packed linears (logits within {gap:.1e} of eager)")
    return engine
