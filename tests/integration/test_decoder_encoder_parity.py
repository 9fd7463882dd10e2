"""Decoder backbones on the encoder surfaces (`models/decoder_encoder.py`, `models/prompted_pairs.py`)
against `transformers` (test-only), on tiny random Qwen3 / Qwen2 / Llama packages written by the
fixture helpers next to a byte-level BPE tokenizer (Qwen's pre-tokenizer) trained in the test.

- embeddings (last token + L2 normalize) vs `AutoModel` on left- AND right-padded batches and rows
  alone: the padded forward, the unpadded forward (mixed lengths, two rows of equal length) and
  the oneDNN packed copies;
- the yes/no reranker vs the Qwen3-Reranker recipe on `AutoModelForCausalLM` (softmax over the
  [no, yes] logits at the last position of left-padded prompts), several pairs in one batch, and
  truncation that keeps the suffix;
- `…ForSequenceClassification` logits (3 labels, 1 label); 4.x-style configs; odd head sizes;
  bfloat16; the ONNX export; clear errors for what we cannot serve.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.families.fixtures.decoder_encoder_fixture import fixture_config, fixture_weights
from vllm_srun.adapters.models.decoder_encoder import (
    DecoderEncoderConfig,
    ScoreHead,
    YesNoHead,
    load_decoder_encoder,
)
from vllm_srun.adapters.models.encoders import load_encoder
from vllm_srun.adapters.models.manifest import write_manifest
from vllm_srun.adapters.models.pooling import PoolingConfig
from vllm_srun.adapters.models.prompted_pairs import (
    DEFAULT_INSTRUCTION,
    DEFAULT_PREFIX,
    DEFAULT_SUFFIX,
    PromptedPairTokenizer,
    RerankPrompt,
)
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.adapters.models.weights import WeightsError
from vllm_srun.domain.worker.kernels import KernelPlan

TOL = 1e-4  # FP32 parity with transformers (measured figures: see the report / -s output)
TYPES = ("qwen3", "qwen2", "llama")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SENTENCES = [
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "The quick brown fox jumps over the lazy dog.",
    "A small red bird sings while seven green fish swim.",
    "Numbers like 3.14 and 42 appear, with punctuation: yes, no, maybe!",
    "Embeddings map a text to a vector; rerankers judge a query against a document.",
    "hi",
    "Mountains and rivers, latency and throughput, kernels and memory.",
]
CORPUS = [
    DEFAULT_PREFIX + DEFAULT_SUFFIX,
    "<Instruct>: " + DEFAULT_INSTRUCTION + "\n<Query>: \n<Document>: ",
    *SENTENCES,
    *["yes\nno\nyes no\n"] * 40,
]


def _tokenizer(folder: Path, *, add_eos: bool) -> Tokenizer:
    """A Qwen-style byte-level BPE (tokenizer.json + tokenizer_config.json). ADD_EOS: the
    post-processor appends <|endoftext|> as Qwen3-Embedding's does."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    eos = tok.token_to_id("<|endoftext|>")
    if add_eos:
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>",
            pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
            special_tokens=[("<|endoftext|>", eos)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "Qwen2Tokenizer", "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tok


def _package(
    folder: Path,
    model_type: str,
    *,
    num_labels: int | None = None,
    manifest: dict[str, Any] | None = None,
    add_eos: bool = True,
    seed: int = 0,
    **sizes: Any,
) -> Path:
    tok = _tokenizer(folder, add_eos=add_eos)
    config = fixture_config(
        tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"), num_labels, model_type=model_type, **sizes
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_file(fixture_weights(config, num_labels, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    if manifest is not None:
        write_manifest(folder, manifest)
    return folder


def _hf(folder: Path, kind: str = "AutoModel") -> Any:
    model, info = getattr(transformers, kind).from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def _rows(folder: Path, texts: list[str]) -> list[Encoded]:
    return TextTokenizer.from_folder(folder).encode(texts)


def _pad(rows: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r)
        mask[i, span] = 1
    return ids, mask


def _gap(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def _serving(reference: ReferenceEncoder) -> dict[str, Any]:
    """The unpadded forward on eager linears and (where oneDNN runs here) on the packed copies."""
    out: dict[str, Any] = {"unpadded": NativeEncoder(reference)}
    if onednn_unsupported("cpu", torch.float32) is None:
        packed = PackedEncoder(reference.encoder, reference.head)
        # as loading does: a config whose heads x head size is not its hidden size warms too
        packed.warm(16)
        out["onednn"] = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO))
    return out


LASTTOKEN = PoolingConfig(("lasttoken",), normalize=True)


# ---------------------------------------------------------------- fixture helpers vs transformers
@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("kind", ["Model", "ForCausalLM", "ForSequenceClassification"])
def test_fixture_config_and_weights_are_what_transformers_writes(tmp_path: Path, model_type: str, kind: str) -> None:
    labels = 3 if kind == "ForSequenceClassification" else None
    ours = fixture_config(300, 0, labels, model_type=model_type, causal_lm=kind == "ForCausalLM")
    arch = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}[model_type]
    cfg = getattr(transformers, f"{arch}Config")(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=True,
        **({"head_dim": 8} if model_type != "qwen2" else {}),
        **({"num_labels": 3} if labels else {}),
    )
    model = getattr(transformers, f"{arch}{kind}")(cfg)
    model.save_pretrained(tmp_path / "hf")
    theirs = json.loads((tmp_path / "hf" / "config.json").read_text())
    # `transformers_version` names the writer (the installed transformers moves on): present, not compared
    assert "transformers_version" in ours and "transformers_version" in theirs

    def settings(config: dict) -> dict:
        return {k: v for k, v in config.items() if k != "transformers_version"}

    assert settings(ours) == settings(theirs)
    weights = fixture_weights(ours, labels, 1)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if kind == "ForCausalLM" else set())
    assert set(weights) == expected
    assert all(w.dtype == np.float32 for w in weights.values())
    folder = tmp_path / "ours"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(ours))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _hf(folder, f"AutoModel{'ForSequenceClassification' if labels else ''}")


# ---------------------------------------------------------------- (a) (b) (c) embeddings
@pytest.fixture(scope="module", params=TYPES)
def embedder(request, tmp_path_factory) -> tuple[str, Path, Any, ReferenceEncoder]:
    folder = _package(tmp_path_factory.mktemp(request.param), request.param)
    encoder, head = load_decoder_encoder(folder)
    assert head is None and encoder.default_pooling == "lasttoken"
    return request.param, folder, _hf(folder), ReferenceEncoder(encoder, None, LASTTOKEN)


def test_padded_hidden_states_match_transformers(embedder) -> None:
    _, folder, hf, reference = embedder
    rows = _rows(folder, SENTENCES[:5])
    ids, mask = _pad([list(r.ids) for r in rows], reference.pad_id, left=False)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = reference.encoder(ids, mask.bool(), None)
    real = mask.bool()
    gap = float((got - want)[real].abs().max())
    print(f"padded hidden max abs diff: {gap:.2e}")
    assert gap <= 1e-5
    assert float(want[real].std()) > 0.1  # not a degenerate model


def test_embeddings_match_left_and_right_padded_references(embedder) -> None:
    model_type, folder, hf, reference = embedder
    texts = [SENTENCES[0], SENTENCES[6], SENTENCES[3], SENTENCES[1], SENTENCES[6], SENTENCES[5], SENTENCES[2]]
    rows = _rows(folder, texts)
    lengths = [len(r.ids) for r in rows]
    assert rows[0].ids[-1] == reference.encoder.config.pad_token_id  # the post-processor's <|endoftext|>
    assert len(set(lengths)) < len(lengths) and len(set(lengths)) > 2  # equal rows and mixed ones
    expected: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for side in ("left", "right"):
            ids, mask = _pad([list(r.ids) for r in rows], reference.pad_id, left=side == "left")
            hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
            last = hidden[:, -1] if side == "left" else hidden[torch.arange(len(rows)), mask.sum(1) - 1]
            expected[side] = torch.nn.functional.normalize(last, dim=-1).numpy()
        alone = [hf(input_ids=torch.tensor([list(r.ids)])).last_hidden_state[0, -1] for r in rows]
        expected["alone"] = torch.nn.functional.normalize(torch.stack(alone), dim=-1).numpy()
    got = {"padded": reference.embed(rows), **{k: e.embed(rows) for k, e in _serving(reference).items()}}
    got["unpadded rows alone"] = np.concatenate([NativeEncoder(reference).embed([r]) for r in rows])
    for path, value in got.items():
        assert value.shape == (len(rows), 32)
        for ref_name, want in expected.items():
            gap = _gap(value, want)
            print(f"{model_type} embeddings {path} vs transformers {ref_name}: {gap:.2e}")
            assert gap <= TOL, (path, ref_name, gap)
    sims = expected["alone"] @ expected["alone"].T
    distinct = [i for i in range(len(texts)) if texts.index(texts[i]) == i]
    assert sims[np.ix_(distinct, distinct)][~np.eye(len(distinct), dtype=bool)].max() < 0.999


def test_from_folder_defaults_to_last_token_pooling(embedder) -> None:
    _, folder, _, reference = embedder
    loaded = ReferenceEncoder.from_folder(folder)
    assert loaded.pooling.modes == ("lasttoken",) and loaded.head is None
    rows = _rows(folder, SENTENCES[:3])
    raw = ReferenceEncoder(reference.encoder, None, PoolingConfig(("lasttoken",)))
    assert _gap(loaded.embed(rows), raw.embed(rows)) == 0.0


def test_split_projections_stay_views_of_the_fused_linears(embedder) -> None:
    """The wrapped DecoderLM runs on views of the encoder's fused linears, before and after `.to()`."""
    _, folder, _, reference = embedder
    encoder = copy.deepcopy(reference.encoder)
    rows = _rows(folder, SENTENCES[:3])
    ids, mask = _pad([list(r.ids) for r in rows], reference.pad_id, left=False)
    for dtype in (torch.float32, torch.float64):
        encoder = encoder.to(dtype)
        for block, layer in zip(encoder.blocks, encoder.lm.model.blocks, strict=True):  # the layers the lm runs
            attn = layer.self_attn
            assert attn.q_proj.weight.data_ptr() == block.qkv.weight.data_ptr()
            assert attn.v_proj.weight.dtype == dtype and block.ffn_in.weight.dtype == dtype
        with torch.inference_mode():
            ours = encoder(ids, mask.bool(), None)
            lm = encoder.lm(ids)
        assert float((ours - lm)[mask.bool()].abs().max()) < (1e-5 if dtype == torch.float32 else 1e-12)


# ---------------------------------------------------------------- yes/no reranker vs the recipe
PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "The quick brown fox jumps over the lazy dog."),
    ("hi", "hi"),
    ("Which numbers appear?", "Numbers like 3.14 and 42 appear, with punctuation: yes, no, maybe!"),
    ("rivers", "Mountains and rivers, latency and throughput, kernels and memory."),
    ("hi", "hi"),
]


def _recipe(tok: Tokenizer, pairs: list[tuple[str, str]], max_length: int | None = None) -> list[list[int]]:
    """The Qwen3-Reranker recipe's ids: prefix tokens + the formatted body (cut to what is left of
    MAX_LENGTH) + suffix tokens, each part tokenized on its own."""
    prefix = tok.encode(DEFAULT_PREFIX, add_special_tokens=False).ids
    suffix = tok.encode(DEFAULT_SUFFIX, add_special_tokens=False).ids
    out = []
    for query, doc in pairs:
        body = f"<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {doc}"
        ids = tok.encode(body, add_special_tokens=False).ids
        if max_length is not None:
            ids = ids[: max_length - len(prefix) - len(suffix)]
        out.append(prefix + ids + suffix)
    return out


def _recipe_scores(hf: Any, tok: Tokenizer, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """P(yes) from softmax over the [no, yes] logits at the last position of left-padded rows, and
    the logit gap (yes − no) it comes from."""
    batch, mask = _pad(ids, tok.token_to_id("<|endoftext|>"), left=True)
    with torch.no_grad():
        logits = hf(input_ids=batch, attention_mask=mask).logits[:, -1, :]
    pair = torch.stack([logits[:, tok.token_to_id("no")], logits[:, tok.token_to_id("yes")]], dim=1)
    return torch.log_softmax(pair, dim=1)[:, 1].exp().numpy(), (pair[:, 1] - pair[:, 0]).numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


@pytest.fixture(scope="module", params=[("qwen3", True), ("llama", False), ("qwen2", True)], ids=str)
def reranker(request, tmp_path_factory):
    model_type, tied = request.param
    folder = _package(
        tmp_path_factory.mktemp(f"rerank-{model_type}"),
        model_type,
        add_eos=False,
        tie_word_embeddings=tied,
        positions=512,
        manifest={"family": "encoder", "surfaces": ["rerank"], "rerank": {"yes": "yes", "no": "no"}},
    )
    encoder, head = load_encoder(folder)
    assert isinstance(head, YesNoHead) and encoder.config.num_labels == 1 and encoder.config.labels == ["LABEL_0"]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.token_to_id("yes") is not None and tok.token_to_id("no") is not None
    return model_type, folder, _hf(folder, "AutoModelForCausalLM"), tok, ReferenceEncoder(encoder, head, LASTTOKEN)


def test_reranker_scores_match_the_recipe(reranker) -> None:
    model_type, folder, hf, tok, reference = reranker
    prompted = PromptedPairTokenizer.from_folder(folder)
    rows = prompted.encode_pairs(PAIRS)
    recipe_ids = _recipe(tok, PAIRS)
    assert [list(r.ids) for r in rows] == recipe_ids
    assert all(not any(r.type_ids) and not r.truncated and r.n_tokens == len(r.ids) for r in rows)
    want, want_logits = _recipe_scores(hf, tok, recipe_ids)
    assert np.ptp(want_logits) > 0.3  # the scores tell the pairs apart
    paths = {"padded": reference, **_serving(reference)}
    for path, engine in paths.items():
        logits = engine.classify_logits(rows)
        assert logits.shape == (len(rows), 1)
        gaps = _gap(_sigmoid(logits[:, 0]), want), _gap(logits[:, 0], want_logits)
        print(f"{model_type} rerank {path} vs recipe: P(yes) {gaps[0]:.2e}, logit {gaps[1]:.2e}")
        assert max(gaps) <= TOL, (path, gaps)
    alone = np.array([_recipe_scores(hf, tok, [ids])[0][0] for ids in recipe_ids])
    assert _gap(alone, want) <= TOL


def test_reranker_truncation_cuts_the_document_and_keeps_the_suffix(reranker) -> None:
    model_type, folder, hf, tok, reference = reranker
    prompted = PromptedPairTokenizer.from_folder(folder)
    long_doc = " ".join(SENTENCES)
    pairs = [("What is the capital of France?", long_doc), ("hi", "hi")]
    whole = prompted.encode_pairs(pairs)
    limit = len(whole[0].ids) - 25
    assert len(whole[1].ids) < limit
    suffix = tok.encode(DEFAULT_SUFFIX, add_special_tokens=False).ids
    kept = prompted.encode_pairs(pairs, max_length=limit)  # truncate not asked: whole rows, caller rejects
    assert [list(r.ids) for r in kept] == [list(r.ids) for r in whole]
    cut = prompted.encode_pairs(pairs, max_length=limit, truncate=True)
    assert len(cut[0].ids) == limit and cut[0].truncated and cut[0].n_tokens == len(whole[0].ids)
    assert list(cut[0].ids[-len(suffix) :]) == suffix and cut[0].ids[-1] == whole[0].ids[-1]
    assert list(cut[1].ids) == list(whole[1].ids) and not cut[1].truncated
    recipe_ids = _recipe(tok, pairs, max_length=limit)
    assert [list(r.ids) for r in cut] == recipe_ids
    want, want_logits = _recipe_scores(hf, tok, recipe_ids)
    for path, engine in _serving(reference).items():
        logits = engine.classify_logits(cut)[:, 0]
        gap = max(_gap(_sigmoid(logits), want), _gap(logits, want_logits))
        print(f"{model_type} truncated rerank {path} vs recipe: {gap:.2e}")
        assert gap <= TOL
    prompt_only = len(prompted.encode_pairs([("What is the capital of France?", "")])[0].ids)
    with pytest.raises(ValueError, match="leaves no room for the document"):
        prompted.encode_pairs(pairs, max_length=prompt_only - 1, truncate=True)
    with pytest.raises(ValueError, match="overflow window is not supported by yes/no rerankers; use truncate"):
        prompted.windowing(64, 8, True)


def test_prompt_from_the_manifest(tmp_path: Path) -> None:
    prompt = RerankPrompt.from_manifest(
        {"rerank": {"prefix": "<|im_start|>", "suffix": "<|im_end|>", "query_template": "{document} | {query}"}}
    )
    text, start, end = prompt.render("q {x}", "doc {y}")
    assert text == "<|im_start|>doc {y} | q {x}<|im_end|>" and text[start:end] == "doc {y}"
    assert RerankPrompt.from_manifest({}) == RerankPrompt()
    for bad, message in (
        ({"rerank": {"yes": "yes", "maybe": "x"}}, "unknown field 'maybe'"),
        ({"rerank": {"query_template": "{query}"}}, "must contain {document} exactly once"),
        ({"rerank": {"query_template": "{document} {other}"}}, "has field {other}"),
        ({"rerank": {"yes": 1}}, "rerank.yes must be a string"),
        ({"rerank": []}, "must be an object"),
    ):
        with pytest.raises(ValueError, match=message):
            RerankPrompt.from_manifest(bad)
    tok = _tokenizer(tmp_path, add_eos=False)
    with pytest.raises(ValueError, match=re.escape("rerank.yes token 'Yes!' is not in the tokenizer's vocabulary")):
        RerankPrompt(yes="Yes!").answer_ids(tok)
    custom = PromptedPairTokenizer(tok, prompt)
    (row,) = custom.encode_pairs([("hi", "hi")])
    assert list(row.ids) == tok.encode("<|im_start|>hi | hi<|im_end|>", add_special_tokens=False).ids
    assert [list(r.ids) for r in custom.encode(["hi there"])] == [tok.encode("hi there").ids]


# ---------------------------------------------------------------- (d) sequence-classification heads
@pytest.mark.parametrize("labels", [3, 1])
@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_sequence_classification_logits_match(tmp_path: Path, model_type: str, labels: int) -> None:
    folder = _package(tmp_path, model_type, num_labels=labels, add_eos=False)
    encoder, head = load_decoder_encoder(folder)
    assert isinstance(head, ScoreHead) and encoder.config.num_labels == labels
    hf = _hf(folder, "AutoModelForSequenceClassification")
    rows = _rows(folder, SENTENCES)
    ids, mask = _pad([list(r.ids) for r in rows], encoder.config.pad_token_id, left=False)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits.numpy()
    reference = ReferenceEncoder(encoder, head, LASTTOKEN)
    for path, engine in {"padded": reference, **_serving(reference)}.items():
        got = engine.classify_logits(rows)
        assert got.shape == (len(rows), labels)
        gap = _gap(got, want)
        print(f"{model_type} {labels}-label logits {path}: {gap:.2e}")
        assert gap <= TOL


# ---------------------------------------------------------------- (e) 4.x configs, (f) head sizes
def _as_4x(config: dict[str, Any]) -> dict[str, Any]:
    """config.json the way transformers 4.x wrote it for the same model."""
    old = dict(config)
    rope = old.pop("rope_parameters")
    old["rope_theta"], old["rope_scaling"] = rope["rope_theta"], None
    old["torch_dtype"] = old.pop("dtype")
    old.pop("layer_types", None)
    if old["model_type"] == "qwen2":
        old.update(sliding_window=4096, use_sliding_window=False)
    old["transformers_version"] = "4.51.3"
    return old


@pytest.mark.parametrize("model_type", TYPES)
def test_transformers_4_config_gives_the_same_numbers(tmp_path: Path, model_type: str) -> None:
    new = _package(tmp_path / "v5", model_type)
    old = tmp_path / "v4"
    old.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (old / name).write_bytes((new / name).read_bytes())
    config = _as_4x(json.loads((new / "config.json").read_text()))
    (old / "config.json").write_text(json.dumps(config))
    rows = _rows(new, SENTENCES[:4])
    got = [NativeEncoder(ReferenceEncoder(load_decoder_encoder(f)[0], None, LASTTOKEN)).embed(rows) for f in (new, old)]
    assert _gap(got[0], got[1]) == 0.0


@pytest.mark.parametrize(
    ("model_type", "sizes"),
    [
        ("qwen3", {"hidden": 24, "heads": 3}),  # head_dim 8, 3 heads (MHA)
        ("llama", {"hidden": 24, "heads": 4, "kv_heads": 2}),  # head_dim 6
        ("qwen2", {"hidden": 24, "heads": 4, "kv_heads": 1}),  # head_dim 6, one KV head
        ("qwen3", {"hidden": 32, "heads": 4, "head_dim": 12}),  # head_dim != hidden / heads (as Qwen3 ships)
    ],
    ids=str,
)
def test_head_sizes(tmp_path: Path, model_type: str, sizes: dict[str, int]) -> None:
    folder = _package(tmp_path, model_type, **sizes)
    encoder, _ = load_decoder_encoder(folder)
    hf = _hf(folder)
    rows = _rows(folder, SENTENCES[:6])
    with torch.no_grad():
        want = [hf(input_ids=torch.tensor([list(r.ids)])).last_hidden_state[0, -1] for r in rows]
    want = torch.nn.functional.normalize(torch.stack(want), dim=-1).numpy()
    reference = ReferenceEncoder(encoder, None, LASTTOKEN)
    for path, engine in {"padded": reference, **_serving(reference)}.items():
        gap = _gap(engine.embed(rows), want)
        print(f"{model_type} {sizes} {path}: {gap:.2e}")
        assert gap <= TOL


# ---------------------------------------------------------------- (g) bfloat16, (h) ONNX
def test_bfloat16_is_close_to_fp32(reranker) -> None:
    _, folder, _, _, reference = reranker
    rows = PromptedPairTokenizer.from_folder(folder).encode_pairs(PAIRS)
    encoder, head = load_encoder(folder, torch.bfloat16)
    assert next(encoder.parameters()).dtype == torch.bfloat16
    bf16 = ReferenceEncoder(encoder, head, LASTTOKEN)
    for ours, full in ((NativeEncoder(bf16), NativeEncoder(reference)), (bf16, reference)):
        a, b = ours.embed(rows), full.embed(rows)
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert cosine.min() > 0.99, cosine
        scores = _sigmoid(ours.classify_logits(rows)[:, 0]), _sigmoid(full.classify_logits(rows)[:, 0])
        assert _gap(*scores) < 0.05


def test_onnx_export_matches(tmp_path: Path, reranker) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from vllm_srun.adapters.engines.onnx_export import export_encoder

    _, folder, _, _, reference = reranker
    rows = PromptedPairTokenizer.from_folder(folder).encode_pairs(PAIRS)
    path = export_encoder(reference, tmp_path / "m.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    assert "input_ids" in names and "attention_mask" in names

    def run(batch: list[Encoded]) -> tuple[np.ndarray, np.ndarray]:
        ids, mask, _ = reference.tensors(batch)
        arrays = {"input_ids": ids, "attention_mask": torch.ones_like(ids) if mask is None else mask.long()}
        arrays["token_type_ids"] = torch.zeros_like(ids)
        embeddings, logits = session.run(None, {k: v.numpy() for k, v in arrays.items() if k in names})
        return embeddings, logits

    embeddings, logits = run(rows)
    assert len({len(r.ids) for r in rows}) > 1  # a ragged batch
    gap = _gap(embeddings, reference.embed(rows))
    print(f"onnx embeddings (ragged): {gap:.2e}")
    assert gap <= TOL
    ragged_gap = _gap(logits, reference.classify_logits(rows))  # the head reads each row's last real token
    print(f"onnx yes/no logits (ragged): {ragged_gap:.2e}")
    assert ragged_gap <= TOL
    assert np.ptp(logits) > 0.3


# ---------------------------------------------------------------- what we cannot serve
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_sliding_window": True, "sliding_window": 64}, "sliding-window attention"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope scaling type 'llama3'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"head_dim": 7}, "head_dim 7 is odd"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide"),
        ({"model_type": "mistral"}, "model_type 'mistral'"),
    ],
)
def test_configs_we_cannot_serve_say_why(change: dict[str, Any], message: str) -> None:
    raw = {**fixture_config(300, 0, None, model_type="qwen3"), **change}
    with pytest.raises(ValueError, match=message) as info:
        DecoderEncoderConfig.from_dict(raw)
    assert "\n" not in str(info.value)


def test_reranker_without_its_answer_tokens_is_refused(tmp_path: Path) -> None:
    folder = _package(tmp_path, "qwen3", add_eos=False, manifest={"rerank": {"yes": "Yes!"}})
    with pytest.raises(ValueError, match=re.escape("rerank.yes token 'Yes!'")):
        load_decoder_encoder(folder)
    write_manifest(folder, {"surfaces": ["rerank"]})  # the defaults (yes / no)
    assert isinstance(load_decoder_encoder(folder)[1], YesNoHead)


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path: Path) -> None:
    folder = _package(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(WeightsError, match=r"does not fit its config\.json") as info:
        load_decoder_encoder(folder)
    assert "\n" not in str(info.value)
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(WeightsError, match=re.escape("missing ['model.layers.2.")):
        load_decoder_encoder(folder)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama"])
def test_the_one_call_layers_serve_causal_rows_with_grouped_kv_heads(
    tmp_path: Path, model_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head size 16 (the C++ op has it), 4 query heads on 2 K/V heads: every layer and the final
    norm run in one call of `srun_cpu::decoder_layers` (spied), whose rows carry the Python layer
    loop's bits (the loop itself on the one-call attention, causality as a bias of the distance)
    and match transformers. Qwen2's qkv biases, Qwen3's per-head norms and Llama's neither."""
    import os

    from tests.integration.encoder_parity import LayerLoop, spy_stacks
    from vllm_srun.adapters.engines import cpp_ops
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, load_varlen_attention

    if onednn_unsupported("cpu", torch.float32) or cpp_ops.compiler(os.environ) is None:
        pytest.skip("no oneDNN packed path or no C++ compiler here")
    assert load_varlen_attention(lambda _m: None) is None
    attentions: list[int] = []
    plain_attention = VarlenOps.attention

    def spy_attention(self, qkv, packed, heads, relative=None):  # type: ignore[no-untyped-def]
        if relative is not None:
            attentions.append(heads)
        return plain_attention(self, qkv, packed, heads, relative)

    monkeypatch.setattr(VarlenOps, "attention", spy_attention)
    stacks = spy_stacks(monkeypatch)
    folder = _package(tmp_path, model_type, hidden=64, heads=4, kv_heads=2, intermediate=96)
    encoder, _ = load_decoder_encoder(folder)
    reference = ReferenceEncoder(encoder, None, LASTTOKEN)
    packed = PackedEncoder(encoder, None)
    engine = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=VarlenOps())
    loop = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=LayerLoop())
    texts = [SENTENCES[5], SENTENCES[0], SENTENCES[6], SENTENCES[3], SENTENCES[1] * 3, SENTENCES[2]]
    rows = _rows(folder, texts)
    hf = _hf(folder)
    with torch.no_grad():
        alone = [hf(input_ids=torch.tensor([list(r.ids)])).last_hidden_state[0, -1] for r in rows]
    want = torch.nn.functional.normalize(torch.stack(alone), dim=-1).numpy()
    got = engine.embed(rows)
    assert stacks == [True] and not attentions  # one call for the stack; no layer ran in Python
    looped = loop.embed(rows)
    assert attentions and set(attentions) == {4}  # the loop: every layer's attention in one call, 4 heads
    assert np.array_equal(got, looped)
    alone_rows = np.concatenate([engine.embed([r]) for r in rows])
    assert np.array_equal(alone_rows, got)  # a row's bits are its own, in any forward
    gap = _gap(got, want)
    print(f"{model_type} one-call layers vs transformers: {gap:.2e}")
    assert gap <= TOL
