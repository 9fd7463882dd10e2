"""Argparse flags derived from the settings record's declarations (`adapters/config/settings.py`),
for both CLIs (R-ARG-2).

A flag's type refuses what its setting refuses (one line: `argument --flag: expected …`),
its choices are the setting's, and its help says what it does and its default, as declared.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from vllm_srun.adapters.config.settings import Declared
from vllm_srun.domain import bounds

KEEP = object()  # `add_setting(default=KEEP)`: the declared default


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose refusals are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def arg_type(setting: bounds.Setting[Any]) -> Callable[[str], Any]:
    """An argparse `type=` that refuses what `setting` refuses, saying why in one line."""

    def convert(text: str) -> Any:
        try:
            return setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = setting.name
    return convert


def add_setting(
    parser: argparse.ArgumentParser,
    field: Declared,
    *,
    default: object = KEEP,
    aliases: tuple[str, ...] = (),
    **extra: Any,
) -> None:
    """Add the declared FIELD as its setting's flag (dest: the field's name), with ALIASES (other
    spellings of the same flag, e.g. upstream's). `default` None leaves the value unset (a front
    flag that writes into the config only when given); `--help` still shows the effective default."""
    setting = field.setting
    value = field.default if default is KEEP else default
    text = extra.pop("help", None) or field.help_text()
    extra.setdefault("dest", field.name)
    if isinstance(setting, bounds.SwitchSetting):
        parser.add_argument(
            setting.flag, *aliases, action=argparse.BooleanOptionalAction, default=value, help=text, **extra
        )
    elif isinstance(setting, bounds.ChoiceSetting):
        parser.add_argument(setting.flag, *aliases, choices=setting.choices, default=value, help=text, **extra)
    else:
        extra.setdefault("type", arg_type(setting))
        parser.add_argument(setting.flag, *aliases, default=value, help=text, **extra)


def add_flag(parser: argparse.ArgumentParser, setting: bounds.Setting[Any], help: str, **extra: Any) -> None:
    """A flag that is no field of the settings record (the front's port, pid file, reload timeout)."""
    add_setting(parser, Declared(setting.name, setting, help, "", setting.default), **extra)


def positive_int(text: str) -> int:
    """A count >= 1 that is no serving setting (`-dp`, simulation sizes)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 that is no serving setting (a seed)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    return arg_type(bounds.IntSetting(name="value", default=None, low=low))(text)
