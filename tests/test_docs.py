"""The configuration reference and the troubleshooting page must not drift from the code.

- docs/configuration.md names every ``--flag`` of ``envd --help`` and of each
  subcommand's ``--help``, and every ``ENVD_*`` variable the package reads
  (found by grepping src/envd/, client/, server/ and native/ ``.py`` files, plus
  the variable of every daemon flag); each daemon flag's table row names its
  variable and, where the default is a constant, that default.
- docs/troubleshooting.md quotes error messages verbatim: each phrase in
  TROUBLESHOOTING_PHRASES must occur both in the page and in a string literal
  of the source, so rewording an error (or the page) fails here.

No daemon is started; the help texts come from envd.tools.cli.main in-process.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import re
from pathlib import Path

import pytest

from envd.server import config as server_config
from envd.tools import cli

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION = ROOT / "docs" / "configuration.md"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
#: The package's source folders (import names envd, envd.client, envd.server, envd.native).
PACKAGE_DIRS = ("src/envd", "client", "server", "native")

#: An ENVD_ name: not part of a longer identifier (_ENVD_INFO_KEYS), not a
#: pattern such as "ENVD_E*".
_VARIABLE = re.compile(r"\bENVD_[A-Z][A-Z0-9_]*(?![A-Za-z0-9_*])")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _normalized(text: str) -> str:
    return " ".join(text.split())


def _mentions(text: str, word: str) -> bool:
    """Whether text names word (a flag or variable) as a whole word."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def _help(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    """What `envd ARGV --help` prints, unwrapped (very wide columns)."""
    monkeypatch.setenv("COLUMNS", "10000")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    assert exit_info.value.code == 0
    return out.getvalue()


def _subcommands(main_help: str) -> list[str]:
    match = re.search(r"\{([a-z,]+)\}", main_help)
    assert match, "envd --help lists no subcommands"
    return match.group(1).split(",")


def _python_files() -> list[Path]:
    return sorted(p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py"))


def _c_names() -> set[str]:
    """ENVD_ identifiers of the C core (macros, enum values): not variables."""
    names: set[str] = set()
    for path in (ROOT / "native").rglob("*"):
        if path.suffix in (".c", ".h"):
            names.update(_VARIABLE.findall(path.read_text(errors="replace")))
    return names


def variables_in_code() -> set[str]:
    """Every ENVD_* environment variable the package reads: the names in its
    Python sources that are not C identifiers, plus the variable of every
    daemon flag (config.py builds those names from the flags')."""
    found: set[str] = set()
    for path in _python_files():
        found.update(_VARIABLE.findall(path.read_text()))
    found -= _c_names()
    found.update(f"ENVD_{name.upper()}" for name in server_config._FLAGS)
    found.update({"ENVD_BIND", "ENVD_PLUGINS", "ENVD_INSECURE"})
    return found


def _literals_of_python() -> list[str]:
    """The literal text of every string in the package's Python sources: f-strings
    give the pieces between their placeholders; adjacent literals are one."""
    fragments = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                fragments.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                fragments.extend(v.value for v in node.values
                                 if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return fragments


_C_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_C_ADJACENT = re.compile(r'"(?:[^"\\\n]|\\.)*"(?:\s*"(?:[^"\\\n]|\\.)*")*')


def _literals_of_c() -> list[str]:
    """The string literals of the C core, adjacent ones joined, \\" unescaped."""
    fragments = []
    for path in (ROOT / "native").rglob("*.c"):
        for match in _C_ADJACENT.finditer(path.read_text(errors="replace")):
            text = "".join(_C_STRING.findall(match.group(0)))
            fragments.append(text.replace('\\"', '"').replace("\\n", "\n"))
    return fragments


# ---- the configuration reference ----------------------------------------------------
def test_every_flag_of_every_command_is_documented(monkeypatch):
    main_help = _help(monkeypatch)
    doc = CONFIGURATION.read_text()
    helps = {"envd": main_help}
    for command in _subcommands(main_help):
        helps[f"envd {command}"] = _help(monkeypatch, command)
        assert f"envd {command}" in doc, f"docs/configuration.md does not describe `envd {command}`"
    missing = {name: sorted({f for f in _FLAG.findall(text) if not _mentions(doc, f)})
               for name, text in helps.items()}
    missing = {name: flags for name, flags in missing.items() if flags}
    assert not missing, f"flags missing from docs/configuration.md: {missing}"
    assert len(_FLAG.findall(main_help)) > 15  # the extraction found the daemon's flags


def test_every_environment_variable_is_documented(monkeypatch):
    doc = CONFIGURATION.read_text()
    variables = variables_in_code() | set(_VARIABLE.findall(_help(monkeypatch)))
    # the grep must see the client's variables, and must not mistake C names for them
    assert {"ENVD_ENDPOINT", "ENVD_TRANSPORT", "ENVD_SERVER_KEY", "ENVD_CLIENT_KEY",
            "ENVD_PLUGINS", "ENVD_BIND", "ENVD_THREADS"} <= variables
    assert not variables & {"ENVD_OK", "ENVD_EINVAL", "ENVD_ABI_VERSION", "ENVD_E"}
    missing = sorted(v for v in variables if not _mentions(doc, v))
    assert not missing, f"variables missing from docs/configuration.md: {missing}"


def _row(doc: str, flag: str) -> str:
    rows = [line for line in doc.splitlines()
            if re.match(rf"\|\s*`{re.escape(flag)}(?![\w-])", line)]
    assert len(rows) == 1, f"docs/configuration.md needs one table row for {flag}, has {len(rows)}"
    return rows[0]


def test_each_daemon_flag_row_names_its_variable_and_default():
    doc = CONFIGURATION.read_text()
    defaults = {f.name: f.default for f in dataclasses.fields(server_config.Config)}
    for name in [*server_config._FLAGS, "bind", "plugins", "insecure"]:
        flag = "--plugin" if name == "plugins" else "--" + name.replace("_", "-")
        row = _row(doc, flag)
        variable = f"ENVD_{name.upper()}"
        assert _mentions(row, variable), f"the row of {flag} does not name {variable}"
        default = defaults[name]
        if isinstance(default, bool) or not isinstance(default, (int, float, str)):
            continue  # None, MISSING (machine-dependent: threads, bind, shm) or a switch
        spelled = {f"`{default}`"}
        if isinstance(default, float) and default.is_integer():
            spelled.add(f"`{int(default)}`")
        assert any(s in row for s in spelled), \
            f"the row of {flag} does not give its default {default!r} as {sorted(spelled)}"


def test_the_precedence_and_default_endpoint_are_described():
    doc = _normalized(CONFIGURATION.read_text())
    assert "Flag > variable > default" in doc
    assert "`--bind` falls back to `ENVD_ENDPOINT`" in doc
    for step in ("`ENVD_ENDPOINT`, if set and not empty", "`ipc://$XDG_RUNTIME_DIR/envd.sock`",
                 "`ipc:///tmp/envd-$UID/envd.sock`"):
        assert step in doc


# ---- the troubleshooting page ---------------------------------------------------------
#: Phrases of error messages the page quotes, each a piece of one string
#: literal in the source (never spanning a placeholder).
TROUBLESHOOTING_PHRASES = [
    # multi-agent envs (src/envd/make_options.py)
    " rows, more than the ",
    # ABI 5 envs (native/vector_env.py, native/src/describe.c, native/registry.py)
    " resets itself (it starts its next episode inside step, and has no ",
    "time limit of envd's): make it without ",
    ": envs of one vec must have the same spaces: the params ",
    "describe other spaces, agents or state size than env 0's",
    ": describe failed for the params of env ",
    "describe fails at the default params: ",
    "; give one value per env, or a scalar for all",
    # hosted Python envs (native/hosted_*.py)
    "died; close this env",
    "making the env failed: ",
    "hosted Python envs support Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them",
    "-byte slot (make's info_bytes)",
    # make's options (src/envd/make_options.py)
    "hosted Python envs ('py:<gymnasium id>' or an env creator)",
    # a kind's ids a daemon serves only with its flag (server/make_builders.py)
    " ids; its operator names them with ",
    # connecting (client/connection.py, client/discovery.py)
    "; start one with `envd --threads N` (or set ENVD_ENDPOINT to the daemon's endpoint)",
    "has no listener",
    "no envd daemon answered at",
    "endpoint must be 'ipc:///path' or 'tcp://host:port', got",
    "no envd daemon to connect to (is the name right, and are the daemons' pods ready?)",
    "permission denied connecting to",
    "start your own daemon, or use one whose socket folder lets you in",
    # lost connections, timeouts, draining
    "the daemon stopped or crashed, and its sessions are gone",
    "was lost and its sessions with it; connect again",
    "s (Client timeout)",
    "it may still use the env's buffers; retry later (or make a new env)",
    "so which envs are in flight is unknown; close it and make a new env",
    "the daemon is shutting down and takes no new work",
    # leases (server/service.py)
    "(the lease timeout), so the daemon freed its envs; make a new env",
    "the client left (bye) or its lease expired while its env was being made",
    # shared memory (server/service.py, src/envd/shm.py, client/remote_vector_env.py)
    "bytes (--max-shm-bytes); close envs you no longer use or make fewer",
    "bytes over its limit of",
    "bytes (--max-state-bytes); close envs you no longer use or make fewer",
    "bytes of env state (state_size",
    "the host's shared memory (/dev/shm; in a container see --shm-size) or memory is exhausted",
    "no such segment here.",
    "shared-memory sessions need the daemon on this host, sharing /dev/shm",
    "runs as another user (segments are mode 0600)",
    "to send the arrays over the socket instead",
    "see different /dev/shm",
    "its shared-memory segment while the daemon used it, so its results are lost. Nothing "
    "may resize a session's segment under /dev/shm; make a new env",
    "the daemon's mapping was replaced by private memory (no SIGBUS) and the session dropped",
    "while the daemon set it up; nothing may resize a session's segment",
    "refusing to map the session's shared memory",
    "lets other users write it",
    "must run as your user (or root) and nothing else may write them; check the owner and mode "
    "with `ls -l ",
    # the client's trust in its default folder (client/connection.py, src/envd/ownership.py)
    "is not safe: ",
    "Another user may have created it to serve you their daemon. Check it with `ls -ld ",
    "; if it is not yours, remove it (the daemon creates it with mode 0700) or connect to an "
    "explicit endpoint",
    "it is not a directory (a symlink or another kind of file)",
    # the stale-segment sweep (server/stale_segments.py)
    "that look like envd's but are not this daemon's to remove (another user's, not a regular "
    "file, or not removable): ",
    # the daemon's folder and endpoints (server/daemon.py)
    "must be a directory owned by uid",
    "remove it, or pick another endpoint with --bind",
    "another daemon already serves",
    "exists and is not a socket; pick another endpoint with --bind",
    # CURVE (client/connection.py, src/envd/keys.py, server/config.py, server/daemon.py)
    "requires CURVE authentication: pass server_key= (the daemon's public .key file)",
    "uses CURVE but hung up during the handshake, as it does for a wrong server key",
    "that public key must be in a .key file in the daemon's --curve-allowed-clients directory",
    "does not use CURVE (it runs without --curve-secret-key), but this client gave keys",
    "CURVE needs both keys, got",
    "holds a secret key but has mode",
    "holds no secret-key: give the .key_secret file",
    ": cannot read it (",
    "holds no *.key file, so no client could connect",
    "CURVE takes the daemon's .key_secret file (--curve-secret-key)",
    "can be reached from the network, and without CURVE keys anyone who reaches it may use "
    "the daemon",
    "envd keygen never overwrites a key",
    "has no effect: no --bind endpoint is tcp (ipc endpoints never use CURVE)",
    "is writable by other users, who can make the daemon admit their own keys",
    # limits (server/service.py, client/connection.py)
    "sessions (--max-sessions); close envs you no longer use",
    "sessions per client (--max-sessions-per-client); close envs you no longer use",
    "envs per client (--max-envs-per-client)",
    "(--max-message-bytes)",
    "request was refused and not executed. Back off: retry in",
    "large replies it has not acknowledged reading, at or over the daemon's limit of",
    "bytes of replies its clients have not read",
    "(--max-reply-bytes-per-client)",
    "its results were not sent",
    "the daemon dropped this connection because it did not read its replies",
    # rendering (native/registry.py, src/envd/vector_base.py, src/envd/vec_errors.py, native/native_vec.py,
    # server/service.py)
    "does not render (its definition has no render callback): make it with render_mode=None",
    "render_mode must be None or",
    "was made without a render mode; make it with render_mode='rgb_array' to render",
    "call reset() before render()",
    "render() while envs are in flight or not received yet",
    "bytes of frames (",
    "envs, or ask the operator to raise the limit",
    "and freed its sessions; connect again and read every reply",
    "dropped a client that does not read its replies",
    "got no reply within",
    # per-session thread caps (src/envd/make_options.py, client/connection.py)
    "per-session thread caps (max_threads)",
    " threads (--threads), so 0 <= max_threads <= ",
    "max_threads must be an int",
    # gymnasium (src/envd/vec_info.py, src/envd/vector_base.py, src/envd/gymnasium_registry.py,
    # src/envd/single_env.py)
    "episode_statistics must be True (info[",
    "]), False (none) or an info key such as 'episode' (an identifier not starting with '_', "
    "not one of ",
    ": pick another episode_statistics key",
    "would give gymnasium's own ",
    "truncated); call reset() before stepping again",
    # file descriptors and connections (server/daemon.py, client/connection.py)
    "close envs you no longer use, or raise the daemon's limit (ulimit -n)",
    "it holds its maximum of connections (--max-connections) or is stopping",
    # plugins (server/plugins.py, native/registry.py, native/src/plugin.c)
    "; serving without it",
    '(see "plugins" in envd.h)',
    "cannot load it: ",
    "rebuild it against this envd's envd.h (python -m envd.native --include)",
    "is already registered",
    "unknown env id",
    # mistyped ids and kwargs (native/registry.py)
    " (did you mean ",
    "make's argument ",
    "; its parameters are: ",
    # startup (server/config.py, src/envd/tools/cli.py, server/daemon.py)
    " is not a valid --",
    "is not a valid boolean (1/true/yes or 0/false/no)",
    "needs one CPU per thread",
    "CPU(s) this daemon may run on: at most ",
    "threads step at once (--threads ",
    "must start with ipc:// or tcp://",
    "pick another port with --metrics-port",
    "install it with pip install 'envd-rl[metrics]'",
    "envd: cannot start: ",
    "at startup; a module or env that hangs?",
    "(ENVD_PLUGINS): no such file",
    "envd status: ",
    "envd list: ",
]


@pytest.fixture(scope="module")
def source_literals() -> list[str]:
    return [_normalized(text) for text in _literals_of_python() + _literals_of_c()]


@pytest.mark.parametrize("phrase", TROUBLESHOOTING_PHRASES)
def test_quoted_messages_occur_in_the_code_and_the_page(phrase, source_literals):
    wanted = _normalized(phrase)
    assert any(wanted in text for text in source_literals), \
        f"no string in the source contains {phrase!r}: reworded? update docs/troubleshooting.md"
    assert wanted in _normalized(TROUBLESHOOTING.read_text()), \
        f"docs/troubleshooting.md no longer quotes {phrase!r}"


def test_the_multi_agent_plugin_example_is_the_tested_plugin():
    """docs/writing-envs.md's multi-agent plugin excerpt is verbatim from
    tests/native/multi_agent.c (the plugin the tests build and check), so the
    example cannot drift from code that compiles and passes."""
    page = (ROOT / "docs" / "writing-envs.md").read_text()
    section = page.split("### A multi-agent plugin", 1)[1]
    excerpt = section.split("```c\n", 1)[1].split("```", 1)[0]
    source = (ROOT / "tests" / "native" / "multi_agent.c").read_text()
    for block in excerpt.strip("\n").split("\n\n"):  # (the step, then the definition)
        assert block + "\n" in source, block


def test_the_pages_are_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert "docs/configuration.md" in readme and "docs/troubleshooting.md" in readme


def test_the_readme_command_summary_names_every_flag(monkeypatch):
    """The README's command summary (the first bash block under "### The
    daemon") names every flag of `envd --help` and of each subcommand."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### The daemon", 1)[1]
    summary = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    main_help = _help(monkeypatch)
    helps = {"envd": main_help}
    helps.update({f"envd {c}": _help(monkeypatch, c) for c in _subcommands(main_help)})
    missing = {name: sorted({f for f in _FLAG.findall(text) if not _mentions(summary, f)})
               for name, text in helps.items()}
    missing = {name: flags for name, flags in missing.items() if flags}
    assert not missing, f"flags missing from README.md's command summary: {missing}"
    for command in _subcommands(main_help):
        assert re.search(rf"^envd (\[.*\]\S* )?{command}\b", summary, re.M), command


# ---- make's options (src/envd/make_options.py) ------------------------------------------
def _make_options_table() -> dict[str, list[str]]:
    """docs/configuration.md's table of who takes each make option: option -> cells."""
    section = CONFIGURATION.read_text().split("### Which env kinds take which make options")[1]
    rows = {}
    for line in section.split("\n#")[0].splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_env_kinds_table_is_the_registry():
    """docs/configuration.md's table of env kinds says, per kind, the entry
    points that make it and the daemon flag that names its ids exactly as
    envd.make_options.KINDS declares them (no kind left out)."""
    from envd import make_options as mo
    section = CONFIGURATION.read_text().split("### The env kinds")[1].split("\n#")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")][1:]
    titles = {"C envs": mo.NATIVE, "Ocean envs": mo.PUFFER, "hosted Python envs": mo.PYTHON,
              "hosted PettingZoo envs": mo.PETTINGZOO}
    got = {titles[row[0]]: row[2:6] for row in rows if not row[0].startswith("---")}
    expected = {name: ["yes" if place in kind.places else "no"
                       for place in (mo.IN_PROCESS, mo.DAEMON, mo.MULTI_DAEMON)]
                + [f"`{kind.daemon_flag}`" if kind.daemon_flag else "built in, `--plugin`"]
                for name, kind in mo.KINDS.items()}
    assert got == expected
    for kind in mo.KINDS.values():  # (the ids column names each prefix)
        assert kind.prefix is None or f"`{kind.prefix}" in section


def test_the_make_options_table_is_the_one_definition():
    """The table says, per option, the kinds and entry points that take it
    exactly as envd.make_options.OPTIONS defines them (no option left out)."""
    from envd import make_options as mo
    columns = [(mo.NATIVE, None), (mo.PUFFER, None), (mo.PYTHON, None), (mo.PETTINGZOO, None),
               (None, mo.IN_PROCESS), (None, mo.DAEMON)]
    expected = {name: ["yes" if (kind in option.kinds if kind else place in option.places)
                       else "no" for kind, place in columns] + [f"`{option.wire}`" if option.wire
                                                                 else "-"]
                for name, option in mo.OPTIONS.items()}
    assert list(_make_options_table().items()) == list(expected.items())  # (in order)
