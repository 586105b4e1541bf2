"""The ``envd`` command's argument parser: argparse, made strict and brief.

- No abbreviations (``allow_abbrev=False``, in every subcommand too): argparse
  would otherwise take ``--thread 4`` as ``--threads 4``, and a flag added
  later could silently change what an old abbreviation means.
- An unknown option is refused before argparse parses anything, naming it and
  the closest known one: ``envd --thread 4`` says ``unrecognized option
  '--thread' (did you mean '--threads'?)``, where argparse alone would complain
  that ``'4'`` is not a command.  Options are looked up where argparse looks
  for them: the daemon's before a subcommand, the subcommand's after it.
- A mistyped subcommand gets the same did-you-mean (``envd lst``: ``did you
  mean 'list'?``).
- An error prints a short usage line (``usage: envd [options] [command ...]``
  and where the full help is), not the daemon's 20-line usage block, then the
  error, and exits 2 as argparse does.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

#: A usage longer than this many lines is replaced by the short form on errors.
_USAGE_LINES = 2
_NUMBER = re.compile(r"^-\d|^-\.\d")


def closest(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate nearest to word (difflib's ratio >= 0.6), or None."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest candidate, or ``""``."""
    match = closest(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""


class EnvdArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser without abbreviations, with did-you-mean and a
    short usage line on errors; its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        self._refuse_unknown_options(argv)
        return super().parse_known_args(argv, namespace)

    # ---- what argparse does not do --------------------------------------------------
    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        """Subcommand name -> its parser (empty without subcommands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _refuse_unknown_options(self, argv: list[str]) -> None:
        """error() on the first option this parser does not know, up to a
        subcommand's name (whose parser, of this class, checks the rest when
        argparse hands them to it)."""
        commands = self._commands()
        takes_value = False
        for token in argv:
            if token == "--":
                return
            if takes_value:  # the value of the option before (it may look like anything)
                takes_value = False
                continue
            if token in commands:
                return
            if not token.startswith("-") or token == "-" or _NUMBER.match(token):
                continue
            name = token.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is None:
                options = [o for o in self._option_string_actions if o.startswith("--")]
                self.error(f"unrecognized option {name!r}{did_you_mean(name, options)}")
            takes_value = "=" not in token and action.nargs is None

    def error(self, message: str) -> NoReturn:
        """The short usage, the message (with a did-you-mean for a mistyped
        choice), exit status 2."""
        match = re.search(r"invalid choice: '([^']*)'", message)
        commands = list(self._commands())
        if match and commands and message.startswith(f"argument {{{','.join(commands)}}}"):
            word = match.group(1)
            message = (f"unknown command {word!r}{did_you_mean(word, commands)}; the "
                       f"commands are {', '.join(commands)} (none: run the daemon)")
        elif match:
            choices = [str(c) for a in self._actions if a.choices for c in a.choices]
            message += did_you_mean(match.group(1), choices)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def format_usage(self) -> str:
        """argparse's usage, or for a long one (the daemon's flags) one line
        saying where the rest is."""
        usage = super().format_usage()
        if usage.count("\n") <= _USAGE_LINES:
            return usage
        command = " [command ...]" if self._commands() else ""
        return f"usage: {self.prog} [options]{command}  (`{self.prog} --help` lists them)\n"
