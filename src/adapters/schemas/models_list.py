"""`GET /v1/models` of the worker and the front (R-API-6): one card per model in OpenAI's shape
(`{object: "list", data: [card]}`), plus the `models` list the `typesafe-sdk` client's
`models.list()` reads (`[{name, description, release_date}]`).

The typesafe-sdk sends `model: "jev-latest"` when its user names none (`TYPESAFE_DEFAULT_MODEL`).
Where exactly one decision model is served, that name addresses it and is listed as its alias.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TYPESAFE_DEFAULT_MODEL = "jev-latest"  # typesafe_sdk.constants.DEFAULT_MODEL


def is_decision_card(card: dict[str, Any]) -> bool:
    return "decisions" in (card.get("surfaces") or [])


def models_list(cards: Sequence[dict[str, Any]]) -> dict[str, Any]:
    entries = [_entry(card["id"], card) for card in cards]
    decision = [card for card in cards if is_decision_card(card)]
    if len(decision) == 1 and all(card["id"] != TYPESAFE_DEFAULT_MODEL for card in cards):
        entries.append(_entry(TYPESAFE_DEFAULT_MODEL, decision[0], alias_of=decision[0]["id"]))
    return {"object": "list", "data": list(cards), "models": entries}


def _entry(name: str, card: dict[str, Any], alias_of: str | None = None) -> dict[str, str]:
    surfaces = ", ".join(card.get("surfaces") or []) or "no surface yet"
    what = f"{card.get('family') or 'a'} model serving {surfaces} ({card.get('status') or 'unknown'})"
    if alias_of is not None:
        what = f"the typesafe-sdk's default name for {alias_of}: {what}"
    return {"name": name, "description": what, "release_date": card.get("package_date") or ""}
