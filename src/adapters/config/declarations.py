"""How a serving setting is declared, and the base of the records that hold them (R-ARG, R-ARG-2).

Each setting is one field of a settings record (`model_args.ModelArgs` ⊂ `ServingArgs`,
`settings.WorkerSettings`): its name, its type, its range and default (from `domain/settings/bounds.py`,
through `declare`) and its help text. `declared(record)` reads them back for the CLIs
(`app/flags.py` turns each into a flag), for `problems()` and for the command line
(`WorkerSettings.to_argv()`). A record is kept canonical (`normalized`): a value equal to the
domain's default is stored as None, so two records that mean the same worker are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import msgspec
from msgspec import Meta, Struct
from msgspec.inspect import Metadata, UnionType, type_info

from vllm_srun.domain.settings import bounds

S = TypeVar("S", bound="Settings")
T = TypeVar("T")


def declare(setting: bounds.Setting[Any], help: str, *, shown: str = "") -> Meta:
    """A field's declaration: SETTING's range (msgspec checks it when a file or config is read),
    what the setting does (HELP) and, where its default value does not say it, the default in
    words (SHOWN, e.g. `by device class`)."""
    limits: dict[str, Any] = {}
    if isinstance(setting, (bounds.IntSetting, bounds.FloatSetting)):
        limits = {"ge": setting.low, "le": setting.high}
    elif isinstance(setting, bounds.PatternSetting):
        limits = {"pattern": f"^({setting.pattern})$"}
    return Meta(description=help, extra={"setting": setting, "shown": shown}, **limits)


@dataclass(frozen=True, slots=True)
class Declared:
    """One declared field as the CLIs need it: its config name (the argparse dest), its setting
    (flag, parsing, range), its help text and the record's default."""

    name: str
    setting: bounds.Setting[Any]
    help: str
    shown: str
    default: Any

    @property
    def flag(self) -> str:
        return self.setting.flag

    def default_text(self) -> str:
        """The default as `--help` shows it."""
        return self.shown or bounds.spell(self.setting.default)

    def help_text(self) -> str:
        """What the setting does and its default, for argparse."""
        return f"{self.help} (default: {self.default_text()})"


@cache
def declared(record: type[Struct]) -> tuple[Declared, ...]:
    """The declared fields of RECORD, in order (fields without a declaration, e.g. `models`, are
    left out)."""
    found = []
    for field in type_info(record).fields:  # type: ignore[attr-defined]
        node = field.type
        if isinstance(node, UnionType):
            node = next((member for member in node.types if isinstance(member, Metadata)), node)
        if isinstance(node, Metadata) and node.extra and "setting" in node.extra:
            help_text = (node.extra_json_schema or {}).get("description", "")
            found.append(Declared(field.name, node.extra["setting"], help_text, node.extra["shown"], field.default))
    return tuple(found)


def by_setting(record: type[Struct], setting: bounds.Setting[Any]) -> Declared:
    return next(d for d in declared(record) if d.setting is setting)


class Settings(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the settings records: frozen, keyword construction, unknown fields refused."""

    def problems(self) -> list[str]:
        """One line per value its setting refuses (R-ARG-2); [] when they may run."""
        return bounds.problems((d.setting, getattr(self, d.name)) for d in declared(type(self)))

    def normalized(self: S) -> S:
        """The same settings, canonical: an unset-able value equal to the domain's default is None."""
        changes = {
            d.name: None
            for d in declared(type(self))
            if d.default is None
            and d.setting.default is not None
            and same_value(getattr(self, d.name), d.setting.default)
        }
        return msgspec.structs.replace(self, **changes) if changes else self


def same_value(value: object, default: object) -> bool:
    """Equal and of the same kind (`False` is not `0`, `None` only None)."""
    if value is None or default is None:
        return value is default
    return isinstance(value, bool) == isinstance(default, bool) and value == default


def or_default(value: T | None, default: T) -> T:
    """VALUE, else (None: not set) DEFAULT."""
    return default if value is None else value
