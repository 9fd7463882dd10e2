"""Decision prompts (R-API-4): templates, how questions are written, answer keys, and prepare()."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from vllm_srun.adapters.families.decision_prompts import (
    TEMPLATES,
    PromptTemplate,
    QuestionError,
    choose_template,
    option_keys,
    render_choice,
    render_noul,
    render_score,
)
from vllm_srun.adapters.families.decision_rows import AskedQuestion, PromptTokens, prepare, rows_for
from vllm_srun.adapters.families.fixtures.decision_fixture import CHAT_TOKENS, write_decoder_tokenizer


def test_default_template_follows_the_tokenizer_chat_tokens() -> None:
    def has(*tokens: str):
        return lambda t: t in tokens

    assert choose_template(None, has("<|im_start|>", "<|im_end|>")).name == "chatml"
    assert choose_template(None, has("<|im_start|>", "<|im_end|>", "<think>", "</think>")).name == "chatml-think"
    assert choose_template(None, has("<|start_header_id|>", "<|eot_id|>")).name == "llama3"
    assert choose_template(None, has()).name == "plain"
    assert choose_template("plain", has("<|im_start|>", "<|im_end|>")).name == "plain"


def test_manifest_template_is_checked() -> None:
    t = choose_template(
        {"state": "S: {state}\n", "question": "Q: {question}\nA:", "answer_prefix": " "}, lambda _t: False
    )
    assert t.name == "manifest" and t.answer_prefix == " "
    for bad in (
        {"state": "no placeholder", "question": "{question}"},
        {"state": "{state}"},
        {"state": "{state}", "question": "{question}", "x": 1},
        "nope",
        3,
    ):
        with pytest.raises(ValueError):
            choose_template(bad, lambda _t: False)


def test_state_text_is_inserted_verbatim() -> None:
    t = PromptTemplate("chatml", **TEMPLATES["chatml"], system="SYS")
    part = t.state_part('{"a": "{system} {question}"}', bos="<s>")
    assert part.startswith("<s><|im_start|>system\nSYS<|im_end|>") and '{"a": "{system} {question}"}' in part
    assert t.question_part("Q?").endswith("<|im_start|>assistant\n")


def test_render_noul_choice_score() -> None:
    noul = render_noul("is it spam", {"true": "an ad", "false": None})
    assert noul.answer_keys == ("Yes", "No") and '"Yes" means: an ad' in noul.body and '"No" means' not in noul.body
    with pytest.raises(QuestionError):
        render_noul(None, {"true": None})
    single = {"calm": 1, "angry": 2}.get
    choice = render_choice("tone?", {"calm": None, "angry": {"tone": "hostile"}}, single)
    assert choice.answer_keys == ("calm", "angry") and 'angry: {"tone": "hostile"}' in choice.body
    lettered = render_choice(None, {"very calm": None, "angry": "upset"}, lambda k: {"A": 5, "B": 6, "angry": 2}.get(k))
    assert (
        lettered.answer_keys == ("A", "B")
        and lettered.labels == ("very calm", "angry")
        and "A. very calm" in lettered.body
    )
    score = render_score("urgent?", ["can wait", "today"])
    assert score.answer_keys == ("0", "1") and score.legend == {"0": "can wait", "1": "today"}
    for bad in ([], ["x"] * 11, ["x"]):
        with pytest.raises(QuestionError):
            render_score(None, bad)


def test_option_keys_skip_keys_that_are_not_one_token() -> None:
    only = {"A": 1, "C": 3, "AA": 4}
    assert option_keys(["x y", "z", "w"], only.get) == ("A", "C", "AA")
    with pytest.raises(QuestionError, match="only 3"):
        option_keys(["a b"] * 4, only.get)
    assert option_keys(["x", "y"], {"x": 1, "y": 1, "A": 5, "B": 6}.get) == ("A", "B")  # same token twice


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> PromptTokens:
    folder: Path = tmp_path_factory.mktemp("tok")
    write_decoder_tokenizer(folder, CHAT_TOKENS)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return PromptTokens(tok, choose_template(None, lambda t: tok.token_to_id(t) is not None))


def test_prepare_tokenizes_state_once_and_checks_the_limit(tokens: PromptTokens) -> None:
    asked = [
        AskedQuestion("a", "noul", "is it good"),
        AskedQuestion("b", "noul", "is it good " * 20),
        AskedQuestion("c", "score", "how good", ["bad", "good"]),
        AskedQuestion("d", "box"),
    ]
    free = prepare(tokens, "the movie", asked, 10_000, lambda n: "over")
    a = free.questions[0]
    limit = len(free.state_ids) + len(a.ids)
    out = prepare(tokens, "the movie", asked, limit, lambda n: f"over {limit}")
    codes = [q.error.code if q.error else None for q in out.questions]
    assert codes == [
        None,
        "max_length_exceeded",
        "max_length_exceeded" if len(free.questions[2].ids) > len(a.ids) else None,
        "invalid_question",
    ]
    assert (
        out.questions[1].error.message
        == f"the prompt has {len(free.state_ids) + len(free.questions[1].ids)} tokens, over {limit}"
    )
    assert len(set(a.answer_ids)) == 2
    assert out.input_tokens == len(out.state_ids) + sum(len(q.ids) for q in out.answerable)


def test_rows_for_both_layouts(tokens: PromptTokens) -> None:
    asked = [AskedQuestion(f"q{i}", "noul", "is it " + "good " * i) for i in range(3)]
    p = prepare(tokens, "the movie was fun", asked, 10_000, str)
    unshared = rows_for(p, shared=False)
    assert [r.lane for r in unshared] == ["text"] * 3
    assert [r.tokens for r in unshared] == [len(p.state_ids) + len(q.ids) for q in p.questions]
    assert all(r.payload.ids == p.state_ids + q.ids for r, q in zip(unshared, p.questions))
    (shared,) = rows_for(p, shared=True)
    assert shared.lane == "shared" and shared.tokens == len(p.state_ids) + sum(len(q.ids) for q in p.questions)
    assert shared.payload.state_ids == p.state_ids and [q.ids for q in shared.payload.questions] == [
        q.ids for q in p.questions
    ]
