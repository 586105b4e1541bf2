"""The daemon's TOML configuration file (server/config_file.py): its keys are
the flags' names, precedence is flag > ENVD_* variable > file > default, and a
bad file (unknown key, wrong type, bad TOML, too large, not UTF-8, writable
by others, not a regular file, missing) stops the daemon with one message
naming the file and the key."""
from __future__ import annotations

import argparse
import builtins
import os

import pytest
from support.daemon import DaemonProcess

from envd.server import config_file
from envd.server.config import Config, add_arguments, from_args


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("ENVD_"):
            monkeypatch.delenv(name)
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


def parse(argv, environ=None) -> Config:
    parser = argparse.ArgumentParser(prog="envd")
    add_arguments(parser)
    return from_args(parser.parse_args(argv), {} if environ is None else environ)


def write(tmp_path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "envd.toml"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_file_sets_what_flags_and_variables_leave_out(tmp_path):
    path = write(tmp_path, """
threads = 1
max-sessions = 7
lease_timeout = 12          # an int for a float flag
hello-timeout = 2.5
bind = "ipc:///tmp/from-file.sock"
python-env = ["Acrobot-v1", "CartPole-v1"]
import = ["my_envs"]
pin-cpus = [0]
insecure = true
""")
    config = parse(["--config", path])
    assert (config.threads, config.max_sessions, config.lease_timeout) == (1, 7, 12.0)
    assert config.hello_timeout == 2.5 and config.pin_cpus == (0,)
    assert config.bind == ("ipc:///tmp/from-file.sock",)
    assert config.python_envs == ("Acrobot-v1", "CartPole-v1") and config.imports == ("my_envs",)
    assert config.insecure is True
    default = Config()
    assert config.max_workers == default.max_workers  # not in the file: the default


def test_flag_then_variable_then_file_then_default(tmp_path):
    path = write(tmp_path, "max-sessions = 7\nlease-timeout = 12\nmax-workers = 5\n"
                           "python-env = ['Acrobot-v1']\nbind = 'ipc:///tmp/file.sock'\n"
                           "insecure = true\n")
    environ = {"ENVD_MAX_SESSIONS": "8", "ENVD_LEASE_TIMEOUT": "13",
               "ENVD_PYTHON_ENVS": "CartPole-v1", "ENVD_ENDPOINT": "ipc:///tmp/clients.sock",
               "ENVD_INSECURE": "0"}
    config = parse(["--config", path, "--max-sessions", "9"], environ)
    assert config.max_sessions == 9           # the flag
    assert config.lease_timeout == 13.0       # the variable over the file
    assert config.max_workers == 5            # the file over the default
    assert config.python_envs == ("CartPole-v1",)
    assert config.bind == ("ipc:///tmp/file.sock",)  # the file's bind before ENVD_ENDPOINT
    assert config.insecure is False           # ENVD_INSECURE=0 over the file's true
    assert parse(["--config", path, "--bind", "ipc:///tmp/flag.sock"]).bind == \
        ("ipc:///tmp/flag.sock",)
    assert parse(["--config", path], {"ENVD_BIND": "ipc:///tmp/var.sock"}).bind == \
        ("ipc:///tmp/var.sock",)


def test_envd_config_names_the_file(tmp_path):
    path = write(tmp_path, "max-sessions = 3\n")
    assert parse([], {"ENVD_CONFIG": path}).max_sessions == 3
    other = tmp_path / "other.toml"
    other.write_text("max-sessions = 4\n")
    other.chmod(0o600)
    assert parse(["--config", str(other)], {"ENVD_CONFIG": path}).max_sessions == 4


@pytest.mark.parametrize("text, message", [
    ("thread = 3", "unknown key 'thread' (did you mean 'threads'?)"),
    ("max_sesions = 3", "unknown key 'max_sesions' (did you mean 'max-sessions'?)"),
    ("threads = '3'", "threads must be an integer, got '3'"),
    ("threads = true", "threads must be an integer, got True"),
    ("lease-timeout = 'long'", "lease-timeout must be a number"),
    ("log-level = 3", "log-level must be a string"),
    ("pin-cpus = '0,1'", "pin-cpus must be a list of CPU numbers"),
    ("python-env = [1]", "python-env must be a string or a list of strings"),
    ("insecure = 1", "insecure must be true or false"),
    ("threads = ", "not valid TOML"),
    ("[section]\nthreads = 1", "unknown key 'section'"),
])
def test_a_bad_file_is_refused_naming_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as exc:
        parse(["--config", path])
    assert str(exc.value).startswith(f"--config {path}: ") and message in str(exc.value)


def test_values_are_still_checked_by_config(tmp_path):
    with pytest.raises(ValueError, match=r"--threads \(ENVD_THREADS\) must be in"):
        parse(["--config", write(tmp_path, "threads = -1")])


def test_a_file_others_may_write_is_refused(tmp_path):
    path = write(tmp_path, "threads = 1", mode=0o666)
    with pytest.raises(ValueError, match="refused, its mode 0o666 lets other users write it"):
        parse(["--config", path])
    os.chmod(path, 0o644)
    assert parse(["--config", path]).threads == 1


def test_what_is_not_a_small_utf8_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="refused, it is not a regular file"):
        parse(["--config", str(fifo)])  # at once: not waiting for a writer
    with pytest.raises(ValueError, match="cannot read it"):
        parse(["--config", str(tmp_path / "missing.toml")])
    big = write(tmp_path, "# " + "x" * config_file.MAX_BYTES + "\n")
    with pytest.raises(ValueError, match="larger than"):
        parse(["--config", big])
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"log-level = '\xe9'\n")
    latin.chmod(0o600)
    with pytest.raises(ValueError, match="not UTF-8"):
        parse(["--config", str(latin)])


def test_python_3_10_without_tomli_is_told_what_to_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_toml(name, *args, **kwargs):
        if name in ("tomllib", "tomli"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_toml)
    with pytest.raises(ValueError, match="pip install tomli"):
        parse(["--config", write(tmp_path, "threads = 1")])


def test_a_daemon_serves_with_its_files_settings(tmp_path):
    path = write(tmp_path, "max-sessions = 5\nlease-timeout = 11\nthreads = 1\n")
    with DaemonProcess(tmp_path / "daemon", "--config", path) as daemon:
        with daemon.connect() as client:
            status = client.status()
    assert status["limits"]["max_sessions"] == 5 and status["lease_timeout"] == 11.0
    assert status["threads"] == 1
