"""The argument parser every `pynvmf` command is built with.

argparse, with four rules added for all commands at once:
  - no option prefixes (`--mem 16M` is not `--memory`): allow_abbrev=False;
  - an option given twice is refused, not silently the last one (repeatable options,
    `action="append"` or `"count"`, excepted);
  - a usage error is reported by the parser of the command it belongs to, with that
    command's usage (argparse leaves an unknown option of a subcommand to the top);
  - a parser may know habits from other tools that mean something else here
    (`habits`: option -> hint), and adds the hint when an error comes with one.
And --help shows each option's default (DefaultsFormatter).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

# Where the options a command was given are remembered while it is parsed; removed
# from the namespace before it is returned.
_GIVEN = "_pynvmf_given_options"


class _Once(argparse.Action):
    """An action that stores what it is given (stored()), and refuses to run twice for
    the same destination."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self._first_time(namespace, option_string, None if self.nargs == 0 else values)
        setattr(namespace, self.dest, self.stored(values))

    def stored(self, values: Any) -> Any:
        return values

    def _first_time(
        self, namespace: argparse.Namespace, option_string: str | None, values: Any = None
    ) -> None:
        if option_string is None:  # a positional: argparse fills it once
            return
        given: dict[str, str] | None = getattr(namespace, _GIVEN, None)
        if given is None:
            given = {}
            setattr(namespace, _GIVEN, given)
        shown = isinstance(values, str | int | float) and not isinstance(values, bool)
        this = f"{option_string} {values}" if shown else option_string
        if self.dest in given:
            raise argparse.ArgumentError(
                self, f"given twice ({given[self.dest]}, then {this}): give it once"
            )
        given[self.dest] = this


class Store(_Once):
    pass


class StoreConst(_Once):
    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        const: Any = None,
        default: Any = None,
        required: bool = False,
        help: str | None = None,
        metavar: str | None = None,
    ) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            const=const,
            default=default,
            required=required,
            help=help,
            metavar=metavar,
        )

    def stored(self, values: Any) -> Any:
        return self.const


class _StoreFlag(StoreConst):
    """store_true and store_false: `value` when given, the other one by default."""

    value: bool

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        default: bool | None = None,
        required: bool = False,
        help: str | None = None,
    ) -> None:
        if default is None:
            default = not self.value
        super().__init__(
            option_strings, dest, const=self.value, default=default, required=required, help=help
        )


class StoreTrue(_StoreFlag):
    value = True


class StoreFalse(_StoreFlag):
    value = False


_ONCE_ACTIONS: dict[str | None, type[argparse.Action]] = {
    None: Store,
    "store": Store,
    "store_const": StoreConst,
    "store_true": StoreTrue,
    "store_false": StoreFalse,
}


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows an option's default, unless its help already speaks of it or
    there is none to show (None, False: the option is simply not given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0  # a flag or a counter: nothing to give
        ):
            return action.help
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        return f"{text} (default {shown})".lstrip()


class RawDescriptionFormatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    """DefaultsFormatter, with the description printed as written."""


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser with pynvmf's rules (see the module docstring)."""

    def __init__(self, *args: Any, habits: Mapping[str, str] | None = None, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.habits: dict[str, str] = dict(habits or {})
        self._arg_strings: list[str] = []
        self._subcommands: argparse.Action | None = None
        for name, action in _ONCE_ACTIONS.items():
            self.register("action", name, action)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._arg_strings = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # Left over by a subcommand's parser: its usage is the one that helps.
            self._owner(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        if hasattr(parsed, _GIVEN):
            delattr(parsed, _GIVEN)
        return parsed

    def add_subparsers(self, **kwargs: Any) -> Any:
        self._subcommands = super().add_subparsers(**kwargs)
        return self._subcommands

    def options(self) -> list[argparse.Action]:
        """This parser's options and positionals, -h included."""
        return list(self._actions)

    def subcommands(self) -> dict[str, Parser]:
        """The parsers of this parser's subcommands, by name."""
        action = self._subcommands
        if action is None or not isinstance(action.choices, dict):
            return {}
        return {name: sub for name, sub in action.choices.items() if isinstance(sub, Parser)}

    def _owner(self, parsed: argparse.Namespace) -> Parser:
        if self._subcommands is not None:
            sub = self.subcommands().get(getattr(parsed, self._subcommands.dest, None) or "")
            if sub is not None:
                return sub._owner(parsed)
        return self

    def hints(self) -> list[str]:
        """The hints of the habits among the arguments this parser was given."""
        found = []
        for option, hint in self.habits.items():
            if any(arg == option or arg.startswith(option + "=") for arg in self._arg_strings):
                found.append(hint)
        return found

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        text = f"{self.prog}: error: {message}\n"
        text += "".join(f"{self.prog}: hint: {hint}\n" for hint in self.hints())
        self.exit(2, text)
