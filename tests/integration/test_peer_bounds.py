"""What a peer the daemon does not admit can make it hold: nothing.

libzmq keeps a multi-frame message in memory until its last frame arrives,
whatever its total size (--max-message-bytes bounds each frame, and the daemon
checks the sum only once the message is whole; SECURITY.md, "What one peer can
make the daemon hold").  So the bound that holds is on who may send at all:
a peer refused during the handshake (a tcp peer without an admitted CURVE key,
an ipc peer whose uid --ipc-allowed-uids does not list) has every byte it
sends dropped before libzmq decodes a frame.  These tests send such streams
byte by byte, as a hostile peer would (not through libzmq, which would queue
them on the sender's side), and measure the daemon's peak memory.
"""
from __future__ import annotations

import inspect
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.daemon import DEADLINE, Bystander, DaemonProcess, peak_rss, stop_daemon, wait_until
from test_curve import free_port, keygen

import envd

#: What the attacker tries to push in one multi-frame message (the daemon's
#: limit per frame is 8 MiB below, so every frame alone would pass).
FRAME_BYTES = 4 << 20
FRAMES = 64
MAX_MESSAGE_BYTES = 8 << 20
#: How much the daemon's peak RSS may grow while refusing it: far below the
#: 256 MiB pushed, far above what a refused handshake costs (kernel buffers
#: are not in RSS).
GROWTH_BOUND = 48 << 20


def zmtp_null_stream(frames: int, frame_bytes: int):
    """A ZMTP 3.0 peer speaking the NULL mechanism: greeting, READY, then one
    message of `frames` long frames whose last one never comes."""
    greeting = (b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
                + b"\x00" + bytes(31))
    assert len(greeting) == 64
    name, value = b"Socket-Type", b"DEALER"
    ready = b"\x05READY" + bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value
    yield greeting
    yield b"\x04" + bytes([len(ready)]) + ready
    payload = bytes(frame_bytes)
    for _ in range(frames):
        yield b"\x03" + frame_bytes.to_bytes(8, "big")  # MORE | LONG
        yield payload


def push(sock: socket.socket, stream) -> tuple[int, bool]:
    """Send the stream until the daemon stops taking it: (bytes the kernel
    took, whether the daemon hung up).  A refused peer is hung up on; a
    stalled send (the daemon not reading) counts as not hung up."""
    sock.settimeout(10.0)
    sent = 0
    try:
        for chunk in stream:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        return sent, True
    except TimeoutError:
        pass
    # The stream ended or stalled: has the daemon closed the connection?
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        try:
            if sock.recv(65536) == b"":
                return sent, True
        except (ConnectionResetError, BrokenPipeError):
            return sent, True
        except TimeoutError:
            continue
    return sent, False


@pytest.fixture
def open_folder():
    """A socket folder every user may enter (an operator sharing the daemon):
    only --ipc-allowed-uids then keeps other users out."""
    folder = Path(tempfile.mkdtemp(prefix="envd-open-"))
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def other_uid() -> int:
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test needs root and setpriv to act as another user")
    return 65534  # nobody: any uid but the daemon's (root) and root


def as_user(uid: int, code: str, *args: str) -> subprocess.CompletedProcess:
    """python -c code, run as uid from / (never the checkout's envd/ folder)."""
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           sys.executable, "-c", code, *args], cwd="/", capture_output=True,
                          text=True, timeout=DEADLINE * 2, check=False)
    if "No module named" in done.stderr:  # e.g. a virtualenv inside a private folder
        pytest.fail(f"another user cannot import envd from {sys.executable}; .ci/run makes "
                    f"its virtualenv readable: {done.stderr[-300:]}")
    return done


def other_user_attack() -> str:
    """A script that pushes zmtp_null_stream into the socket argv[1] and
    prints (bytes sent, hung up); self-contained, for another user."""
    return "\n".join([
        "import socket, sys, time",
        f"DEADLINE = {DEADLINE!r}",
        inspect.getsource(zmtp_null_stream),
        inspect.getsource(push),
        "sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
        "sock.connect(sys.argv[1])",
        f"sent, hung_up = push(sock, zmtp_null_stream({FRAMES}, {FRAME_BYTES}))",
        "print(sent, hung_up)",
    ])


OTHER_USER_CLIENT = """
import sys, time, envd
start = time.monotonic()
try:
    with envd.connect(sys.argv[1], timeout=30) as client:
        print("connected", client.status()["pid"])
except envd.EnvdError as exc:
    print(type(exc).__name__, round(time.monotonic() - start, 2), exc)
"""


def test_a_uid_the_daemon_does_not_admit_cannot_make_it_hold_anything(open_folder):
    """An ipc socket other users can open (folder and socket mode 0777): a
    process of another uid is refused before libzmq decodes its frames, so a
    256 MiB multi-frame message leaves the daemon's memory as it was; the
    official client gets an AuthenticationError at once that names its uid."""
    uid = other_uid()
    proc = DaemonProcess(open_folder, "--threads", "1",
                         "--max-message-bytes", str(MAX_MESSAGE_BYTES))
    bystander = None
    try:
        os.chmod(open_folder / "envd.sock", 0o777)
        bystander = Bystander(proc)
        before = peak_rss(proc.pid)
        attack = as_user(uid, other_user_attack(), str(open_folder / "envd.sock"))
        assert attack.returncode == 0, attack.stderr
        sent, hung_up = attack.stdout.split()
        assert hung_up == "True", f"the daemon kept the connection of uid {uid}: {attack.stdout}"
        growth = peak_rss(proc.pid) - before
        assert growth < GROWTH_BOUND, (
            f"the daemon's peak RSS grew by {growth >> 20} MiB for a refused peer that sent "
            f"{int(sent) >> 20} MiB")

        client = as_user(uid, OTHER_USER_CLIENT, proc.endpoint)
        assert client.stdout.startswith("AuthenticationError"), client.stdout + client.stderr
        assert float(client.stdout.split()[1]) < 30, client.stdout  # before its 30 s timeout
        assert f"uid {uid}" in client.stdout and "--ipc-allowed-uids" in client.stdout

        wait_until(lambda: f"refused an ipc connection of uid {uid}" in proc.log(),
                   what="the refusal to be logged")
        bystander.check()  # every other client goes on, bit-exact
    finally:
        if bystander is not None:
            bystander.close()
        stop_daemon(proc)


def test_ipc_allowed_uids_admits_the_uids_it_lists(open_folder):
    uid = other_uid()
    proc = DaemonProcess(open_folder, "--threads", "1", "--ipc-allowed-uids", f"self,{uid}")
    try:
        os.chmod(open_folder / "envd.sock", 0o777)
        client = as_user(uid, OTHER_USER_CLIENT, proc.endpoint)
        assert client.stdout.split() == ["connected", str(proc.pid)], client.stdout + client.stderr
    finally:
        stop_daemon(proc)


def test_a_bad_ipc_allowed_uids_stops_startup(tmp_path):
    done = subprocess.run([sys.executable, "-m", "envd", "--bind",
                           f"ipc://{tmp_path}/envd.sock", "--ipc-allowed-uids", "self,bob"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE)
    assert done.returncode != 0
    assert "--ipc-allowed-uids" in done.stderr and "'bob'" in done.stderr, done.stderr


def test_a_tcp_peer_without_an_admitted_key_cannot_make_the_daemon_hold_anything(tmp_path):
    """The same stream over tcp to a CURVE daemon: the mechanism (NULL against
    CURVE) fails the handshake, and the daemon's memory stays as it was while
    an admitted client steps."""
    daemon_public, daemon_secret = keygen(tmp_path / "daemon", "server")
    client_public, client_secret = keygen(tmp_path / "client", "trainer")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "trainer.key").write_bytes(client_public.read_bytes())
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    proc = DaemonProcess(tmp_path / "d", "--threads", "1", "--bind", endpoint,
                         "--max-message-bytes", str(MAX_MESSAGE_BYTES),
                         "--curve-secret-key", str(daemon_secret),
                         "--curve-allowed-clients", str(allowed))
    try:
        with envd.connect(endpoint, server_key=str(daemon_public),
                          client_key=str(client_secret), timeout=30) as client:
            env = client.make("CartPole-v1", 8, seed=3)
            local = envd.make("CartPole-v1", 8, seed=3)
            assert env.reset()[0].tobytes() == local.reset()[0].tobytes()
            before = peak_rss(proc.pid)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as attacker:
                sent, hung_up = push(attacker, zmtp_null_stream(FRAMES, FRAME_BYTES))
            assert hung_up, "the CURVE daemon kept an unauthenticated connection"
            growth = peak_rss(proc.pid) - before
            assert growth < GROWTH_BOUND, (
                f"the daemon's peak RSS grew by {growth >> 20} MiB for a peer without keys "
                f"that sent {sent >> 20} MiB")
            for _ in range(20):
                actions = [i % 2 for i in range(8)]
                for a, b in zip(env.step(actions)[:4], local.step(actions)[:4]):
                    assert a.tobytes() == b.tobytes()
            local.close()
    finally:
        stop_daemon(proc)
