"""Set and span questions on /v1/decisions (R-OUT-6): each is laid out as noul rows, answered
like any noul, and put back together in the contract's shapes.

- **set**: one noul row per label (*does LABEL apply?*). The answers gain `id.label` =
  `{type: noul, noul: P(yes)}` per label, and `sets.id = {selected, probabilities}`, where
  `selected` holds the labels with P(yes) >= `threshold` (default 0.5), in the question's order.
- **span**: one presence row (*does the content hold a part that is one of the labels?*) →
  `answers.id = {type: noul, noul}`, and one scan row per (label, word) of the text the question
  reads (*is WORD, in its context, part of LABEL?*). Consecutive words of one label with P(yes)
  >= `threshold` merge into one span `{label, start, end, text, probability}` (code points of
  that text, end exclusive; `probability` the mean of its words'). A question whose scan needs
  more than SCAN_BUDGET rows fails in place with `scan_budget_exceeded`.

Every row is a noul question of the same text, so shared context runs it once for all of them
(R-SC). A set or span question succeeds or fails whole: a row that cannot be answered (its
prompt too long, say) puts `{type, error, message}` in the question's own slot, naming the label.
A require_full_input set carries `input_coverage` on `sets.id` and on every `id.label` answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vllm_srun.adapters.contracts import AskedQuestion, QuestionError
from vllm_srun.adapters.contracts.decisions import content_text
from vllm_srun.adapters.schemas.decisions import Coverage, DecisionAnswer, SetResult, SpanItem
from vllm_srun.adapters.surfaces.decision_questions import INVALID, Label, ReadQuestion
from vllm_srun.domain.errors import quoted

SCAN_BUDGET = 1024  # span: at most this many (label, word) rows per question
CONTEXT_WORDS = 6  # span: words shown on each side of the scanned word
WORD = re.compile(r"\w+(?:['’.\-]\w+)*")


@dataclass
class Plan:
    """One question of the request and the flat rows (asked questions) that answer it."""

    name: str
    kind: str
    count: int = 1  # how many asked questions answer it
    labels: tuple[Label, ...] = ()
    threshold: float = 0.5
    words: tuple[tuple[int, int], ...] = ()  # span: the scanned words' [start, end)
    text: str = ""  # span: the text the offsets count in
    error: QuestionError | None = None  # found while laying it out (no rows then)
    rows: list[AskedQuestion] = field(default_factory=list)


def scan_words(text: str) -> tuple[tuple[int, int], ...]:
    """The words of TEXT as [start, end) code-point offsets: runs of letters and digits, joined by
    an apostrophe, period or hyphen between two of them ("e-mail", "don't", "3.5")."""
    return tuple((m.start(), m.end()) for m in WORD.finditer(text))


def _label_phrase(label: Label) -> str:
    described = f" ({content_text(label.description)})" if label.description is not None else ""
    return f'"{label.key}"{described}'


def _lead(instructions: object) -> str:
    return f"{content_text(instructions)}\n" if instructions is not None else ""


def set_rows(name: str, q: ReadQuestion, labels: Sequence[Label]) -> list[AskedQuestion]:
    lead = _lead(q.instructions)
    return [
        AskedQuestion(
            f"{name}.{label.key}",
            "noul",
            f'{lead}Does the label "{label.key}" apply to the content?',
            {"true": label.description, "false": None} if label.description is not None else None,
        )
        for label in labels
    ]


def span_rows(
    name: str, q: ReadQuestion, labels: Sequence[Label], text: str, words: Sequence[tuple[int, int]]
) -> list[AskedQuestion]:
    lead = _lead(q.instructions)
    phrases = ", ".join(_label_phrase(label) for label in labels)
    rows = [AskedQuestion(name, "noul", f"{lead}Does the content hold a part that is one of: {phrases}?")]
    for li, label in enumerate(labels):
        phrase = _label_phrase(label)
        for wi, (start, end) in enumerate(words):
            left = words[max(0, wi - CONTEXT_WORDS)][0]
            right = words[min(len(words) - 1, wi + CONTEXT_WORDS)][1]
            context = f"{text[left:start]}[{text[start:end]}]{text[end:right]}"
            rows.append(
                AskedQuestion(
                    f"{name}\x00{li}\x00{wi}",
                    "noul",
                    f'{lead}In "{context}", is the word "{text[start:end]}" in brackets part of {phrase}?',
                )
            )
    return rows


def plan(name: str, q: ReadQuestion, text: str) -> Plan:
    """How set/span question NAME is answered about TEXT: its noul rows, or an error found
    before any row."""
    out = Plan(name, q.kind, 0, q.labels, q.threshold)
    if q.kind == "set":
        out.rows = set_rows(name, q, q.labels)
    else:
        out.text = text
        out.words = scan_words(text)
        scan = len(out.words) * len(q.labels)
        if scan > SCAN_BUDGET:
            out.error = QuestionError(
                "scan_budget_exceeded",
                f"{len(out.words)} words × {len(q.labels)} labels is {scan} scan rows (at most {SCAN_BUDGET})",
            )
            return out
        out.rows = span_rows(name, q, q.labels, text, out.words)
    out.count = len(out.rows)
    return out


def taken_names(questions: Mapping[str, ReadQuestion | QuestionError]) -> dict[str, QuestionError]:
    """The set questions whose `id.label` answer would take another question's name: each fails
    in its slot (invalid_question), naming the answer."""
    out: dict[str, QuestionError] = {}
    for name, q in questions.items():
        if isinstance(q, ReadQuestion) and q.kind == "set":
            for label in q.labels:
                answer = f"{name}.{label.key}"
                if answer in questions:
                    out[name] = QuestionError(
                        INVALID, f"labels: the answer {quoted(answer)} would take the name of another question"
                    )
                    break
    return out


# ------------------------------------------------------------------------------ putting back
def select(labels: Sequence[str], probabilities: Sequence[float], threshold: float) -> SetResult:
    return SetResult(
        [label for label, p in zip(labels, probabilities) if p >= threshold],
        dict(zip(labels, probabilities)),
    )


def merge_spans(
    text: str,
    labels: Sequence[str],
    words: Sequence[tuple[int, int]],
    probabilities: Sequence[Sequence[float]],
    threshold: float,
) -> list[SpanItem]:
    """Per label, each run of consecutive words with P(yes) >= THRESHOLD is one span (mean P),
    ordered by start, then by the label's place in the question."""
    found: list[tuple[int, int, SpanItem]] = []
    for li, (label, ps) in enumerate(zip(labels, probabilities)):
        run: list[int] = []
        for wi in [*range(len(words)), None]:
            if wi is not None and ps[wi] >= threshold:
                run.append(wi)
                continue
            if run:
                start, end = words[run[0]][0], words[run[-1]][1]
                mean = sum(ps[i] for i in run) / len(run)
                found.append((start, li, SpanItem(label, start, end, text[start:end], mean)))
                run = []
    return [item for _, _, item in sorted(found, key=lambda t: (t[0], t[1]))]


def error_of(p: Plan, row_errors: Sequence[QuestionError | None]) -> QuestionError | None:
    """The error a set/span question fails with, if any (its own, else its first failed row's)."""
    if p.error is not None:
        return p.error
    for row, err in zip(p.rows, row_errors):
        if err is not None:
            return QuestionError(err.code, f"{_row_label(p, row)}: {err.message}")
    return None


def _row_label(p: Plan, row: AskedQuestion) -> str:
    if p.kind == "set":
        return f"label {quoted(row.name[len(p.name) + 1 :])}"
    parts = row.name.split("\x00")
    if len(parts) == 1:
        return "the presence question"
    li, wi = int(parts[1]), int(parts[2])
    start, end = p.words[wi]
    return f"label {quoted(p.labels[li].key)} at word {quoted(p.text[start:end])}"


def assemble(
    p: Plan, probabilities: Sequence[float], answers: dict[str, DecisionAnswer], complete: bool = False
) -> SetResult | list[SpanItem]:
    """Put a set/span question's answered rows (P(yes) per row, in row order) back together:
    fills ANSWERS and returns the `sets` or `spans` entry (COMPLETE: with `input_coverage`)."""
    coverage: Coverage | None = "complete" if complete else None
    if p.kind == "set":
        keys = [label.key for label in p.labels]
        for key, prob in zip(keys, probabilities):
            answers[f"{p.name}.{key}"] = DecisionAnswer("noul", noul=prob, input_coverage=coverage)
        chosen = select(keys, probabilities, p.threshold)
        chosen.input_coverage = coverage
        return chosen
    answers[p.name] = DecisionAnswer("noul", noul=probabilities[0], input_coverage=coverage)
    n = len(p.words)
    per_label = [probabilities[1 + li * n : 1 + (li + 1) * n] for li in range(len(p.labels))]
    return merge_spans(p.text, [label.key for label in p.labels], p.words, per_label, p.threshold)
