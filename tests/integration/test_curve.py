"""CURVE authentication of tcp endpoints: `envd keygen`, the daemon's
--curve-secret-key / --curve-allowed-clients / --insecure, and the client's
server_key / client_key with fast, clear AuthenticationErrors."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth
from support.daemon import DEADLINE, wait_until

import envd

#: The client timeout of the rejection tests.  A rejection must come at once:
#: before this timeout, the one bound that tells an answer from a wait for
#: the timeout whatever the machine's speed (generous, for a loaded machine).
CLIENT_TIMEOUT = DEADLINE


def free_port(host: str = "127.0.0.1") -> int:
    """A tcp port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def non_loopback_address() -> str | None:
    """An IPv4 address of this host that is not loopback, or None."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            address = fields[fields.index("inet") + 1].split("/")[0]
            if not address.startswith("127."):
                return address
    return None


def keygen(out: Path, name: str) -> tuple[Path, Path]:
    # cwd: not the checkout, whose envd/ folder would shadow the installed package
    done = subprocess.run([sys.executable, "-m", "envd", "keygen", "--out", str(out),
                           "--name", name], capture_output=True, text=True, timeout=120,
                          cwd=out.parent)
    assert done.returncode == 0, done.stderr
    return out / f"{name}.key", out / f"{name}.key_secret"


def run_cli(cwd: Path, *argv: str, environ: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}
    env.update(environ or {})
    return subprocess.run([sys.executable, "-m", "envd", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def keys(tmp_path):
    """A daemon pair, an allowed client pair (its .key in the allowed dir) and
    a stranger pair whose key the daemon does not know."""
    daemon_public, daemon_secret = keygen(tmp_path / "daemon", "server")
    allowed = tmp_path / "allowed"
    client_public, client_secret = keygen(tmp_path / "client", "trainer")
    allowed.mkdir()
    (allowed / "trainer.key").write_bytes(client_public.read_bytes())
    stranger_public, stranger_secret = keygen(tmp_path / "stranger", "stranger")

    class Keys:
        server = daemon_public
        server_secret = daemon_secret
        allowed_dir = allowed
        client = client_secret
        stranger = stranger_secret
        flags = ("--curve-secret-key", str(daemon_secret),
                 "--curve-allowed-clients", str(allowed))
    return Keys


@pytest.fixture
def curve_daemon(harness, keys):
    """A CURVE daemon serving its ipc endpoint (harness) and a loopback tcp one."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "10", "--bind", endpoint,
                            *keys.flags)
    daemon.tcp = endpoint
    return daemon


def step_a_cartpole(client: envd.Client) -> None:
    with client.make("CartPole-v1", 4, seed=3) as env:
        with envd.make("CartPole-v1", 4, seed=3) as twin:
            assert env.reset()[0].tobytes() == twin.reset()[0].tobytes()
            actions = np.array([0, 1, 1, 0])
            for got, want in zip(env.step(actions)[:4], twin.step(actions)[:4]):
                assert got.tobytes() == want.tobytes()


def rejected(endpoint: str, **keys) -> envd.AuthenticationError:
    """The AuthenticationError a connect raises, which must come fast."""
    started = time.monotonic()
    with pytest.raises(envd.AuthenticationError) as info:
        envd.connect(endpoint, timeout=CLIENT_TIMEOUT, **keys).close()
    assert time.monotonic() - started < CLIENT_TIMEOUT, "the rejection waited for the timeout"
    assert isinstance(info.value, envd.EnvdError)
    return info.value


# ---- keygen ------------------------------------------------------------------------------

def test_keygen_writes_a_private_pair_that_pyzmq_loads(tmp_path):
    out = tmp_path / "new" / "keys"
    done = run_cli(tmp_path, "keygen", "--out", str(out), "--name", "trainer")
    assert done.returncode == 0, done.stderr
    public, secret = out / "trainer.key", out / "trainer.key_secret"
    for path in (public, secret):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert str(path) in done.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for words in ("--curve-secret-key", "--curve-allowed-clients", "server_key", "client_key"):
        assert words in done.stdout
    public_key, no_secret = zmq.auth.load_certificate(public)
    pair_public, pair_secret = zmq.auth.load_certificate(secret)
    assert no_secret is None and public_key == pair_public and len(public_key) == 40
    assert zmq.curve_public(pair_secret) == public_key
    assert zmq.auth.load_certificates(out) == {public_key: True}

    # never overwrites: the same name again fails, naming the file, and changes nothing
    before = secret.read_bytes()
    again = run_cli(tmp_path, "keygen", "--out", str(out), "--name", "trainer")
    assert again.returncode == 1
    assert "already exists" in again.stderr and "trainer.key" in again.stderr
    assert "Traceback" not in again.stderr
    assert secret.read_bytes() == before

    # the defaults: ./envd.key and ./envd.key_secret
    default = run_cli(out, "keygen")
    assert default.returncode == 0, default.stderr
    assert (out / "envd.key").exists() and (out / "envd.key_secret").exists()


def test_keygen_refuses_a_pair_half_of_which_exists(tmp_path):
    (tmp_path / "x.key_secret").write_text("old")
    done = run_cli(tmp_path, "keygen", "--name", "x")
    assert done.returncode == 1 and "x.key_secret already exists" in done.stderr
    assert not (tmp_path / "x.key").exists()  # nothing written


# ---- a CURVE daemon ----------------------------------------------------------------------

def test_a_client_with_an_allowed_key_steps_envs(harness, keys, curve_daemon):
    with envd.connect(curve_daemon.tcp, timeout=CLIENT_TIMEOUT, server_key=str(keys.server),
                      client_key=str(keys.client)) as client:
        status = client.status()
        assert status["curve"] is True
        assert curve_daemon.tcp in status["endpoints"]
        step_a_cartpole(client)
    # the server key as its Z85 text, and both keys from the environment
    text = zmq.auth.load_certificate(keys.server)[0]
    for server_key in (text, text.decode()):
        with envd.connect(curve_daemon.tcp, server_key=server_key,
                          client_key=keys.client) as client:
            step_a_cartpole(client)
    environ = {"ENVD_SERVER_KEY": str(keys.server), "ENVD_CLIENT_KEY": str(keys.client)}
    done = run_cli(harness.tmp_path, "status", "--endpoint", curve_daemon.tcp, "--json",
                   environ=environ)
    assert done.returncode == 0, done.stderr
    done = run_cli(harness.tmp_path, "status", "--endpoint", curve_daemon.tcp,
                   "--server-key", str(keys.server), "--client-key", str(keys.client))
    assert done.returncode == 0 and "tcp: CURVE" in done.stdout, done.stderr


def test_heartbeats_keep_a_curve_clients_lease(harness, keys):
    """The heartbeat thread's socket authenticates too, and the daemon routes
    its heartbeats to the client they name: an idle client keeps its envs
    well past the lease timeout."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    # A 3 s lease: heartbeats every second, so only a heartbeat 2 s late
    # (not a loaded machine's scheduling delay) could lose the session.
    lease = 3.0
    harness.daemon("--threads", "1", "--lease-timeout", str(lease), "--bind", endpoint,
                   *keys.flags)
    with envd.connect(endpoint, server_key=keys.server, client_key=keys.client) as client:
        env = client.make("CartPole-v1", 2, seed=0)
        env.reset()
        time.sleep(2.5 * lease)  # two and a half leases without a request: only heartbeats
        env.step(np.array([0, 1]))  # SessionExpiredError if the heartbeats went nowhere
        assert client.status()["sessions"] == 1
        env.close()


@pytest.mark.parametrize("case", ["no keys", "wrong server key", "key not allowed"])
def test_rejections_are_fast_and_clear_and_the_daemon_keeps_serving(harness, keys,
                                                                    curve_daemon, case):
    good = envd.connect(curve_daemon.tcp, server_key=keys.server, client_key=keys.client)
    harness.clients.append(good)
    env = good.make("CartPole-v1", 4, seed=1)
    env.reset()
    arguments = {"no keys": {},
                 "wrong server key": {"server_key": keys.stranger.with_suffix(".key"),
                                      "client_key": keys.client},
                 "key not allowed": {"server_key": keys.server,
                                     "client_key": keys.stranger}}[case]
    error = rejected(curve_daemon.tcp, **arguments)
    message = str(error)
    assert curve_daemon.tcp in message
    if case == "no keys":
        assert "requires CURVE" in message and "server_key" in message
        assert "client_key" in message and "envd keygen" in message
    elif case == "wrong server key":
        assert "server_key" in message and "public key" in message
    else:
        stranger_public = zmq.auth.load_certificate(keys.stranger)[0].decode()
        assert stranger_public in message and "--curve-allowed-clients" in message
    # the daemon still serves the good client, and was not disturbed
    env.step(np.array([1, 0, 1, 0]))
    assert good.status()["sessions"] == 1
    assert curve_daemon.proc.poll() is None
    env.close()


def test_the_ipc_endpoint_of_a_curve_daemon_needs_no_keys(harness, keys, curve_daemon):
    with envd.connect(curve_daemon.endpoint, timeout=CLIENT_TIMEOUT) as client:
        step_a_cartpole(client)
        assert client.status()["curve"] is True
    # keys given for an ipc endpoint are ignored (even ones that do not exist)
    with envd.connect(curve_daemon.endpoint, server_key="/nonexistent.key",
                      client_key="/nonexistent.key_secret") as client:
        step_a_cartpole(client)
    # the health check: `envd status` over ipc without keys
    done = run_cli(harness.tmp_path, "status", "--endpoint", curve_daemon.endpoint)
    assert done.returncode == 0, done.stderr


def test_a_curve_client_of_a_plain_daemon_is_told_so(harness, keys):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = harness.daemon("--threads", "1", "--bind", endpoint)
    error = rejected(endpoint, server_key=keys.server, client_key=keys.client)
    assert "does not use CURVE" in str(error)
    with envd.connect(endpoint) as client:  # a plain client still gets in
        assert client.status()["curve"] is False
    assert daemon.proc.poll() is None


def test_a_client_needs_both_keys_and_readable_ones(keys, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"  # nothing listens: checked before connecting
    cases = [({"server_key": keys.server}, ["client_key", "both"]),
             ({"client_key": keys.client}, ["server_key", "both"]),
             ({"server_key": tmp_path / "missing.key", "client_key": keys.client},
              ["missing.key"]),
             ({"server_key": keys.server, "client_key": keys.server},  # the public half
              [".key_secret"])]
    for arguments, words in cases:
        with pytest.raises(envd.InvalidArgumentError) as info:
            envd.connect(endpoint, timeout=5, **arguments)
        for word in words:
            assert word in str(info.value), (arguments, str(info.value))
    readable = tmp_path / "readable.key_secret"
    readable.write_bytes(keys.client.read_bytes())
    readable.chmod(0o644)
    with pytest.raises(envd.InvalidArgumentError, match="chmod 600"):
        envd.connect(endpoint, timeout=5, server_key=keys.server, client_key=readable)


def test_a_routing_id_in_use_on_ipc_is_refused_on_tcp(harness, keys, curve_daemon):
    """Routing ids are unique per socket only: a CURVE client that sends an
    ipc client's routing id does not reach that client's sessions."""
    victim = harness.connect(curve_daemon)
    env = victim.make("CartPole-v1", 2, seed=0)
    env.reset()
    context = zmq.Context()
    spoof = context.socket(zmq.DEALER)
    try:
        spoof.setsockopt(zmq.LINGER, 0)
        spoof.setsockopt(zmq.ROUTING_ID, victim.client_id)
        spoof.curve_serverkey = zmq.auth.load_certificate(keys.server)[0]
        spoof.curve_publickey, spoof.curve_secretkey = zmq.auth.load_certificate(keys.client)
        spoof.connect(curve_daemon.tcp)
        spoof.send(msgpack.packb({"type": "status", "id": 1}))
        wait_until(lambda: "in use on the plain socket" in curve_daemon.log(),
                   what="the daemon to drop the spoofed message")
        assert not spoof.poll(0)  # no reply to the spoofer
        assert victim.status()["sessions"] == 1
        env.step(np.array([0, 1]))
    finally:
        spoof.close(linger=0)
        context.term()


# ---- startup rules ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def address():
    found = non_loopback_address()
    if found is None:
        pytest.skip("this host has no non-loopback IPv4 address to bind (ip -4 -o addr)")
    return found


def test_a_network_endpoint_without_keys_refuses_to_start(tmp_path, address):
    endpoint = f"tcp://{address}:{free_port(address)}"
    for argv in (["--bind", endpoint], ["--bind", f"tcp://*:{free_port()}"]):
        done = run_cli(tmp_path, "--threads", "1", *argv, timeout=DEADLINE)
        assert done.returncode != 0, done.stderr
        for word in ("--insecure", "--curve-secret-key", argv[1]):
            assert word in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_insecure_serves_a_network_endpoint_with_a_warning(harness, address):
    endpoint = f"tcp://{address}:{free_port(address)}"
    daemon = harness.daemon("--threads", "1", "--bind", endpoint, "--insecure")
    with envd.connect(endpoint, timeout=CLIENT_TIMEOUT) as client:
        step_a_cartpole(client)
        assert client.status()["curve"] is False
    assert "--insecure" in daemon.log() and endpoint in daemon.log()
    # the variable does the same
    endpoint = f"tcp://{address}:{free_port(address)}"
    harness.daemon("--threads", "1", "--bind", endpoint, env={"ENVD_INSECURE": "1"})


def test_a_curve_daemon_serves_a_network_endpoint(harness, keys, address):
    endpoint = f"tcp://{address}:{free_port(address)}"
    harness.daemon("--threads", "1", "--bind", endpoint, *keys.flags)
    with envd.connect(endpoint, server_key=keys.server, client_key=keys.client) as client:
        step_a_cartpole(client)
    rejected(endpoint)


def test_a_secret_key_readable_by_others_is_refused(tmp_path, keys):
    keys.server_secret.chmod(0o644)
    done = run_cli(tmp_path, "--threads", "1", "--bind", f"tcp://127.0.0.1:{free_port()}",
                   *keys.flags, timeout=DEADLINE)
    assert done.returncode != 0
    assert "--curve-secret-key" in done.stderr and "0644" in done.stderr
    assert f"chmod 600 {keys.server_secret}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flags, words", [
    (lambda k: ["--curve-secret-key", str(k.server_secret)], ["--curve-allowed-clients"]),
    (lambda k: ["--curve-allowed-clients", str(k.allowed_dir)], ["--curve-secret-key"]),
    (lambda k: ["--curve-secret-key", str(k.server), "--curve-allowed-clients",
                str(k.allowed_dir)], ["no secret-key", ".key_secret"]),
    (lambda k: ["--curve-secret-key", str(k.server_secret), "--curve-allowed-clients",
                str(k.server_secret.parent / "none")], ["--curve-allowed-clients", "none"]),
], ids=["secret without allowed", "allowed without secret", "public file as secret",
        "missing allowed dir"])
def test_bad_curve_flags_refuse_to_start(tmp_path, keys, flags, words):
    done = run_cli(tmp_path, "--threads", "1", "--bind", f"tcp://127.0.0.1:{free_port()}",
                   *flags(keys), timeout=DEADLINE)
    assert done.returncode != 0
    for word in words:
        assert word in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
