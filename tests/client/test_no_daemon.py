"""A daemon that never was: envd.NoDaemonError (a ConnectionLostError) names
the endpoint tried and where it came from (an argument, ENVD_ENDPOINT, or the
default and the XDG_RUNTIME_DIR it followed), and points to a daemon
listening at the other default place."""
from __future__ import annotations

import socket

import pytest

import envd
from envd.client import endpoints


def test_an_explicit_endpoint_with_nothing_there(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVD_ENDPOINT", raising=False)
    endpoint = f"ipc://{tmp_path}/envd.sock"
    with pytest.raises(envd.NoDaemonError) as exc:
        envd.connect(endpoint, timeout=2)
    assert isinstance(exc.value, envd.ConnectionLostError) and exc.value.endpoint == endpoint
    assert str(exc.value).startswith(f"no envd daemon at {endpoint}: ")
    assert "does not exist" in str(exc.value)


def test_envd_endpoint_is_named(tmp_path, monkeypatch):
    endpoint = f"ipc://{tmp_path}/envd.sock"
    monkeypatch.setenv("ENVD_ENDPOINT", endpoint)
    with pytest.raises(envd.NoDaemonError, match=r"at ipc://\S+ \(ENVD_ENDPOINT\): "):
        envd.connect(timeout=2)


def test_the_default_says_which_runtime_dir_it_followed(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVD_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(envd.NoDaemonError) as exc:
        envd.connect(timeout=2)
    assert exc.value.endpoint == f"ipc://{tmp_path}/envd.sock"
    assert (f"(the default endpoint: ENVD_ENDPOINT is unset and $XDG_RUNTIME_DIR={tmp_path})"
            in str(exc.value))
    assert endpoints.where_from(exc.value.endpoint, {}) == ""  # not the default without it
    assert "$XDG_RUNTIME_DIR is unset" in endpoints.where_from(
        envd.protocol.default_endpoint({}), {})


def test_a_daemon_at_the_other_default_place_is_named(tmp_path):
    """A unix socket listening where a shell with another XDG_RUNTIME_DIR
    would look is named with the ENVD_ENDPOINT that reaches it; a left-over
    socket file nobody listens on is not."""
    environ = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    default = envd.protocol.default_endpoint(environ)
    other, stale = str(tmp_path / "other.sock"), str(tmp_path / "stale.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(other)
    listener.listen(1)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(stale)  # bound, never listening: a crashed daemon's file
    try:
        hint = endpoints.elsewhere(default, environ, places=[stale, other])
        assert hint.endswith(f"set ENVD_ENDPOINT=ipc://{other} to reach it")
        assert stale not in hint
        assert endpoints.elsewhere(default, environ, places=[stale]) == ""
        assert endpoints.elsewhere(f"ipc://{tmp_path}/mine.sock", environ, places=[other]) == ""
    finally:
        listener.close()
        dead.close()


def test_nothing_answering_on_tcp_is_no_daemon_too():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))  # a port nobody serves
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(envd.NoDaemonError, match=f"no envd daemon answered at tcp://127.0.0.1:{port}"):
        envd.connect(f"tcp://127.0.0.1:{port}", timeout=0.5)
