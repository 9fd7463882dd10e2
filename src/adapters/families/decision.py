"""The decision family (R-PKG-2): decoder-only LMs (Llama / Qwen2 / Qwen3 / SmolLM layouts on
`DecoderLM`, and the Qwen3.5 hybrid backbone on `Qwen35LM`, text-only or the text part of a
multimodal checkpoint) that answer typed questions about a state from the next-token distribution
restricted to the answer tokens. Surface `decisions` (/v1/decisions, /v1/systemone,
/v1/systemone/batches).

Two lanes: `text` (one row per question, the whole prompt; padded, or packed where the engine runs
rows back to back: Qwen3.5) and `shared` (packed; one row per shared request: the state once,
then every question as a branch of it, R-SC); a Qwen3.5 package with its vision tower reads
images and videos and adds the `media` lane (`decision_vision.py`). The loaded model is
`decision_model.DecisionModel` (its names stay importable from here). Published
BF16: `--dtype auto` computes in FP32 on a CPU and BF16 on a GPU (R-DT-1). Weights and every
tensor a forward creates live on the worker's device; merged forwards stay within 4,096 counted
tokens on a CPU and about 0.3 s of device time on a GPU (R-BAT-7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import Family, LoadContext, LoadedModel, PackageInfo
from vllm_srun.adapters.families.decision_model import BRANCH_CHUNK as BRANCH_CHUNK
from vllm_srun.adapters.families.decision_model import CPU_CAP_TOKENS as CPU_CAP_TOKENS
from vllm_srun.adapters.families.decision_model import DECODER_MODEL_TYPES, SURFACES, package_limit, read_config
from vllm_srun.adapters.families.decision_model import DecisionModel as DecisionModel
from vllm_srun.adapters.families.decision_model import _restricted as _restricted
from vllm_srun.adapters.families.decision_model import load_lm as load_lm
from vllm_srun.adapters.families.decision_vision import VisionDecisionModel, reads_media
from vllm_srun.adapters.families.decoder_packages import serves_decisions
from vllm_srun.adapters.families.fixtures.decision_fixture import VARIANTS, write_decision_fixture


class DecisionFamily(Family):
    name = "decision"
    fixture_variants = VARIANTS
    options = frozenset({"break_even_tokens"})  # a models file's `options:` (`_break_even_option`)

    def detect(self, folder: Path) -> bool:
        kind = str(read_config(folder).get("model_type", "")).lower()
        return kind in DECODER_MODEL_TYPES and serves_decisions(folder)  # a causal LM (decoder_packages.py)

    def describe(self, folder: Path) -> PackageInfo:
        return PackageInfo(
            self.name,
            SURFACES,
            package_limit(folder),
            engine_args=frozenset({"max_model_len", "enable_shared_context"}),
        )

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        return VisionDecisionModel(folder, context) if reads_media(folder) else DecisionModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        return write_decision_fixture(out, variant, seed)
