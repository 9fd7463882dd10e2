"""Decoder packages routed by what they are, and the heads transformers defines over a decoder
backbone (`families/decoder_packages.py`, `models/decoder_heads.py`) against `transformers`
(test-only), on tiny random Qwen3 / Qwen2 / Llama packages written by the fixture writer
(`families/fixtures/decoder_head_fixture.py`: transformers' layout, no srun.json of ours routing them).

- routing: `…ForSequenceClassification`, `…ForTokenClassification`, bare `…Model` and
  sentence-transformers packages reach the encoder family, `…ForCausalLM` the decision family,
  with no srun.json; a srun.json `family` still wins; a head neither family serves is refused in
  one line naming its model_type and architectures;
- sequence classification: the `score` head at the last token that is not `pad_token_id` (the
  fixture's tokenizer closes every text with the pad token), on right-padded batches, rows alone
  and mixed batches, on the padded, unpadded and oneDNN paths; `pad_token_id` unset (a batch of
  one in transformers); one label; a row of pad ids only;
- token classification: every token's `score` logits (with and without `score.bias`);
- in-process HTTP with the package's tokenizer: classify probabilities, multi-label, one-label
  rerank and token labels against transformers run on the same folder with its own tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.families.encoder import EncoderFamily
from vllm_srun.adapters.families.fixtures.decoder_encoder_fixture import fixture_config
from vllm_srun.adapters.families.fixtures.decoder_head_fixture import write_decoder_head_package
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.models.decoder_encoder import load_decoder_encoder
from vllm_srun.adapters.models.decoder_heads import ScoreHead, head_rows, read_score_token_head
from vllm_srun.adapters.models.manifest import write_manifest
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.adapters.models.weights import WeightsError
from vllm_srun.domain.errors import InvalidRequest
from vllm_srun.domain.worker.kernels import KernelPlan

TOL = 1e-4  # FP32 parity with transformers (figures: -s output / the report)
TYPES = ("qwen3", "qwen2", "llama")
ARCH = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}
TEXTS = [
    "the movie was great fun",
    "terrible plot and bad acting",
    "x",
    "paris is the capital of france and the river flows to the sea",
    "refund my order",
    "the cat",
    "the dog",
    "Café naïve — 東京 🙂 42,000?",
]


def _gap(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def _package(folder: Path, arch: str, kind: str, **kw: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_decoder_head_package(folder, arch, kind, 3, positions=128, **kw)
    return folder


def _edit_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _hf(folder: Path, kind: str) -> Any:
    model, info = getattr(transformers, kind).from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def _right_padded(rows: list[Encoded], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = torch.tensor(list(r.ids))
        mask[i, : len(r.ids)] = 1
    return ids, mask


def _paths(reference: ReferenceEncoder) -> dict[str, Any]:
    """The padded forward, the unpadded forward and (where oneDNN runs here) its packed copies."""
    out: dict[str, Any] = {"padded": reference, "unpadded": NativeEncoder(reference)}
    if onednn_unsupported("cpu", torch.float32) is None:
        out["onednn"] = NativeEncoder(
            reference, PackedEncoder(reference.encoder, reference.head), KernelPlan(FORCED_UP_TO)
        )
    return out


# ---------------------------------------------------------------- routing by what a package is
def _config_only(folder: Path, arch: str, architecture: str | None, **extra: Any) -> Path:
    folder.mkdir(parents=True)
    config = fixture_config(300, 0, 3, model_type=arch)
    if architecture is None:
        config.pop("architectures")
    else:
        config["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps({**config, **extra}))
    return folder


@pytest.mark.parametrize("arch", TYPES)
def test_a_decoder_package_reaches_the_family_of_what_it_is(tmp_path: Path, arch: str) -> None:
    registry = FamilyRegistry()
    name = ARCH[arch]
    expected = {
        f"{name}ForSequenceClassification": "encoder",
        f"{name}ForTokenClassification": "encoder",
        f"{name}Model": "encoder",
        f"{name}ForCausalLM": "decision",
        None: "decision",  # no `architectures`: the causal LM it has always been taken for
    }
    for architecture, family in expected.items():
        folder = _config_only(tmp_path / str(architecture), arch, architecture)
        assert registry.family_for(folder).name == family, architecture
    st = _config_only(tmp_path / "st", arch, f"{name}ForCausalLM")  # Qwen3-Embedding: a causal LM + modules.json
    (st / "modules.json").write_text("[]")
    assert registry.family_for(st).name == "encoder"
    classifier = tmp_path / f"{name}ForSequenceClassification"
    write_manifest(classifier, {"family": "decision"})  # srun.json's family still wins
    assert registry.family_for(classifier).name == "decision"
    write_manifest(classifier, {"surfaces": ["classify"]})
    assert registry.family_for(classifier).name == "encoder"
    causal = tmp_path / f"{name}ForCausalLM"
    write_manifest(causal, {"surfaces": ["rerank"]})  # the Qwen3-Reranker: a causal LM with our recipe
    assert registry.family_for(causal).name == "encoder"


def test_what_no_family_serves_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    registry = FamilyRegistry()
    qa = _config_only(tmp_path / "qa", "qwen3", "Qwen3ForQuestionAnswering")
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(
        json.dumps({"model_type": "mistral", "architectures": ["MistralForSequenceClassification"]})
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, needle in (
        (qa, "model_type 'qwen3', architectures Qwen3ForQuestionAnswering"),
        (mistral, "model_type 'mistral', architectures MistralForSequenceClassification"),
        (empty, "no config.json"),
    ):
        with pytest.raises(InvalidRequest, match=re.escape(needle)) as info:
            registry.family_for(folder)
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"{folder.name}: no model family serves this package")


@pytest.mark.parametrize(
    ("kind", "labels", "surfaces"),
    [("classify", None, {"classify"}), ("classify", ["LABEL_0"], {"rerank"}), ("token", None, {"classify"})],
)
def test_the_encoder_family_describes_a_decoder_head(
    tmp_path: Path, kind: str, labels: list[str] | None, surfaces: set[str]
) -> None:
    folder = _package(tmp_path / "p", "qwen3", kind, labels=labels)
    (folder / "srun.json").unlink()  # config.json alone says what it is
    assert FamilyRegistry().family_for(folder).name == "encoder"
    assert EncoderFamily().describe(folder).surfaces == surfaces


@pytest.mark.parametrize("arch", TYPES)
def test_token_fixture_is_what_transformers_writes(tmp_path: Path, arch: str) -> None:
    """config.json and the tensor names of `<Arch>ForTokenClassification` as transformers saves them."""
    from vllm_srun.adapters.families.fixtures.decoder_encoder_fixture import fixture_weights

    ours = fixture_config(300, 0, 3, model_type=arch, token=True)
    cfg = getattr(transformers, f"{ARCH[arch]}Config")(
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
        num_labels=3,
        **({"head_dim": 8} if arch != "qwen2" else {}),
    )
    model = getattr(transformers, f"{ARCH[arch]}ForTokenClassification")(cfg)
    model.save_pretrained(tmp_path)
    theirs = json.loads((tmp_path / "config.json").read_text())
    drop = ("transformers_version",)
    assert {k: v for k, v in ours.items() if k not in drop} == {k: v for k, v in theirs.items() if k not in drop}
    assert set(fixture_weights(ours, 3, 0)) == set(model.state_dict())


# ---------------------------------------------------------------- sequence classification
@pytest.fixture(scope="module", params=TYPES)
def classifier(request, tmp_path_factory) -> tuple[str, Path, Any, ReferenceEncoder]:  # type: ignore[no-untyped-def]
    folder = _package(tmp_path_factory.mktemp(f"cls-{request.param}"), request.param, "classify")
    reference = ReferenceEncoder.from_folder(folder)
    assert isinstance(reference.head, ScoreHead)
    return request.param, folder, _hf(folder, "AutoModelForSequenceClassification"), reference


def test_the_score_head_reads_the_last_token_that_is_not_padding(classifier) -> None:  # type: ignore[no-untyped-def]
    """The fixture's tokenizer closes every text with the pad token, so transformers reads each row
    one token before its end (batched right-padded, or alone); so do we, on every path, in batches
    of mixed lengths and rows alone. Without the cut the answers differ (the test can fail)."""
    arch, folder, hf, reference = classifier
    head = reference.head
    pad = hf.config.pad_token_id
    assert isinstance(head, ScoreHead) and head.pad_token_id == pad is not None
    texts = [*TEXTS, "the cat<|endoftext|> sat", "<|endoftext|>"]  # a pad id inside a row; a row of pads only
    rows = TextTokenizer.from_folder(folder).encode(texts)
    assert all(r.ids[-1] == pad for r in rows)
    assert len({len(r.ids) for r in rows}) > 3 and len({len(r.ids) for r in rows}) < len(rows)
    ids, mask = _right_padded(rows, pad)
    with torch.no_grad():
        batched = hf(input_ids=ids, attention_mask=mask).logits.numpy()
        alone = np.concatenate([hf(input_ids=torch.tensor([list(r.ids)])).logits.numpy() for r in rows])
    assert _gap(batched, alone) <= TOL and float(np.ptp(batched)) > 0.3
    cut = head_rows(head)
    for path, engine in _paths(reference).items():
        together = engine.classify_logits(cut(rows))
        one_by_one = np.concatenate([engine.classify_logits(cut([r])) for r in rows])
        mixed = engine.classify_logits(cut([rows[3], rows[0], rows[-1], rows[5], rows[6]]))
        gaps = (_gap(together, batched), _gap(one_by_one, alone), _gap(mixed, batched[[3, 0, -1, 5, 6]]))
        print(f"{arch} 3-label score head {path} vs transformers (batch, alone, mixed): {max(gaps):.2e}")
        assert max(gaps) <= TOL, (path, gaps)
        assert _gap(engine.classify_logits(rows), batched) > 10 * TOL  # the last token itself is not it


@pytest.mark.parametrize("arch", TYPES)
def test_one_label_and_no_pad_token_id(tmp_path: Path, arch: str) -> None:
    """One label (relevance = sigmoid(logit)); config.json without `pad_token_id`: transformers reads
    the last token (batch of one), and so do we for every row, alone or together."""
    folder = _package(tmp_path / "p", arch, "classify", labels=["LABEL_0"])
    _edit_config(folder, pad_token_id=None)
    hf = _hf(folder, "AutoModelForSequenceClassification")
    assert hf.config.pad_token_id is None and hf.config.num_labels == 1
    reference = ReferenceEncoder.from_folder(folder)
    assert isinstance(reference.head, ScoreHead) and reference.head.pad_token_id is None
    tokenizer_pad = json.loads((folder / "tokenizer_config.json").read_text())["pad_token"]
    assert reference.config.pad_token_id == Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(
        tokenizer_pad
    )  # rows are still padded, with the tokenizer's pad token
    rows = TextTokenizer.from_folder(folder).encode(TEXTS)
    with torch.no_grad():
        alone = np.concatenate([hf(input_ids=torch.tensor([list(r.ids)])).logits.numpy() for r in rows])
    for path, engine in _paths(reference).items():
        got = engine.classify_logits(head_rows(reference.head)(rows))
        assert got.shape == (len(rows), 1)
        print(f"{arch} 1-label score head, no pad_token_id, {path}: {_gap(got, alone):.2e}")
        assert _gap(got, alone) <= TOL


# ---------------------------------------------------------------- token classification
@pytest.mark.parametrize("arch", TYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_token_logits_match_transformers(tmp_path: Path, arch: str, bias: bool) -> None:
    from vllm_srun.adapters.models.token_classifier import token_logits

    folder = _package(tmp_path / "p", arch, "token")
    if not bias:  # `token_classification_bias: false`: a score layer without bias
        _edit_config(folder, token_classification_bias=False)
        tensors = load_file(str(folder / "model.safetensors"))
        del tensors["score.bias"]
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    encoder, head = load_decoder_encoder(folder)
    assert head is None  # the backbone alone: the family reads the token head
    config = json.loads((folder / "config.json").read_text())
    token_head = read_score_token_head(folder, encoder.config.hidden_size, encoder.config.num_labels, config)
    hf = _hf(folder, "AutoModelForTokenClassification")
    rows = TextTokenizer.from_folder(folder).encode(TEXTS)
    reference = ReferenceEncoder(encoder, None, ReferenceEncoder.from_folder(folder).pooling)
    got = token_logits(reference, token_head, rows)
    with torch.no_grad():
        want = [hf(input_ids=torch.tensor([list(r.ids)])).logits[0].numpy() for r in rows]
        ids, mask = _right_padded(rows, hf.config.pad_token_id)
        batched = hf(input_ids=ids, attention_mask=mask).logits.numpy()
    gap = max(_gap(g, w) for g, w in zip(got, want))
    batch_gap = max(_gap(g, batched[i, : len(g)]) for i, g in enumerate(got))
    print(f"{arch} token logits (bias {bias}) vs transformers alone / batched: {gap:.2e} / {batch_gap:.2e}")
    assert max(gap, batch_gap) <= TOL
    labels = {int(np.argmax(row)) for g in got for row in g}
    assert len(labels) > 2  # the head labels tokens differently: something to compare


def test_a_token_package_without_its_score_layer_is_refused(tmp_path: Path) -> None:
    folder = _package(tmp_path / "p", "qwen3", "token")
    tensors = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    del tensors["score.bias"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=re.escape("score.bias is missing")) as info:
        read_score_token_head(folder, 32, 5, config)
    assert "\n" not in str(info.value)
    with pytest.raises(WeightsError, match=re.escape("do not fit 4 labels")):
        read_score_token_head(folder, 32, 4, {**config, "token_classification_bias": False})


# ---------------------------------------------------------------- in-process HTTP, tokenizer included
@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("served")
    out = {
        "qwen3-classify": _package(root / "qwen3-classify", "qwen3", "classify"),
        "llama-multilabel": _package(root / "llama-multilabel", "llama", "classify"),
        "qwen2-score-rerank": _package(root / "qwen2-score-rerank", "qwen2", "classify", labels=["LABEL_0"]),
        "qwen3-token": _package(root / "qwen3-token", "qwen3", "token"),
    }
    _edit_config(out["llama-multilabel"], problem_type="multi_label_classification")
    for folder in out.values():
        (folder / "srun.json").unlink()  # nothing of ours: config.json says what each is
    return out


@pytest.fixture(scope="module")
def client(served: dict[str, Path]):  # type: ignore[no-untyped-def]
    from tests.integration.serving import serving

    with serving(list(served.values())) as (c, _runtime):
        yield c


def _post(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _hf_logits(folder: Path, kind: str, texts: list[Any]) -> list[np.ndarray]:
    """transformers' logits for each input alone, with its own tokenizer."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = _hf(folder, kind)
    out = []
    with torch.inference_mode():
        for t in texts:
            enc = tok(*t, return_tensors="pt") if isinstance(t, tuple) else tok(t, return_tensors="pt")
            out.append(model(**enc).logits[0].numpy().astype(np.float64))
    return out


def test_http_classify_single_and_multi_label(client, served) -> None:  # type: ignore[no-untyped-def]
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    for name, multi in (("qwen3-classify", False), ("llama-multilabel", True)):
        assert cards[name]["status"] == "ready", cards[name]
        assert cards[name]["classify"]["multi_label"] is multi
        want = _hf_logits(served[name], "AutoModelForSequenceClassification", TEXTS)
        body = _post(client, "/v1/classify", {"model": name, "input": TEXTS})
        assert body["labels"] == ["negative", "neutral", "positive"]
        got = np.array([r["scores" if multi else "probabilities"] for r in body["results"]])  # scores: sigmoids
        if multi:
            expected = np.array([1 / (1 + np.exp(-w)) for w in want])
        else:
            expected = np.array([np.exp(w - w.max()) / np.exp(w - w.max()).sum() for w in want])
        print(f"{name} HTTP probabilities vs transformers: {_gap(got, expected):.2e}")
        assert _gap(got, expected) <= TOL


def test_http_one_label_classifier_reranks(client, served) -> None:  # type: ignore[no-untyped-def]
    query, docs = "capital of france", ["paris is the capital of france", "a small cat", "the river flows"]
    want = _hf_logits(served["qwen2-score-rerank"], "AutoModelForSequenceClassification", [(query, d) for d in docs])
    body = _post(client, "/v1/rerank", {"model": "qwen2-score-rerank", "query": query, "documents": docs})
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    expected = [1 / (1 + np.exp(-float(w[0]))) for w in want]
    gap = max(abs(got[i] - expected[i]) for i in range(len(docs)))
    print(f"qwen2 one-label score head rerank HTTP vs transformers: {gap:.2e}")
    assert gap <= TOL


def test_http_token_labels(client, served) -> None:  # type: ignore[no-untyped-def]
    texts = TEXTS[:5]
    want = _hf_logits(served["qwen3-token"], "AutoModelForTokenClassification", texts)
    body = _post(client, "/v1/classify", {"model": "qwen3-token", "input": texts, "options": {"return_tokens": True}})
    assert body["kind"] == "token"
    labels = body["labels"]
    seen = 0
    for result, logits in zip(body["results"], want):
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        assert len(result["tokens"]) == len(probs)  # no special tokens in these rows
        for token, p in zip(result["tokens"], probs):
            assert token["label"] == labels[int(np.argmax(p))]
            assert abs(token["probability"] - float(p.max())) <= TOL
        seen += sum(s["label"] != "O" for s in result["spans"])
    assert seen > 2
