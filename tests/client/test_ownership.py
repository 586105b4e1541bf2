"""The client refuses a default socket folder or a segment another user could
have planted or may write (issue 15, defect 7).

Tests run as root: files are given to another uid with chown.  A segment
owned by root is trusted (root can read everything anyway), one owned by
another user, or writable by group or others, is not; the same for envd's
default socket folder ($XDG_RUNTIME_DIR here).  Explicit endpoints in other
folders are the caller's choice and are not checked.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

import envd
from envd.server.stale_segments import Instance
from envd.shm import Segment, plan

OTHER_UID = 65534


@pytest.fixture
def segment_file():
    """A real segment (as the daemon makes it: mode 0600, this user's), of
    an instance whose lock the test holds: a daemon starting meanwhile on
    this machine sweeps a segment without a live instance (stale_segments.py)."""
    arrays, size = plan({"observations": ((4, 2), "<f4")})
    instance = Instance()
    name = f"{instance.segment_prefix}{secrets.token_hex(16)}"
    session = secrets.token_hex(16)
    Segment.create(name, session, arrays, size)
    path = f"/dev/shm/{name}"
    try:
        yield path, lambda: Segment.attach(name, session, arrays, size, where="the test daemon")
    finally:
        os.unlink(path)
        instance.release()


def test_own_segment_is_mapped(segment_file):
    path, attach = segment_file
    segment = attach()
    assert segment.arrays["observations"].shape == (4, 2)


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_segment_writable_by_others_is_refused(segment_file, mode):
    path, attach = segment_file
    os.chmod(path, mode)
    with pytest.raises(envd.UntrustedSegmentError) as caught:
        attach()
    message = str(caught.value)
    assert f"its mode {mode:#o} lets other users write it" in message
    assert f"ls -l {path}" in message and "the test daemon" in message
    # A SharedMemoryError too: transport="auto" sends the arrays inline instead.
    assert isinstance(caught.value, envd.SharedMemoryError)
    assert isinstance(caught.value, envd.UntrustedPathError)


def test_segment_of_another_user_is_refused(segment_file):
    """The reported attack: another user's daemon served a 0666 segment."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root to give the segment to another user")
    path, attach = segment_file
    os.chown(path, OTHER_UID, OTHER_UID)
    os.chmod(path, 0o600)  # root can open it all the same
    with pytest.raises(envd.UntrustedSegmentError, match=f"belongs to uid {OTHER_UID}"):
        attach()


def test_segment_of_root_is_trusted_by_another_user(segment_file):
    """A client of a daemon run by root maps root's segments (given access)."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root")
    path, _ = segment_file
    os.chmod(path, 0o644)  # readable by the other user, writable by root only
    code = ("import mmap, os, sys\n"
            "from envd.ownership import untrusted_reason\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "print(untrusted_reason(os.fstat(fd), is_dir=False))\n")
    out = subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}",
                          "--clear-groups", sys.executable, "-c", code, path], cwd="/",
                         capture_output=True, text=True, check=False)
    if out.returncode != 0 and "No module named" in out.stderr:
        pytest.skip(f"another user cannot import envd here: {out.stderr[-200:]}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


# ---- the default socket folder --------------------------------------------------------
def connect_default(runtime, monkeypatch) -> Exception:
    monkeypatch.delenv("ENVD_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with pytest.raises(envd.EnvdError) as caught:
        envd.connect(timeout=2)
    return caught.value


@pytest.mark.parametrize("case", ["other-owner", "group-writable", "world-writable", "symlink"])
def test_untrusted_default_folder_is_refused(tmp_path, monkeypatch, case):
    runtime = tmp_path / "runtime"
    if case == "symlink":
        real = tmp_path / "elsewhere"
        real.mkdir(mode=0o700)
        runtime.symlink_to(real)
    else:
        runtime.mkdir(mode=0o700)
        os.chmod(runtime, {"group-writable": 0o770, "world-writable": 0o777}.get(case, 0o700))
    if case == "other-owner":
        if os.geteuid() != 0:
            pytest.fail("this case needs root to give the folder to another user")
        os.chown(runtime, OTHER_UID, OTHER_UID)
    error = connect_default(runtime, monkeypatch)
    assert isinstance(error, envd.UntrustedPathError), error
    message = str(error)
    assert f"default socket folder {runtime}" in message
    assert f"ls -ld {runtime}" in message
    expected = {"other-owner": f"belongs to uid {OTHER_UID}",
                "group-writable": "mode 0o770 lets other users write it",
                "world-writable": "mode 0o777 lets other users write it",
                "symlink": "not a directory"}[case]
    assert expected in message, message


def test_private_default_folder_passes_the_check(tmp_path, monkeypatch):
    """Ours, 0700: the client goes on (and finds no daemon there)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    error = connect_default(runtime, monkeypatch)
    assert isinstance(error, envd.ConnectionLostError), error
    assert "does not exist" in str(error)


def test_explicit_endpoint_folder_is_the_callers_choice(tmp_path):
    """A folder named explicitly (e.g. a volume shared with a container,
    created 0777) is not checked."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(envd.ConnectionLostError, match="does not exist"):
        envd.connect(f"ipc://{shared}/envd.sock", timeout=2)
