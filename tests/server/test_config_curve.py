"""The CURVE settings of the daemon's Config (--curve-secret-key,
--curve-allowed-clients, --insecure) and the key files of envd.keys."""
from __future__ import annotations

import argparse
import os
import socket
import stat
import subprocess
import sys

import pytest
import zmq
import zmq.auth

from envd import keys
from envd.server import config as cfg
from envd.server.config import Config, add_arguments, from_args, is_loopback_host, tcp_host


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


@pytest.fixture
def pair(tmp_path):
    """(daemon .key_secret, allowed dir holding one client's .key)."""
    _, secret = keys.generate(tmp_path / "daemon", "server")
    client_public, _ = keys.generate(tmp_path / "client", "trainer")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "trainer.key").write_bytes(client_public.read_bytes())
    return str(secret), str(allowed)


# ---- endpoints -------------------------------------------------------------------------

@pytest.mark.parametrize("endpoint, host", [
    ("tcp://127.0.0.1:5555", "127.0.0.1"), ("tcp://*:5555", "*"), ("tcp://[::1]:7", "::1"),
    ("tcp://localhost:1", "localhost"), ("tcp://eth0:1", "eth0"), ("ipc:///tmp/a", None)])
def test_tcp_host(endpoint, host):
    assert tcp_host(endpoint) == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost", "lo"])
def test_loopback_hosts(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["*", "0.0.0.0", "::", "192.0.2.7", "10.0.0.1", "", "eth0",
                                  "no-such-host.invalid"])
def test_hosts_reachable_from_the_network(host):
    assert not is_loopback_host(host)


def test_host_names_count_by_every_address(monkeypatch):
    answers = {"inside": ["127.0.0.1", "::1"], "outside": ["127.0.0.1", "192.0.2.9"]}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            raise socket.gaierror("unknown")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in answers[host]]
    monkeypatch.setattr(cfg.socket, "getaddrinfo", getaddrinfo)
    assert is_loopback_host("inside")
    assert not is_loopback_host("outside")
    assert not is_loopback_host("unknown")


# ---- the rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("bind", ["tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://192.0.2.1:5555",
                                  "tcp://[::]:5555", "tcp://no-such-host.invalid:5555"])
def test_a_network_endpoint_needs_keys_or_insecure(bind):
    with pytest.raises(ValueError) as info:
        Config(bind=(bind,))
    message = str(info.value)
    for word in (bind, "--insecure", "ENVD_INSECURE", "--curve-secret-key",
                 "--curve-allowed-clients", "envd keygen"):
        assert word in message, message
    with pytest.raises(ValueError, match="--insecure"):  # next to an ipc endpoint too
        parse(["--bind", "ipc:///tmp/a.sock", "--bind", bind])
    config = Config(bind=(bind,), insecure=True)
    assert config.insecure_endpoints() == [bind]
    assert parse(["--bind", bind, "--insecure"]).insecure is True


@pytest.mark.parametrize("bind", ["tcp://127.0.0.1:5555", "tcp://[::1]:5555",
                                  "tcp://localhost:5555", "ipc:///tmp/a.sock"])
def test_loopback_and_ipc_endpoints_need_no_keys(bind):
    config = Config(bind=(bind,))
    assert not config.curve and config.insecure_endpoints() == []


def test_keys_admit_a_network_endpoint(pair):
    secret, allowed = pair
    config = parse(["--bind", "tcp://0.0.0.0:5555", "--curve-secret-key", secret,
                    "--curve-allowed-clients", allowed])
    assert config.curve and config.insecure_endpoints() == []
    assert (config.curve_secret_key, config.curve_allowed_clients) == (secret, allowed)
    public, key = zmq.auth.load_certificate(secret)
    assert config.curve_keys() == keys.KeyPair(public, key)
    assert len(config.allowed_client_keys()) == 1


def test_the_variables(pair):
    secret, allowed = pair
    config = parse([], {"ENVD_BIND": "tcp://0.0.0.0:1", "ENVD_CURVE_SECRET_KEY": secret,
                        "ENVD_CURVE_ALLOWED_CLIENTS": allowed})
    assert config.curve
    for text in ("1", "true", "TRUE", "yes", "on"):
        assert parse([], {"ENVD_BIND": "tcp://0.0.0.0:1", "ENVD_INSECURE": text}).insecure
    for text in ("", "0", "false", "no", "off"):
        assert parse([], {"ENVD_INSECURE": text}).insecure is False
    with pytest.raises(ValueError, match="ENVD_INSECURE"):
        parse([], {"ENVD_INSECURE": "maybe"})
    # the flag wins over the variable, and Config's default is secure
    assert parse(["--insecure"], {"ENVD_INSECURE": "0"}).insecure is True
    assert Config().insecure is False and parse([]).insecure is False


@pytest.mark.parametrize("given, missing", [("--curve-secret-key", "--curve-allowed-clients"),
                                            ("--curve-allowed-clients", "--curve-secret-key")])
def test_the_curve_flags_come_as_a_pair(pair, given, missing):
    value = pair[0] if given == "--curve-secret-key" else pair[1]
    with pytest.raises(ValueError) as info:
        parse(["--bind", "tcp://127.0.0.1:1", given, value])
    message = str(info.value)
    assert message.startswith(given) and missing in message
    assert "ENVD_" + missing[2:].replace("-", "_").upper() in message


def test_a_secret_key_others_can_read_is_refused(pair):
    secret, allowed = pair
    os.chmod(secret, 0o644)
    with pytest.raises(ValueError) as info:
        Config(curve_secret_key=secret, curve_allowed_clients=allowed)
    message = str(info.value)
    assert "--curve-secret-key" in message and "0644" in message
    assert f"chmod 600 {secret}" in message
    os.chmod(secret, 0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        Config(curve_secret_key=secret, curve_allowed_clients=allowed)
    os.chmod(secret, 0o400)  # read-only for its owner is fine
    assert Config(curve_secret_key=secret, curve_allowed_clients=allowed).curve


def test_unusable_key_files_are_refused_with_a_clear_message(pair, tmp_path):
    secret, allowed = pair
    garbage = tmp_path / "garbage.key_secret"
    garbage.write_bytes(b"\x00\xffnot a certificate\n")
    garbage.chmod(0o600)
    bad_text = tmp_path / "bad.key_secret"
    bad_text.write_text('curve\n    public-key = "short"\n    secret-key = "short"\n')
    bad_text.chmod(0o600)
    mismatched = tmp_path / "mismatched.key_secret"
    other_public, other_secret = zmq.curve_keypair()
    public = zmq.auth.load_certificate(secret)[0]
    mismatched.write_text(f'curve\n    public-key = "{public.decode()}"\n'
                          f'    secret-key = "{other_secret.decode()}"\n')
    mismatched.chmod(0o600)
    cases = [(tmp_path / "missing.key_secret", allowed, ["--curve-secret-key", "missing"]),
             (secret.replace(".key_secret", ".key"), allowed, ["no secret-key", ".key_secret"]),
             (garbage, allowed, ["not a CURVE certificate", "garbage"]),
             (bad_text, allowed, ["40-character"]),
             (mismatched, allowed, ["does not belong"]),
             (tmp_path / "daemon", allowed, ["is not a file"]),
             (secret, tmp_path / "nowhere", ["--curve-allowed-clients", "not a directory"]),
             (secret, tmp_path / "daemon", None)]  # holds server.key: fine
    for secret_file, allowed_dir, words in cases:
        if words is None:
            assert Config(curve_secret_key=str(secret_file),
                          curve_allowed_clients=str(allowed_dir)).curve
            continue
        with pytest.raises(ValueError) as info:
            Config(curve_secret_key=str(secret_file), curve_allowed_clients=str(allowed_dir))
        for word in words:
            assert word in str(info.value), (secret_file, str(info.value))


def test_an_allowed_dir_without_keys_or_with_a_bad_key_is_refused(pair, tmp_path):
    secret, _ = pair
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("no keys here")
    with pytest.raises(ValueError) as info:
        Config(curve_secret_key=secret, curve_allowed_clients=str(empty))
    assert "holds no *.key file" in str(info.value) and str(empty) in str(info.value)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.key").write_text("nonsense\n")
    with pytest.raises(ValueError, match="x.key"):
        Config(curve_secret_key=secret, curve_allowed_clients=str(broken))


def test_help_names_the_curve_flags():
    parser = argparse.ArgumentParser(prog="envd")
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for word in ("--curve-secret-key", "ENVD_CURVE_SECRET_KEY", "--curve-allowed-clients",
                 "ENVD_CURVE_ALLOWED_CLIENTS", "--insecure", "ENVD_INSECURE"):
        assert word in text


# ---- envd.keys ---------------------------------------------------------------------------

def test_generate_writes_private_files_and_never_overwrites(tmp_path):
    public, secret = keys.generate(tmp_path / "k", "a")
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    for path in (public, secret):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pub, sec = zmq.auth.load_certificate(secret)
    assert zmq.auth.load_certificate(public) == (pub, None)
    assert keys.load_key_pair(secret, "x") == keys.KeyPair(pub, sec)
    assert keys.load_public_key(public, "x") == pub
    assert keys.load_public_key(pub.decode(), "x") == pub  # the Z85 text
    with pytest.raises(keys.KeyFileError, match="already exists"):
        keys.generate(tmp_path / "k", "a")
    for name in ("", "a/b", "..", "."):
        with pytest.raises(keys.KeyFileError, match="--name"):
            keys.generate(tmp_path, name)


def test_generate_ignores_the_umask_and_a_planted_link(tmp_path):
    old = os.umask(0)
    try:
        public, secret = keys.generate(tmp_path, "u")
    finally:
        os.umask(old)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    (tmp_path / "elsewhere").write_text("x")
    os.symlink(tmp_path / "elsewhere", tmp_path / "l.key_secret")
    with pytest.raises(keys.KeyFileError, match="already exists"):
        keys.generate(tmp_path, "l")
    assert (tmp_path / "elsewhere").read_text() == "x"
    assert not (tmp_path / "l.key").exists()


def test_is_z85_key():
    public, secret = zmq.curve_keypair()
    assert keys.is_z85_key(public) and keys.is_z85_key(secret.decode())
    for text in ("", "x" * 39, "x" * 41, " " * 40, "#" * 40, b"\xff" * 40, None, 7):
        assert not keys.is_z85_key(text)


def test_a_clients_remote_endpoint_variable_does_not_break_the_command_line(monkeypatch):
    """On a trainer host ENVD_ENDPOINT names a remote daemon: building the
    parser (envd status, envd list, --help) must work; only serving it fails."""
    monkeypatch.setenv("ENVD_ENDPOINT", "tcp://192.0.2.99:5555")
    parser = argparse.ArgumentParser(prog="envd")
    add_arguments(parser)
    assert "192.0.2.99" in parser.format_help()
    with pytest.raises(ValueError, match="--insecure"):
        Config()
    with pytest.raises(ValueError, match="--insecure"):
        from_args(parser.parse_args([]))


def test_envd_list_and_status_work_with_a_remote_endpoint_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}
    env["ENVD_ENDPOINT"] = "tcp://192.0.2.99:5555"  # TEST-NET-1: nothing answers there
    listed = subprocess.run([sys.executable, "-m", "envd", "list"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "CartPole-v1" in listed.stdout, listed.stderr
    status = subprocess.run([sys.executable, "-m", "envd", "status", "--timeout", "0.5"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 1 and "no envd daemon answered" in status.stderr
    assert "Traceback" not in status.stderr
