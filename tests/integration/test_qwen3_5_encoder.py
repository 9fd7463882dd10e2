"""Qwen3.5 (the hybrid Gated DeltaNet / gated attention backbone, `models/qwen3_5.py`) on the encoder
surfaces (`models/qwen3_5_encoder.py`) against transformers' Qwen3_5 classes and
sentence-transformers (test-only), on the tiny packages `vllm-srun fixture --family encoder
--variant qwen3_5-KIND` writes (`families/fixtures/qwen3_5_encoder_fixture.py`) and on packages transformers
saves itself (both config layouts of the sequence classifier):

- routing with no srun.json: each package reaches the encoder family by what it is, a causal LM
  without the rerank recipe the decision family;
- sequence classification (`Qwen3_5TextForSequenceClassification`, `Qwen3_5ForSequenceClassification`)
  at the last token that is not the pad token; token classification (`Qwen3_5ForTokenClassification`);
  last-token embeddings with prompts (`SentenceTransformer.encode`); the yes/no rerank recipe on
  `Qwen3_5ForCausalLM` — each on the padded and unpadded paths, rows alone and in mixed batches;
- in-process HTTP with the package's tokenizer: classify, token labels, embeddings with
  `input_type`, rerank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from vllm_srun.adapters.engines.native import NativeEncoder
from vllm_srun.adapters.families.fixtures.encoder_fixture import write_arch_package
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.models.decoder_heads import ScoreHead, YesNoHead, head_rows, read_score_token_head
from vllm_srun.adapters.models.prompted_pairs import PromptedPairTokenizer, RerankPrompt
from vllm_srun.adapters.models.qwen3_5_encoder import Qwen35Encoder
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.token_classifier import token_logits
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer

TOL = 1e-4  # FP32 parity with transformers (figures: -s output / the report)
TEXTS = [
    "the movie was great fun",
    "terrible plot and bad acting",
    "x",
    "paris is the capital of france and the river flows to the sea " * 2,
    "refund my order",
    "the cat",
    "the dog",
    "Café naïve — 東京 🙂 42,000?",
]


def _gap(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def _hf(folder: Path, kind: str) -> Any:
    model, info = getattr(transformers, kind).from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def _right_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def _paths(reference: ReferenceEncoder) -> dict[str, Any]:
    return {"padded": reference, "unpadded": NativeEncoder(reference)}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3_5")
    out = {}
    for kind in ("embed", "rerank", "classify", "token"):
        folder = root / f"qwen3_5-{kind}"
        folder.mkdir()
        write_arch_package(folder, "qwen3_5", kind, 5)
        out[kind] = folder
    return out


def test_each_package_reaches_the_family_of_what_it_is(packages: dict[str, Path], tmp_path: Path) -> None:
    registry = FamilyRegistry()
    for kind, folder in packages.items():
        if kind != "rerank":  # nothing of ours: config.json (and modules.json) say what it is
            assert set(json.loads((folder / "srun.json").read_text())) == {"fixture"}
        assert registry.family_for(folder).name == "encoder", kind
    causal = tmp_path / "causal"
    causal.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (causal / name).write_bytes((packages["rerank"] / name).read_bytes())
    assert registry.family_for(causal).name == "decision"  # a causal LM without the recipe decides


# ---------------------------------------------------------------- sequence classification
def _transformers_classifier(folder: Path, multimodal: bool, pad: int) -> Path:
    """A random Qwen3.5 sequence classifier as transformers saves it (text-only or multimodal layout)."""
    torch.manual_seed(7)
    text = {
        "vocab_size": 700,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "max_position_embeddings": 256,
        "pad_token_id": pad,
        "tie_word_embeddings": True,
    }
    if multimodal:
        vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32}
        config = transformers.Qwen3_5Config(
            text_config=text, vision_config=vision, num_labels=3, tie_word_embeddings=True
        )
        model = transformers.Qwen3_5ForSequenceClassification(config)
    else:
        model = transformers.Qwen3_5TextForSequenceClassification(transformers.Qwen3_5TextConfig(**text, num_labels=3))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1, 1)
            elif "linear_attn.norm" in name:
                p.normal_(1, 0.1)
            elif "norm" in name:
                p.normal_(0, 0.1)
            else:
                p.normal_(0, 0.3 if p.ndim > 1 else 0.1)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["fixture", "transformers-text", "transformers-multimodal"])
def classifier(request, packages, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = packages["classify"]
    if request.param != "fixture":
        pad = json.loads((folder / "config.json").read_text())["pad_token_id"]
        folder = _transformers_classifier(
            tmp_path_factory.mktemp(request.param), request.param.endswith("multimodal"), pad
        )
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).write_bytes((packages["classify"] / name).read_bytes())
    reference = ReferenceEncoder.from_folder(folder)
    assert isinstance(reference.encoder, Qwen35Encoder) and isinstance(reference.head, ScoreHead)
    return request.param, folder, _hf(folder, "AutoModelForSequenceClassification"), reference


def test_sequence_classification_matches_transformers(classifier, packages) -> None:  # type: ignore[no-untyped-def]
    layout, _folder, hf, reference = classifier
    pad = hf.config.get_text_config().pad_token_id
    assert reference.head.pad_token_id == pad is not None
    rows = TextTokenizer.from_folder(packages["classify"]).encode([*TEXTS, "the cat<|endoftext|> sat"])
    assert all(r.ids[-1] == pad for r in rows)  # the tokenizer closes each text with the pad token
    ids, mask = _right_padded([list(r.ids) for r in rows], pad)
    with torch.no_grad():
        batched = hf(input_ids=ids, attention_mask=mask).logits.numpy()
        alone = np.concatenate([hf(input_ids=torch.tensor([list(r.ids)])).logits.numpy() for r in rows])
    assert _gap(batched, alone) <= TOL and float(np.ptp(alone)) > 0.3
    cut = head_rows(reference.head)
    for path, engine in _paths(reference).items():
        together = engine.classify_logits(cut(rows))
        one_by_one = np.concatenate([engine.classify_logits(cut([r])) for r in rows])
        mixed = engine.classify_logits(cut([rows[3], rows[0], rows[5], rows[6], rows[2]]))
        gaps = (_gap(together, alone), _gap(one_by_one, alone), _gap(mixed, alone[[3, 0, 5, 6, 2]]))
        print(f"qwen3_5 {layout} classifier {path} vs transformers (batch, alone, mixed): {max(gaps):.2e}")
        assert max(gaps) <= TOL, (path, gaps)


def test_token_classification_matches_transformers(packages: dict[str, Path]) -> None:
    folder = packages["token"]
    reference = ReferenceEncoder.from_folder(folder)
    assert reference.head is None and isinstance(reference.encoder, Qwen35Encoder)
    config = json.loads((folder / "config.json").read_text())
    cfg = reference.encoder.config
    head = read_score_token_head(folder, cfg.hidden_size, cfg.num_labels, config)
    hf = _hf(folder, "AutoModelForTokenClassification")
    rows = TextTokenizer.from_folder(folder).encode(TEXTS)
    got = token_logits(reference, head, rows)
    with torch.no_grad():
        want = [hf(input_ids=torch.tensor([list(r.ids)])).logits[0].numpy() for r in rows]
        ids, mask = _right_padded([list(r.ids) for r in rows], cfg.pad_token_id)
        batched = hf(input_ids=ids, attention_mask=mask).logits.numpy()
    gap = max(_gap(g, w) for g, w in zip(got, want))
    batch_gap = max(_gap(g, batched[i, : len(g)]) for i, g in enumerate(got))
    print(f"qwen3_5 token logits vs transformers alone / batched: {gap:.2e} / {batch_gap:.2e}")
    assert max(gap, batch_gap) <= TOL
    assert len({int(np.argmax(row)) for g in got for row in g}) > 2


# ---------------------------------------------------------------- embeddings and the rerank recipe
def test_embeddings_match_sentence_transformers(packages: dict[str, Path]) -> None:
    st = pytest.importorskip("sentence_transformers")
    folder = packages["embed"]
    model = st.SentenceTransformer(str(folder), device="cpu")
    reference = ReferenceEncoder.from_folder(folder)
    assert reference.pooling.modes == ("lasttoken",) and reference.pooling.normalize
    tokenizer = TextTokenizer.from_folder(folder)
    prompt = model.prompts["query"]
    for name, texts in (("plain", TEXTS), ("query prompt", [prompt + t for t in TEXTS])):
        want = model.encode(TEXTS, prompt_name="query" if name != "plain" else None, batch_size=len(TEXTS))
        rows = tokenizer.encode(texts)
        for path, engine in _paths(reference).items():
            together = engine.embed(rows)
            mixed = engine.embed([rows[3], rows[1], rows[2], rows[6]])
            alone = np.concatenate([engine.embed([r]) for r in rows])
            gap = max(_gap(together, want), _gap(alone, want), _gap(mixed, want[[3, 1, 2, 6]]))
            print(f"qwen3_5 embeddings ({name}) {path} vs sentence-transformers: {gap:.2e}")
            assert gap <= TOL


def test_yes_no_rerank_matches_the_recipe(packages: dict[str, Path]) -> None:
    folder = packages["rerank"]
    reference = ReferenceEncoder.from_folder(folder)
    assert isinstance(reference.head, YesNoHead)
    prompt = RerankPrompt.from_manifest(json.loads((folder / "srun.json").read_text()))
    hf = _hf(folder, "AutoModelForCausalLM")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    yes, no = tok.convert_tokens_to_ids(prompt.yes), tok.convert_tokens_to_ids(prompt.no)
    pairs = [("capital of france", t) for t in TEXTS[:6]]
    rows = PromptedPairTokenizer.from_folder(folder).encode_pairs(pairs)
    want = []
    with torch.no_grad():
        for (q, d), row in zip(pairs, rows):
            ids = tok(prompt.render(q, d)[0], add_special_tokens=False, return_tensors="pt")["input_ids"]
            assert ids[0].tolist() == list(row.ids)
            logits = hf(input_ids=ids).logits[0, -1]
            want.append(float(torch.softmax(torch.stack([logits[no], logits[yes]]).double(), 0)[1]))
    for path, engine in _paths(reference).items():
        got = 1 / (1 + np.exp(-engine.classify_logits(rows)[:, 0].astype(np.float64)))
        mixed = 1 / (1 + np.exp(-engine.classify_logits([rows[4], rows[0], rows[2]])[:, 0].astype(np.float64)))
        gap = max(_gap(got, want), _gap(mixed, np.array(want)[[4, 0, 2]]))
        print(f"qwen3_5 yes/no rerank {path} vs the recipe: {gap:.2e}")
        assert gap <= TOL
    assert float(np.ptp(want)) > 0.01


# ---------------------------------------------------------------- in-process HTTP, tokenizer included
@pytest.fixture(scope="module")
def client(packages: dict[str, Path]):  # type: ignore[no-untyped-def]
    from tests.integration.serving import serving

    with serving(list(packages.values())) as (c, _runtime):  # the oneDNN path serves it eagerly (no blocks)
        yield c


def _post(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_http_answers_match_the_references(client, packages) -> None:  # type: ignore[no-untyped-def]
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    for kind in packages:
        assert cards[f"qwen3_5-{kind}"]["status"] == "ready", cards[f"qwen3_5-{kind}"]
    # classify: softmax over transformers' logits, its own tokenizer, each text alone
    folder = packages["classify"]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = _hf(folder, "AutoModelForSequenceClassification")
    with torch.no_grad():
        want = np.stack([torch.softmax(hf(**tok(t, return_tensors="pt")).logits[0], -1).numpy() for t in TEXTS])
    body = _post(client, "/v1/classify", {"model": "qwen3_5-classify", "input": TEXTS})
    got = np.array([r["probabilities"] for r in body["results"]])
    print(f"qwen3_5 classify HTTP vs transformers: {_gap(got, want):.2e}")
    assert _gap(got, want) <= TOL
    # token labels: argmax and its probability per token
    folder = packages["token"]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = _hf(folder, "AutoModelForTokenClassification")
    body = _post(
        client, "/v1/classify", {"model": "qwen3_5-token", "input": TEXTS[:5], "options": {"return_tokens": True}}
    )
    worst = 0.0
    for text, result in zip(TEXTS[:5], body["results"]):
        with torch.no_grad():
            probs = torch.softmax(hf(**tok(text, return_tensors="pt")).logits[0], -1).numpy()
        assert len(result["tokens"]) == len(probs)
        for token, p in zip(result["tokens"], probs):
            assert token["label"] == body["labels"][int(np.argmax(p))]
            worst = max(worst, abs(token["probability"] - float(p.max())))
    print(f"qwen3_5 token probabilities HTTP vs transformers: {worst:.2e}")
    assert worst <= TOL
    # embeddings with the package's query prompt
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(packages["embed"]), device="cpu")
    want = model.encode(TEXTS, prompt_name="query", batch_size=len(TEXTS))
    body = _post(client, "/v1/embeddings", {"model": "qwen3_5-embed", "input": TEXTS, "input_type": "query"})
    got = np.array([d["embedding"] for d in body["data"]])
    print(f"qwen3_5 embeddings (query) HTTP vs sentence-transformers: {_gap(got, want):.2e}")
    assert _gap(got, want) <= TOL
    # rerank: the recipe's P(yes), via the references above
    docs = TEXTS[:4]
    body = _post(client, "/v1/rerank", {"model": "qwen3_5-rerank", "query": "capital of france", "documents": docs})
    got_scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    reference = ReferenceEncoder.from_folder(packages["rerank"])
    rows = PromptedPairTokenizer.from_folder(packages["rerank"]).encode_pairs([("capital of france", d) for d in docs])
    want_scores = 1 / (1 + np.exp(-reference.classify_logits(rows)[:, 0].astype(np.float64)))
    assert max(abs(got_scores[i] - want_scores[i]) for i in range(len(docs))) <= TOL


def test_rows_of_pad_tokens_only_are_read_at_their_first_token(packages: dict[str, Path]) -> None:
    folder = packages["classify"]
    reference = ReferenceEncoder.from_folder(folder)
    pad = reference.head.pad_token_id
    row = Encoded([pad, pad, pad], [0, 0, 0], False, 3)
    hf = _hf(folder, "AutoModelForSequenceClassification")
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([[pad, pad, pad]])).logits.numpy()
    assert _gap(reference.classify_logits(head_rows(reference.head)([row])), want) <= TOL


def test_bfloat16_where_asked_is_close_to_fp32(packages: dict[str, Path]) -> None:
    """`--dtype bfloat16`: the backbone's weights in BF16; embeddings within cosine 0.99 of FP32."""
    folder = packages["embed"]
    rows = TextTokenizer.from_folder(folder).encode(TEXTS)
    full = ReferenceEncoder.from_folder(folder)
    half = ReferenceEncoder.from_folder(folder, dtype=torch.bfloat16)
    assert next(half.encoder.parameters()).dtype == torch.bfloat16
    for ours, theirs in ((NativeEncoder(half), NativeEncoder(full)), (half, full)):
        a, b = ours.embed(rows), theirs.embed(rows)
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert cosine.min() > 0.99, cosine
