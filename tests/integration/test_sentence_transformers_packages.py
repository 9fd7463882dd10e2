"""sentence-transformers packages as published (`models/st_modules.py`): every pooling mode and
concatenation, Dense / LayerNorm / Dropout / Normalize modules after pooling, do_lower_case,
max_seq_length and prompts, against `SentenceTransformer(folder).encode(...)` on tiny BERT
packages, through the padded forward (`ReferenceEncoder`) and the unpadded one (`NativeEncoder`);
and the one-line refusals of packages we cannot serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.families.fixtures.encoder_fixture import HIDDEN, POSITIONS, WORDS, write_encoder_fixture
from vllm_srun.adapters.families.fixtures.wordpiece_fixture import write_tiny_wordpiece_tokenizer
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.st_modules import DenseStep, load_pooling_config, read_package
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.domain.worker.kernels import KernelPlan

pytest.importorskip("sentence_transformers")

TOL = 1e-5
TEXTS = [
    "the cat sat on the mat",
    "a quick brown fox jumps over the lazy dog by the river",
    "x",
    "y",
    "Paris is the capital of France",
    "happy music today",
    "the movie was great fun and the music was good but the plot was boring",
]
OLD = "sentence_transformers.models."  # the type names 2.x–4.x write
NEW = {  # … and those 5.x+ write
    "Transformer": "sentence_transformers.base.modules.transformer.Transformer",
    "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "Dense": "sentence_transformers.base.modules.dense.Dense",
    "Normalize": "sentence_transformers.base.modules.normalize.Normalize",
}
TANH, GELU, IDENTITY = (f"torch.nn.modules.{m}" for m in ("activation.Tanh", "activation.GELU", "linear.Identity"))


def _json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")


def _weights(folder: Path, tensors: dict[str, torch.Tensor], *, bin_only: bool = False) -> None:
    if bin_only:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))


def build(
    folder: Path,
    pooling: dict[str, Any],
    modules: list[tuple],
    *,
    new_names: bool = False,
    st_config: dict[str, Any] | None = None,
    bert_config: dict[str, Any] | None = None,
    seed: int = 0,
) -> Path:
    """A tiny BERT package (the fixture writer's `embed`) with modules.json rewritten: the
    Transformer, a Pooling of config POOLING, then MODULES: ("Dense", in, out, activation, bias
    [, use_residual]), ("LayerNorm", dim), ("Normalize",), ("Dropout",), or (type, ) for anything else."""
    write_encoder_fixture(folder, "embed", seed)
    shutil.rmtree(folder / "2_Normalize")
    gen = torch.Generator().manual_seed(seed + 7)

    def kind_type(kind: str) -> str:
        return NEW[kind] if new_names and kind in NEW else (kind if "." in kind else OLD + kind)

    entries = [
        {"idx": 0, "name": "0", "path": "", "type": kind_type("Transformer")},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": kind_type("Pooling")},
    ]
    _json(folder / "1_Pooling" / "config.json", {"word_embedding_dimension": HIDDEN, **pooling})
    for i, (kind, *args) in enumerate(modules, start=2):
        path = folder / f"{i}_{kind.rsplit('.', 1)[-1]}"
        path.mkdir()
        entries.append({"idx": i, "name": str(i), "path": path.name, "type": kind_type(kind)})
        if kind == "Dense":
            n_in, n_out, act, bias, *rest = args
            residual = bool(rest and rest[0])
            cfg = {"in_features": n_in, "out_features": n_out, "bias": bias, "activation_function": act}
            if residual:
                cfg["use_residual"] = True
            _json(path / "config.json", cfg)
            tensors = {"linear.weight": 0.3 * torch.randn(n_out, n_in, generator=gen)}
            if bias:
                tensors["linear.bias"] = 0.3 * torch.randn(n_out, generator=gen)
            if residual and n_in != n_out:
                tensors["residual.weight"] = 0.3 * torch.randn(n_out, n_in, generator=gen)
            _weights(path, tensors, bin_only=bool(rest[1:] and rest[1]))
        elif kind == "LayerNorm":
            _json(path / "config.json", {"dimension": args[0]})
            _weights(
                path,
                {
                    "norm.weight": 1 + 0.2 * torch.randn(args[0], generator=gen),
                    "norm.bias": 0.3 * torch.randn(args[0], generator=gen),
                },
            )
        elif kind == "Dropout":
            _json(path / "config.json", {"dropout": 0.1})
        elif kind == "Normalize" and new_names:
            _json(path / "config.json", {"module_input_name": "sentence_embedding"})
    _json(folder / "modules.json", entries)
    _json(folder / "sentence_bert_config.json", {"max_seq_length": 128, "do_lower_case": False, **(bert_config or {})})
    if st_config is not None:
        _json(folder / "config_sentence_transformers.json", st_config)
    return folder


ONEDNN = onednn_unsupported("cpu", torch.float32) is None


def ours(folder: Path, texts: list[str], prompt: str = "") -> dict[str, np.ndarray]:
    """Embeddings of TEXTS with PROMPT prepended, as the encoder family runs them: the padded
    forward, the unpadded one on eager linears and (where oneDNN runs) on the packed copies."""
    package = read_package(folder)
    rows = TextTokenizer.from_folder(folder).encode(
        package.text.fold_case([prompt + t for t in texts]), max_length=package.pooling.max_seq_length, truncate=True
    )
    reference = ReferenceEncoder.from_folder(folder)
    out = {"padded": reference.embed(rows), "unpadded": NativeEncoder(reference).embed(rows)}
    if ONEDNN:
        packed = PackedEncoder(reference.encoder, reference.head)
        out["unpadded onednn"] = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO)).embed(rows)
    return out


def theirs(folder: Path, texts: list[str], **kwargs: Any) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, convert_to_numpy=True, **kwargs)


def check(name: str, folder: Path, texts: list[str] = TEXTS, prompt: str = "", **kwargs: Any) -> np.ndarray:
    """Our paths against sentence-transformers' encode(TEXTS, **KWARGS): max |diff| ≤ TOL."""
    want = theirs(folder, texts, **kwargs)
    gaps = {}
    for path, got in ours(folder, texts, prompt).items():
        assert got.shape == want.shape, path
        gaps[path] = float(np.abs(got - want).max())
    print(name, {k: f"{v:.1e}" for k, v in gaps.items()})  # the parity figures (pytest -s)
    assert max(gaps.values()) <= TOL, gaps
    return want


LEGACY_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


@pytest.mark.parametrize("mode", list(LEGACY_FLAGS))
def test_each_pooling_mode(tmp_path: Path, mode: str) -> None:
    flags = {flag: m == mode for m, flag in LEGACY_FLAGS.items()}
    folder = build(tmp_path / mode, flags, [("Normalize",)] if mode in ("mean", "cls") else [])
    check(f"pooling {mode}", folder)
    assert load_pooling_config(folder).modes == (mode,)


def test_concatenated_modes_legacy_and_listed(tmp_path: Path) -> None:
    legacy = build(tmp_path / "legacy", {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, [])
    assert load_pooling_config(legacy).modes == ("cls", "mean")  # the legacy flags' order, whatever the file's
    assert check("cls+mean (legacy flags)", legacy).shape[1] == 2 * HIDDEN
    listed = build(tmp_path / "listed", {"pooling_mode": ["weightedmean", "max", "mean_sqrt_len_tokens"]}, [])
    assert load_pooling_config(listed).modes == ("weightedmean", "max", "mean_sqrt_len")  # the list's order
    assert check("weightedmean+max+mean_sqrt_len (listed)", listed).shape[1] == 3 * HIDDEN


@pytest.mark.parametrize(
    ("name", "modules", "new_names", "width", "normalized"),
    [
        ("Dense tanh + Normalize", [("Dense", HIDDEN, 16, TANH, True), ("Normalize",)], False, 16, True),
        (
            "Dense gelu, Dense identity no bias",
            [("Dense", HIDDEN, 24, GELU, True), ("Dense", 24, 8, IDENTITY, False)],
            True,
            8,
            False,
        ),
        (
            "Dense with residual",
            [("Dense", HIDDEN, HIDDEN, TANH, True, True), ("Dense", HIDDEN, 12, TANH, True, True)],
            True,
            12,
            False,
        ),
        (
            "Dropout, LayerNorm, Normalize, Dense",
            [("Dropout",), ("LayerNorm", HIDDEN), ("Normalize",), ("Dense", HIDDEN, 10, TANH, True)],
            False,
            10,
            False,
        ),
    ],
)
def test_modules_after_pooling(
    tmp_path: Path, name: str, modules: list[tuple], new_names: bool, width: int, normalized: bool
) -> None:
    folder = build(tmp_path / "pkg", {"pooling_mode": "mean"}, modules, new_names=new_names)
    cfg = load_pooling_config(folder)
    assert cfg.dimensions(HIDDEN) == width and cfg.normalize is normalized
    assert check(name, folder).shape[1] == width


def test_dense_rows_alone_and_together_give_the_same_bits(tmp_path: Path) -> None:
    folder = build(tmp_path / "pkg", {"pooling_mode": "mean"}, [("Dense", HIDDEN, 16, TANH, True)])
    (step,) = load_pooling_config(folder).steps
    assert isinstance(step, DenseStep)
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(1))
    together = step(x)
    for i in range(9):
        assert torch.equal(step(x[i : i + 1])[0], together[i])


def test_do_lower_case_and_max_seq_length(tmp_path: Path) -> None:
    folder = build(tmp_path / "pkg", {"pooling_mode": "mean"}, [("Normalize",)], bert_config={"do_lower_case": True})
    write_tiny_wordpiece_tokenizer(folder, WORDS, lowercase=False, model_max_length=POSITIONS)  # same ids, cased
    mixed = ["The Cat sat on the MAT", "PARIS is the Capital of France", "Happy Music Today"]
    cased = TextTokenizer.from_folder(folder)
    assert cased.encode(["The"])[0].ids != cased.encode(["the"])[0].ids  # the tokenizer itself keeps case
    check("do_lower_case", folder, mixed)
    short = build(tmp_path / "short", {"pooling_mode": "mean"}, [], bert_config={"max_seq_length": 8})
    assert read_package(short).pooling.max_seq_length == 8
    check("max_seq_length 8 (truncated rows)", short, TEXTS)


PROMPTS = {"query": "query: ", "passage": "passage: ", "classification": "classify the movie: "}


@pytest.mark.parametrize("name", [None, "query", "passage", "classification"])
def test_prompts_by_name(tmp_path: Path, name: str | None) -> None:
    folder = build(
        tmp_path / "pkg",
        {"pooling_mode": "mean"},
        [("Dense", HIDDEN, 16, TANH, True), ("Normalize",)],
        st_config={"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "dot"},
    )
    text = read_package(folder).text
    assert text.prompts == PROMPTS and text.default_prompt_name is None and text.similarity_fn_name == "dot"
    with_prompt = check(f"prompt {name}", folder, TEXTS, PROMPTS.get(name or "", ""), prompt_name=name)
    if name is not None:
        assert np.abs(with_prompt - theirs(folder, TEXTS)).max() > 1e-3  # the prompt changes the answer


def test_default_prompt_name_applies_without_a_name(tmp_path: Path) -> None:
    folder = build(
        tmp_path / "pkg",
        {"pooling_mode": ["mean", "cls"]},
        [("Normalize",)],
        new_names=True,
        st_config={"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": "query"},
    )
    check("default prompt (query)", folder, TEXTS, "query: ")


def test_include_prompt_false_is_served_where_it_changes_nothing(tmp_path: Path) -> None:
    folder = build(tmp_path / "pkg", {"pooling_mode": "mean", "include_prompt": False}, [("Normalize",)])
    check("include_prompt false, no prompts", folder)
    last = build(
        tmp_path / "last",
        {"pooling_mode": "lasttoken", "include_prompt": False},
        [("Normalize",)],
        st_config={"prompts": {"query": "query: "}},
    )
    check("include_prompt false, lasttoken, prompt query", last, TEXTS, "query: ", prompt_name="query")


def _refused(tmp_path: Path, match: str, **kwargs: Any) -> None:
    folder = build(
        tmp_path / "pkg", kwargs.pop("pooling", {"pooling_mode": "mean"}), kwargs.pop("modules", []), **kwargs
    )
    with pytest.raises(ValueError, match=match) as info:
        ReferenceEncoder.from_folder(folder)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("match", "kwargs"),
    [
        (r"module 2_CNN of type 'sentence_transformers.models.CNN' is not one we can run", {"modules": [("CNN",)]}),
        (r"2_LSTM of type 'sentence_transformers.models.LSTM'", {"modules": [("LSTM",)]}),
        (r"2_MyPooling of type 'my_package.MyPooling'", {"modules": [("my_package.MyPooling",)]}),
        (
            r"2_Dense \(Dense\): weights only in pytorch_model.bin",
            {"modules": [("Dense", HIDDEN, 8, TANH, True, False, True)]},
        ),
        (
            r"activation_function 'mypkg.Swish' is not one we run",
            {"modules": [("Dense", HIDDEN, 8, "mypkg.Swish", True)]},
        ),
        (r"in_features 16 but the module before it gives 32", {"modules": [("Dense", 16, 8, TANH, True)]}),
        (
            r"include_prompt false .* is not supported",
            {
                "pooling": {"pooling_mode": "mean", "include_prompt": False},
                "st_config": {"prompts": {"query": "query: "}},
            },
        ),
        (
            r"default_prompt_name 'search' is not a prompt \(query\)",
            {"st_config": {"prompts": {"query": "q: "}, "default_prompt_name": "search"}},
        ),
        (
            r"a SparseEncoder is served as Transformer \(or MLMTransformer\) then SpladePooling",
            {"st_config": {"model_type": "SparseEncoder"}},
        ),
        (r"model_type 'Colbert' is not a dense or sparse embedder", {"st_config": {"model_type": "Colbert"}}),
        (r"pooling modes \['median'\]", {"pooling": {"pooling_mode": "median"}}),
    ],
)
def test_packages_we_cannot_serve_are_refused_in_one_line(tmp_path: Path, match: str, kwargs: dict) -> None:
    _refused(tmp_path, match, **kwargs)


def test_refusals_of_the_pipeline_shape(tmp_path: Path) -> None:
    folder = build(tmp_path / "pkg", {"pooling_mode": "mean"}, [])
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    with pytest.raises(ValueError, match="lists no Pooling module"):
        load_pooling_config(folder)
    (folder / "modules.json").write_text(json.dumps([{**modules[0], "path": "0_Transformer"}, modules[1]]))
    with pytest.raises(ValueError, match="not at the package root"):
        load_pooling_config(folder)
    token_dense = build(tmp_path / "tok", {"pooling_mode": "mean"}, [("Dense", HIDDEN, 8, TANH, True)])
    cfg = json.loads((token_dense / "2_Dense" / "config.json").read_text())
    (token_dense / "2_Dense" / "config.json").write_text(json.dumps({**cfg, "module_input_name": "token_embeddings"}))
    with pytest.raises(ValueError, match="module_input_name 'token_embeddings'"):
        load_pooling_config(token_dense)


def test_a_cross_encoder_package_keeps_its_default_pooling(tmp_path: Path) -> None:
    folder = build(tmp_path / "pkg", {"pooling_mode": "max"}, [("CNN",)], st_config={"model_type": "CrossEncoder"})
    assert load_pooling_config(folder, default_mode="cls").modes == ("cls",)
