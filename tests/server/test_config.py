"""The daemon's Config: defaults, flags, ENVD_* variables, validation, and the
command line's answer to a bad value."""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from envd import protocol
from envd.protocol import default_endpoint
from envd.server import config as cfg
from envd.server.config import Config, add_arguments, from_args


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No ENVD_* variable of the machine running the tests leaks in, and the
    default endpoint is a known one."""
    for name in list(os.environ):
        if name.startswith("ENVD_"):
            monkeypatch.delenv(name)
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


def parse(argv, environ=None) -> Config:
    parser = argparse.ArgumentParser(prog="envd")
    add_arguments(parser)
    return from_args(parser.parse_args(argv), dict(os.environ) if environ is None else environ)


def test_defaults(clean_environment):
    default = Config()
    assert default.threads == len(os.sched_getaffinity(0)) >= 1
    assert default.bind == (f"ipc://{clean_environment}/envd.sock",) == (protocol.default_endpoint(),)
    assert default.log_level == "info"
    assert default.log_format == "text"
    assert default.lease_timeout == 30.0
    assert default.heartbeat_interval == 10.0
    assert default.max_sessions == 1024
    assert default.max_envs_per_client == 1 << 20
    assert default.max_message_bytes == 64 << 20
    assert default.max_sessions_per_client == 256
    shm = os.statvfs("/dev/shm")
    assert default.max_shm_bytes == shm.f_blocks * shm.f_frsize // 2 > 0
    assert default.max_requests_per_second == 100_000
    assert default.request_burst == 100_000
    assert default.pin_cpus is None
    assert default.plugins == ()
    assert default.metrics_port is None  # no metrics server unless asked
    assert default.metrics_bind == "127.0.0.1"  # and then on loopback only
    assert parse([]) == default  # no flag, no variable: the defaults


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().threads = 3  # type: ignore[misc]  # the point: it is frozen


#: flag argv -> (field, value); each variable below sets the same value.
FLAGS = [
    (["--threads", "3"], "threads", 3),
    (["--threads", "0"], "threads", 0),
    (["--log-level", "debug"], "log_level", "debug"),
    (["--log-level", "WARNING"], "log_level", "WARNING"),
    (["--log-format", "json"], "log_format", "json"),
    (["--lease-timeout", "2.5"], "lease_timeout", 2.5),
    (["--max-sessions", "7"], "max_sessions", 7),
    (["--max-envs-per-client", "100"], "max_envs_per_client", 100),
    (["--max-message-bytes", "4096"], "max_message_bytes", 4096),
    (["--max-sessions-per-client", "3"], "max_sessions_per_client", 3),
    (["--max-shm-bytes", "1048576"], "max_shm_bytes", 1 << 20),
    (["--max-requests-per-second", "20"], "max_requests_per_second", 20),
    (["--max-requests-per-second", "0"], "max_requests_per_second", 0),
    (["--metrics-port", "9187"], "metrics_port", 9187),
    (["--metrics-port", "0"], "metrics_port", 0),
    (["--metrics-bind", "0.0.0.0"], "metrics_bind", "0.0.0.0"),
]


@pytest.mark.parametrize("argv, name, value", FLAGS, ids=[" ".join(a) for a, _, _ in FLAGS])
def test_every_flag_is_parsed(argv, name, value):
    config = parse(argv)
    assert getattr(config, name) == value
    assert type(getattr(config, name)) is type(value)
    others = {f.name for f in dataclasses.fields(Config)} - {name}
    default = Config()
    for other in others:
        assert getattr(config, other) == getattr(default, other), other


def test_pin_cpus_and_bind_flags():
    config = parse(["--threads", "2", "--pin-cpus", "0,1", "--bind", "ipc:///tmp/a.sock",
                    "--bind", "tcp://127.0.0.1:5555"])
    assert config.pin_cpus == (0, 1)
    assert config.bind == ("ipc:///tmp/a.sock", "tcp://127.0.0.1:5555")
    assert parse(["--threads", "3", "--pin-cpus", "1 0 1"]).pin_cpus == (1, 0, 1)


@pytest.mark.parametrize("argv, name, value", FLAGS, ids=[" ".join(a) for a, _, _ in FLAGS])
def test_every_variable_is_used_when_the_flag_is_absent(argv, name, value):
    variable = "ENVD_" + name.upper()
    config = parse([], {variable: argv[1]})
    assert getattr(config, name) == value
    assert type(getattr(config, name)) is type(value)


def test_pin_cpus_and_bind_variables():
    config = parse([], {"ENVD_THREADS": "2", "ENVD_PIN_CPUS": "1,0",
                        "ENVD_BIND": "ipc:///tmp/a.sock"})
    assert (config.threads, config.pin_cpus, config.bind) == (2, (1, 0), ("ipc:///tmp/a.sock",))


def test_plugins_flag_and_variable():
    assert parse(["--plugin", "/a.so", "--plugin", "b.so"], {}).plugins == ("/a.so", "b.so")
    assert parse([], {"ENVD_PLUGINS": "/a.so::/b c.so:"}).plugins == ("/a.so", "/b c.so")
    # the command line wins over the variable
    assert parse(["--plugin", "/x.so"], {"ENVD_PLUGINS": "/a.so"}).plugins == ("/x.so",)


def test_every_variable_at_once():
    environ = {"ENVD_THREADS": "1", "ENVD_LOG_LEVEL": "error", "ENVD_LEASE_TIMEOUT": "9",
               "ENVD_MAX_SESSIONS": "3", "ENVD_MAX_ENVS_PER_CLIENT": "30",
               "ENVD_MAX_MESSAGE_BYTES": "1000", "ENVD_PIN_CPUS": "0",
               "ENVD_BIND": "tcp://127.0.0.1:6000", "ENVD_MAX_SESSIONS_PER_CLIENT": "2",
               "ENVD_MAX_SHM_BYTES": "65536", "ENVD_MAX_REQUESTS_PER_SECOND": "500"}
    assert parse([], environ) == Config(threads=1, log_level="error", lease_timeout=9.0,
                                        max_sessions=3, max_envs_per_client=30,
                                        max_message_bytes=1000, pin_cpus=(0,),
                                        bind=("tcp://127.0.0.1:6000",),
                                        max_sessions_per_client=2, max_shm_bytes=65536,
                                        max_requests_per_second=500)


def test_the_variables_are_read_from_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("ENVD_MAX_SESSIONS", "11")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args([])).max_sessions == 11
    assert from_args(parser.parse_args([]), {}).max_sessions == 1024


@pytest.mark.parametrize("argv, name, value", FLAGS, ids=[" ".join(a) for a, _, _ in FLAGS])
def test_the_flag_wins_over_the_variable(argv, name, value):
    variable = "ENVD_" + name.upper()
    other = {"threads": "5", "log_level": "error", "lease_timeout": "77",
             "max_sessions": "99", "max_envs_per_client": "999",
             "max_message_bytes": "9999", "max_sessions_per_client": "9",
             "max_shm_bytes": "99999", "max_requests_per_second": "7",
             "metrics_port": "9999", "metrics_bind": "::1", "log_format": "text"}[name]
    assert getattr(parse(argv, {variable: other}), name) == value
    assert getattr(parse([], {variable: other}), name) != value


def test_the_bind_flag_wins_over_envd_bind_and_envd_endpoint(monkeypatch):
    monkeypatch.setenv("ENVD_ENDPOINT", "ipc:///tmp/from-endpoint.sock")
    config = parse(["--bind", "ipc:///tmp/flag.sock"], {"ENVD_BIND": "ipc:///tmp/var.sock"})
    assert config.bind == ("ipc:///tmp/flag.sock",)
    assert parse(["--pin-cpus", "0", "--threads", "1"], {"ENVD_PIN_CPUS": "0,1"}).pin_cpus == (0,)


def test_envd_bind_with_several_endpoints():
    environ = {"ENVD_BIND": "ipc:///tmp/a.sock,tcp://127.0.0.1:5555  ipc:///tmp/b.sock, "}
    assert parse([], environ).bind == ("ipc:///tmp/a.sock", "tcp://127.0.0.1:5555",
                                       "ipc:///tmp/b.sock")


def test_envd_endpoint_is_the_default_bind(monkeypatch):
    monkeypatch.setenv("ENVD_ENDPOINT", "tcp://127.0.0.1:7001")
    assert Config().bind == ("tcp://127.0.0.1:7001",)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args([])).bind == ("tcp://127.0.0.1:7001",)
    # ENVD_BIND, the daemon's own variable, wins over the clients' one
    assert parse([], {"ENVD_BIND": "ipc:///tmp/b.sock"}).bind == ("ipc:///tmp/b.sock",)


def test_envd_endpoint_of_the_environ_argument_is_the_default_bind():
    assert parse([], {"ENVD_ENDPOINT": "tcp://127.0.0.1:7002"}).bind == ("tcp://127.0.0.1:7002",)


def test_metrics_flags_and_variables():
    assert parse(["--metrics-port", "9187"], {}).metrics_port == 9187
    config = parse([], {"ENVD_METRICS_PORT": "9188", "ENVD_METRICS_BIND": "::1"})
    assert (config.metrics_port, config.metrics_bind) == (9188, "::1")
    assert parse(["--metrics-port", "9187"], {"ENVD_METRICS_PORT": "9188"}).metrics_port == 9187
    assert parse([], {"ENVD_METRICS_PORT": ""}).metrics_port is None  # empty: unset, off
    assert Config(metrics_port=65535).metrics_port == 65535


def test_empty_variables_count_as_unset():
    environ = {"ENVD_THREADS": "", "ENVD_BIND": "", "ENVD_LOG_LEVEL": ""}
    assert parse([], environ) == Config(bind=(default_endpoint(environ),))


@pytest.mark.parametrize("argv, environ, words", [
    (["--threads", "-1"], {}, ["--threads", "-1"]),
    (["--threads", str(cfg.MAX_THREADS + 1)], {}, ["threads"]),
    ([], {"ENVD_THREADS": "-1"}, ["--threads", "-1"]),
    (["--lease-timeout", "0"], {}, ["--lease-timeout", "ENVD_LEASE_TIMEOUT"]),
    (["--lease-timeout", "1e9"], {}, ["--lease-timeout", "ENVD_LEASE_TIMEOUT"]),
    ([], {"ENVD_LEASE_TIMEOUT": "nan"}, ["--lease-timeout", "ENVD_LEASE_TIMEOUT"]),
    (["--log-level", "loud"], {}, ["--log-level", "'loud'"]),
    ([], {"ENVD_LOG_LEVEL": "loud"}, ["--log-level", "'loud'"]),
    (["--log-format", "xml"], {}, ["--log-format", "ENVD_LOG_FORMAT", "'xml'"]),
    (["--bind", "/tmp/envd.sock"], {}, ["/tmp/envd.sock", "ipc://", "tcp://"]),
    ([], {"ENVD_BIND": "ipc:///tmp/a.sock udp://x:1"}, ["udp://x:1", "ipc://"]),
    (["--threads", "2", "--pin-cpus", "0"], {}, ["--pin-cpus", "2"]),
    (["--threads", "1", "--pin-cpus", "0,1"], {}, ["--pin-cpus"]),
    ([], {"ENVD_THREADS": "1", "ENVD_PIN_CPUS": "0,1"}, ["--pin-cpus"]),
    (["--max-sessions", "0"], {}, ["--max-sessions", "ENVD_MAX_SESSIONS"]),
    (["--max-envs-per-client", "-5"], {}, ["--max-envs-per-client"]),
    (["--max-message-bytes", "0"], {}, ["--max-message-bytes"]),
    (["--max-sessions-per-client", "0"], {},
     ["--max-sessions-per-client", "ENVD_MAX_SESSIONS_PER_CLIENT", ">= 1", "0"]),
    ([], {"ENVD_MAX_SESSIONS_PER_CLIENT": "-2"}, ["--max-sessions-per-client", "-2"]),
    (["--max-shm-bytes", "0"], {}, ["--max-shm-bytes", "ENVD_MAX_SHM_BYTES", ">= 1"]),
    ([], {"ENVD_MAX_SHM_BYTES": "-1"}, ["--max-shm-bytes", "-1"]),
    ([], {"ENVD_MAX_SHM_BYTES": "8G"}, ["ENVD_MAX_SHM_BYTES", "'8G'", "--max-shm-bytes"]),
    (["--max-requests-per-second", "-1"], {},
     ["--max-requests-per-second", "ENVD_MAX_REQUESTS_PER_SECOND", ">= 0", "-1"]),
    ([], {"ENVD_MAX_REQUESTS_PER_SECOND": "fast"},
     ["ENVD_MAX_REQUESTS_PER_SECOND", "'fast'", "--max-requests-per-second"]),
    ([], {"ENVD_MAX_REQUESTS_PER_SECOND": "2.5"},
     ["ENVD_MAX_REQUESTS_PER_SECOND", "--max-requests-per-second"]),
    ([], {"ENVD_THREADS": "four"}, ["ENVD_THREADS", "'four'", "--threads"]),
    ([], {"ENVD_THREADS": "1.5"}, ["ENVD_THREADS", "--threads"]),
    ([], {"ENVD_LEASE_TIMEOUT": "soon"}, ["ENVD_LEASE_TIMEOUT", "--lease-timeout"]),
    ([], {"ENVD_MAX_SESSIONS": "many"}, ["ENVD_MAX_SESSIONS", "--max-sessions"]),
    ([], {"ENVD_PIN_CPUS": "a,b"}, ["ENVD_PIN_CPUS", "--pin-cpus"]),
    (["--metrics-port", "-1"], {}, ["--metrics-port", "ENVD_METRICS_PORT", "-1"]),
    (["--metrics-port", "65536"], {}, ["--metrics-port", "65535", "65536"]),
    ([], {"ENVD_METRICS_PORT": "http"}, ["ENVD_METRICS_PORT", "'http'", "--metrics-port"]),
    (["--metrics-bind", " "], {}, ["--metrics-bind", "ENVD_METRICS_BIND"]),
], ids=lambda v: repr(v)[:40] if not isinstance(v, list) or v else "-")
def test_invalid_values_raise_a_value_error_naming_the_setting(argv, environ, words):
    with pytest.raises(ValueError) as info:
        parse(argv, environ)
    message = str(info.value)
    for word in words:
        assert word in message, message


def test_the_constructor_validates_too():
    with pytest.raises(ValueError, match="endpoint"):
        Config(bind=())
    with pytest.raises(ValueError, match="threads"):
        Config(threads=cfg.MAX_THREADS + 1)
    assert Config(threads=cfg.MAX_THREADS).threads == cfg.MAX_THREADS
    assert Config(lease_timeout=0.1).lease_timeout == 0.1
    assert Config(lease_timeout=86400).lease_timeout == 86400


def test_the_request_burst_follows_the_rate():
    assert Config(max_requests_per_second=0).request_burst == 0  # unlimited
    assert Config(max_requests_per_second=1).request_burst == 100
    assert Config(max_requests_per_second=20).request_burst == 100
    assert Config(max_requests_per_second=100).request_burst == 100
    assert Config(max_requests_per_second=5000).request_burst == 5000


def test_the_shm_default_falls_back_when_dev_shm_cannot_be_measured(monkeypatch):
    def fail(path):
        raise FileNotFoundError(path)
    monkeypatch.setattr(cfg.os, "statvfs", fail)
    assert Config().max_shm_bytes == cfg.FALLBACK_SHM_BYTES == 8 << 30
    assert parse([]).max_shm_bytes == 8 << 30
    assert parse(["--max-shm-bytes", "4096"]).max_shm_bytes == 4096


@pytest.mark.parametrize("argv", [["--threads", "x"], ["--lease-timeout", "soon"],
                                  ["--max-sessions", "1.5"], ["--pin-cpus", "a"],
                                  ["--max-shm-bytes", "1G"],
                                  ["--max-requests-per-second", "1e3"],
                                  ["--max-sessions-per-client", "some"]])
def test_argparse_rejects_values_of_the_wrong_type(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_help_names_every_variable_and_default():
    parser = argparse.ArgumentParser(prog="envd")
    add_arguments(parser)
    text = parser.format_help()
    for flag in ("--bind", "--threads", "--log-level", "--lease-timeout", "--max-sessions",
                 "--max-envs-per-client", "--max-message-bytes", "--pin-cpus",
                 "--max-sessions-per-client", "--max-shm-bytes", "--max-requests-per-second",
                 "--metrics-port", "--metrics-bind"):
        assert flag in text
    for variable in ("ENVD_BIND", "ENVD_THREADS", "ENVD_LOG_LEVEL", "ENVD_LEASE_TIMEOUT",
                     "ENVD_MAX_SESSIONS", "ENVD_MAX_ENVS_PER_CLIENT",
                     "ENVD_MAX_MESSAGE_BYTES", "ENVD_PIN_CPUS", "ENVD_MAX_SESSIONS_PER_CLIENT",
                     "ENVD_MAX_SHM_BYTES", "ENVD_MAX_REQUESTS_PER_SECOND",
                     "ENVD_METRICS_PORT", "ENVD_METRICS_BIND"):
        assert variable in " ".join(text.split())


def _run_cli(tmp_path, *argv, environ=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}
    # if validation ever let these through, the daemon would bind here (and be killed)
    env["ENVD_BIND"] = f"ipc://{tmp_path}/cli.sock"
    env.update(environ or {})
    return subprocess.run([sys.executable, "-m", "envd", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, environ, words", [
    (["--threads", "-1"], {}, ["--threads (ENVD_THREADS) must be in", "-1"]),
    ([], {"ENVD_THREADS": "lots"}, ["ENVD_THREADS", "'lots'"]),
    (["--lease-timeout", "0"], {}, ["--lease-timeout"]),
    (["--bind", "localhost:5555"], {}, ["localhost:5555", "ipc://"]),
    (["--max-requests-per-second", "-5"], {}, ["--max-requests-per-second", ">= 0", "-5"]),
    ([], {"ENVD_MAX_SHM_BYTES": "0"}, ["--max-shm-bytes (ENVD_MAX_SHM_BYTES) must be >= 1"]),
    (["--metrics-port", "70000"], {}, ["--metrics-port (ENVD_METRICS_PORT) must be in"]),
])
def test_the_command_line_exits_2_with_a_usage_message(tmp_path, argv, environ, words):
    done = _run_cli(tmp_path, *argv, environ=environ)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("usage: envd"), done.stderr
    assert "envd: error:" in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "cli.sock").exists()


def test_log_level_checked_without_python_3_11s_level_mapping(monkeypatch):
    """requires-python is >= 3.10 and the wheel is tagged cp310-abi3: the level
    check must not need logging.getLevelNamesMapping (new in 3.11).  Found by
    tests/packaging/wheel_smoke.sh on Python 3.10."""
    import logging
    monkeypatch.delattr(logging, "getLevelNamesMapping", raising=False)
    for level in ("debug", "INFO", "Warning", "error", "critical"):
        assert Config(log_level=level).log_level == level
    for bad in ("loud", "5", "", "Level 5"):
        with pytest.raises(ValueError, match="unknown level"):
            Config(log_level=bad)


def test_python_env_import_and_max_workers_flags_and_variables():
    assert parse([]).python_envs == () and parse([]).imports == ()
    assert parse([], {"ENVD_PYTHON_ENVS": "CartPole-v1, Acrobot-v1,"}).python_envs == (
        "CartPole-v1", "Acrobot-v1")
    assert parse(["--python-env", "Pendulum-v1", "--python-env", "x:Y-v0"],
                 {"ENVD_PYTHON_ENVS": "CartPole-v1"}).python_envs == ("Pendulum-v1", "x:Y-v0")
    assert parse([], {"ENVD_IMPORTS": "my_envs,other"}).imports == ("my_envs", "other")
    assert parse(["--import", "a.b"], {"ENVD_IMPORTS": "c"}).imports == ("a.b",)
    assert parse(["--max-workers", "3"]).max_workers == 3
    assert parse([], {"ENVD_MAX_WORKERS": "5"}).max_workers == 5
    with pytest.raises(ValueError, match="--max-workers"):
        parse(["--max-workers", "0"])
