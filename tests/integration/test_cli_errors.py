"""The `envd` command's errors (src/envd/tools/cli_parser.py): no argparse
abbreviations (`envd --thread 4` fails instead of meaning --threads),
did-you-mean for options and subcommands, and a short usage line instead of
the daemon's full usage block; --help keeps the full usage."""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from envd.tools import cli


def run(*argv: str) -> tuple[int, str, str]:
    """cli.main(argv) in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(argv))
        except SystemExit as exc:
            status = exc.code
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv, wrong, meant", [
    (["--thread", "4"], "--thread", "--threads"),
    (["--thread=4"], "--thread", "--threads"),
    (["--threads", "2", "--lgo-level", "info"], "--lgo-level", "--log-level"),
    (["--lease", "5"], "--lease", "--lease-timeout"),     # an abbreviation argparse took
    (["list", "--jsn"], "--jsn", "--json"),
    (["list", "--js"], "--js", "--json"),                 # ... in a subcommand too
    (["status", "--endpont", "ipc:///x"], "--endpont", "--endpoint"),
    (["bench", "--thread", "2"], "--thread", "--threads"),
])
def test_an_unknown_or_abbreviated_option_fails_with_did_you_mean(argv, wrong, meant):
    status, out, err = run(*argv)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    usage, error = lines[0], lines[-1]
    assert usage.startswith("usage: envd") and len(lines) <= 3
    assert error.endswith(f"unrecognized option {wrong!r} (did you mean {meant!r}?)"), error


def test_an_unknown_option_far_from_any_has_no_suggestion():
    status, _, err = run("--zzzzzz")
    assert status == 2 and err.strip().splitlines()[-1] == \
        "envd: error: unrecognized option '--zzzzzz'"


def test_a_mistyped_subcommand_gets_did_you_mean():
    status, _, err = run("lst")
    assert status == 2
    error = err.strip().splitlines()[-1]
    assert error.startswith("envd: error: unknown command 'lst' (did you mean 'list'?)")
    assert "list, status, keygen, bench" in error


def test_an_error_prints_one_usage_line_not_the_block():
    _, _, err = run("--thread", "4")
    assert len(err.strip().splitlines()) == 2
    assert err.startswith("usage: envd [options] [command ...]  (`envd --help` lists them)")
    _, _, err = run("--threads", "notanumber")
    assert err.strip().splitlines()[-1] == \
        "envd: error: argument --threads: invalid int value: 'notanumber'"
    assert len(err.strip().splitlines()) == 2


def test_option_values_are_not_taken_for_options_or_commands():
    """A value after an option that takes one is its value, whatever it looks
    like: `--log-format list` is not the list command, and a negative number
    is a value."""
    parser_errors = []
    for argv in (["--log-format", "list", "--thread", "1"], ["--lease-timeout", "-1", "--thred"]):
        status, _, err = run(*argv)
        parser_errors.append(err.strip().splitlines()[-1])
        assert status == 2
    assert "unrecognized option '--thread'" in parser_errors[0]
    assert "unrecognized option '--thred'" in parser_errors[1]


def test_help_keeps_the_full_usage():
    status, out, _ = run("--help")
    assert status == 0 and out.startswith("usage: envd [-h] [--version] [--bind ENDPOINT]")
    assert "--max-sessions" in out.split("\n\n")[0]  # the usage block names every flag


def test_the_installed_command_refuses_an_abbreviation(tmp_path):
    result = subprocess.run([sys.executable, "-m", "envd", "--thread", "4"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "did you mean '--threads'?" in result.stderr
