"""The daemon's configuration file: ``envd --config FILE`` (or ``ENVD_CONFIG``).

A TOML file whose keys are the daemon's flags without their dashes in front
(``max-sessions`` or ``max_sessions``), read with the standard library's
tomllib (``tomli`` where Python 3.10 has it; without it, --config says to
install it: trainers never need it)::

    threads = 8
    bind = ["ipc:///run/envd/envd.sock", "tcp://0.0.0.0:5555"]
    max-sessions = 256
    python-env = ["Acrobot-v1"]          # a repeatable flag takes a list
    curve-secret-key = "/etc/envd/keys/daemon.key_secret"
    curve-allowed-clients = "/etc/envd/clients"

What a value may be follows the flag: an int for an int flag (never a bool),
an int or a float for a float flag, a string for a string flag, a list of ints
for ``pin-cpus``, a string or a list of strings for ``bind``, ``plugin``,
``python-env`` and ``import``, a bool for ``insecure``.  An unknown key, a
wrong type or a file that does not parse stops the daemon with a message
naming the file and the key (and the closest known key to a mistyped one).

The file is trusted as the command line is (``import`` makes the daemon run a
module), so it must be a regular file of the daemon's user or root that no
other user may write (envd.ownership, the client's rule for its socket
folder), and at most MAX_BYTES long; anything else is refused, saying why.

Precedence (server/config.py, from_args): a flag on the command line, then
its ``ENVD_*`` variable, then this file, then the default.  The file's
``bind`` comes before the fallback to ``ENVD_ENDPOINT``.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from typing import Any

from envd import ownership

#: The largest file read: settings fit in a few kilobytes.
MAX_BYTES = 1 << 20
#: Repeatable flags: the file's key (its flag's name) -> Config's field.
LIST_KEYS = {"bind": "bind", "plugin": "plugins", "python_env": "python_envs",
             "import": "imports", "ocean": "ocean_envs"}


def _toml_loads() -> Callable[[str], dict[str, Any]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # (tomllib's API under its 3.10 name)
        except ImportError:
            raise ValueError("--config needs Python >= 3.11 (tomllib) or the tomli package "
                             "on Python 3.10: pip install tomli") from None
    return tomllib.loads


def _expect(path: str, key: str, value: Any, kind: Callable[[str], object]) -> Any:
    """value checked against a flag's type (kind: int, float, str or the
    pin-cpus parser); ValueError naming the file and the key otherwise."""
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if kind not in (int, float, str):  # pin-cpus: a list of CPU numbers
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in value):
            return tuple(value)
        raise ValueError(f"--config {path}: {key} must be a list of CPU numbers, "
                         f"got {value!r}")
    wanted = {int: "an integer", float: "a number", str: "a string"}[kind]
    raise ValueError(f"--config {path}: {key} must be {wanted}, got {value!r}")


def load(path: str | os.PathLike | None,
         flags: dict[str, tuple[Callable[[str], object], str]]) -> dict[str, Any]:
    """The Config values of the file at path (none when path is None),
    keyed by Config field.  flags: the typed flags (server/config.py's
    _FLAGS: field -> (type, help)), whose keys and types the file takes,
    besides LIST_KEYS and insecure.  ValueError on anything else."""
    if path is None:
        return {}
    path = os.fspath(path)
    loads = _toml_loads()
    try:
        # O_NONBLOCK: a FIFO given as the file is refused below, not waited on
        # (symlinks are followed: a Kubernetes ConfigMap's files are links)
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            why = ownership.untrusted_reason(os.fstat(f.fileno()), is_dir=False)
            if why is not None:  # (the file checked is the file read)
                raise ValueError(f"--config {path}: refused, {why}: whoever may change it "
                                 "controls the daemon (e.g. its import key); make it the "
                                 "daemon user's or root's, mode 0644 or stricter")
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"--config {path}: larger than {MAX_BYTES} bytes; a settings file "
                         "is a few lines")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--config {path}: not UTF-8 text (TOML is UTF-8)") from None
    try:
        table = loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError: it says line and column
        raise ValueError(f"--config {path}: not valid TOML: {exc}") from None
    known = [*flags, *LIST_KEYS, "insecure"]
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in flags:
            values[name] = _expect(path, key, value, flags[name][0])
        elif name in LIST_KEYS:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError(f"--config {path}: {key} must be a string or a list of "
                                 f"strings, got {value!r}")
            values[LIST_KEYS[name]] = tuple(items)
        elif name == "insecure":
            if not isinstance(value, bool):
                raise ValueError(f"--config {path}: insecure must be true or false, "
                                 f"got {value!r}")
            values[name] = value
        else:
            spelled = [k.replace("_", "-") for k in known]
            match = difflib.get_close_matches(key.replace("_", "-"), spelled, n=1)
            hint = f" (did you mean {match[0]!r}?)" if match else ""
            raise ValueError(f"--config {path}: unknown key {key!r}{hint}; the keys are the "
                             "daemon's flags without their dashes (envd --help)")
    return values
