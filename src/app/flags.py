"""Argparse flags derived from the settings record's declarations (`adapters/config/declarations.py`),
for both CLIs (R-ARG-2), and their parser: no abbreviations, a did-you-mean (R-ARG-3).

A flag's type refuses what its setting refuses (one line: `argument --flag: expected …`),
its choices are the setting's, and its help says what it does and its default, as declared.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from vllm_srun.adapters.config.declarations import Declared
from vllm_srun.domain.settings import bounds

KEEP = object()  # `add_setting(default=KEEP)`: the declared default
# what `--help` shows for a value, where the setting's name in capitals would not say it
METAVARS = {
    bounds.MEMORY_BUDGET_GIB.name: "GIB",
    bounds.CACHE_DIR.name: "DIR",
    bounds.REVISION.name: "REV",
    bounds.SERVED_MODEL_NAME.name: "NAME",
    bounds.LOAD_ATTEMPTS.name: "N",
    bounds.LOAD_RETRY_SECONDS.name: "S",
}


_HINTS = "_did_you_mean"  # namespace attribute: {unrecognized flag: the flag it is likely to mean}


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose refusals are one line and exit status 2, that takes no
    abbreviation of a flag (`--model` is not `--models`, `--api-key` not `--api-key-file`: a
    habit of another CLI meets "unrecognized arguments" instead of another meaning), and that
    names the flag an unrecognized one probably meant, in the same line (`did_you_mean`).
    Subcommands' parsers (`add_subparsers(parser_class=OneLineParser)`) are the same."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        # the innermost parser that saw a flag knows its options best: a subcommand's hints stay
        hints = dict(getattr(ns, _HINTS, None) or {})
        for flag in extras:
            name = flag.split("=", 1)[0]
            if name.startswith("-") and name not in hints:
                guess = did_you_mean(name, self._option_string_actions)
                if guess is not None:
                    hints[name] = guess
        setattr(ns, _HINTS, hints)
        return ns, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        hints = getattr(ns, _HINTS, None) or {}
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint_text(hints)}")
        if hasattr(ns, _HINTS):
            delattr(ns, _HINTS)
        return ns


def did_you_mean(flag: str, options: Iterable[str]) -> str | None:
    """The option FLAG most likely means: one it begins (what an abbreviation would have
    meant), else the closest spelling (difflib); None when nothing is close."""
    known = sorted(option for option in options if option.startswith("--") and option != "--help")
    longer = [option for option in known if option.startswith(flag)]
    if flag.startswith("--") and longer:
        return min(longer, key=len)
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    return close[0] if close else None


def hint_text(hints: dict[str, str]) -> str:
    """` (did you mean --models?)`, or ` (did you mean --a for --x, --b for --y?)`; '' for none."""
    if not hints:
        return ""
    if len(hints) == 1:
        return f" (did you mean {next(iter(hints.values()))}?)"
    return " (did you mean " + ", ".join(f"{guess} for {flag}" for flag, guess in hints.items()) + "?)"


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
    if setting.name in METAVARS and not isinstance(setting, bounds.SwitchSetting):
        extra.setdefault("metavar", METAVARS[setting.name])
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
