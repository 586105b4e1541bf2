"""The stale-segment sweep at startup and files planted in /dev/shm (issue 15, defect 8).

/dev/shm is writable by everyone: any user can create a file named like a
dead daemon's lock (``.envd-1-deadbeef.lock``, mode 0666) or segment, or a
symlink named so.  The sweep must leave every entry it does not own (or that
is not a regular file, or that it cannot remove) in place, say so in one
warning, never follow a symlink, and start all the same.
"""
from __future__ import annotations

import os
import secrets
import shutil
import stat
from pathlib import Path

import pytest
from support.daemon import DaemonProcess, segments_of, skip_unless_envd_runs_as

#: Owner of the planted files: another user (nobody).
PLANTER = 65534


@pytest.fixture
def planted(tmp_path):
    """plant(name, kind): a file or symlink in /dev/shm, removed afterwards."""
    paths: list[str] = []

    def plant(name: str, kind: str = "file", target: str | None = None,
              uid: int = PLANTER) -> str:
        path = f"/dev/shm/{name}"
        paths.append(path)
        if kind == "symlink":
            os.symlink(target, path)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            os.write(fd, b"\0" * 4096)
            os.fchmod(fd, 0o666)
            os.fchown(fd, uid, uid)
            os.close(fd)
        return path

    try:
        yield plant
    finally:
        for path in paths:
            if os.path.lexists(path):
                os.unlink(path)


def instance() -> str:
    """A '<pid>-<nonce>' no daemon has."""
    return f"{900000 + secrets.randbelow(90000)}-{secrets.token_hex(4)}"


def test_planted_entries_are_left_in_place_and_startup_goes_on(tmp_path, planted):
    if os.geteuid() != 0:
        pytest.fail("this test needs root to give the planted files to another user")
    other = instance()
    lock = planted(f".envd-{other}.lock")                      # another user's, 0666
    segment = planted(f"envd-{other}-{secrets.token_hex(16)}")   # and its "segment"
    # Symlinks named like a dead daemon's lock and segment, to files of ours:
    # neither the links nor their targets may be opened, locked or removed.
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    linked = instance()
    lock_link = planted(f".envd-{linked}.lock", "symlink", str(target))
    dead = instance()  # no lock at all: a dead daemon's, but the segment is a link
    segment_link = planted(f"envd-{dead}-{secrets.token_hex(16)}", "symlink", str(target))
    with DaemonProcess(tmp_path / "daemon", "--threads", "1") as daemon:
        with daemon.connect() as client:
            client.make("CartPole-v1", 4, seed=0).reset()
        log = daemon.log()
    assert daemon.proc.returncode == 0, log
    for path in (lock, segment, lock_link, segment_link):
        assert os.path.lexists(path), (path, log)
    assert os.lstat(lock).st_uid == PLANTER and stat.S_IMODE(os.lstat(lock).st_mode) == 0o666
    assert os.path.islink(lock_link) and os.path.islink(segment_link)
    assert target.read_bytes() == b"keep me"
    assert "WARNING" in log and "not this daemon's to remove" in log, log
    assert f".envd-{other}.lock (owned by uid {PLANTER}" in log, log
    assert f".envd-{linked}.lock (not a regular file)" in log, log
    assert f"{os.path.basename(segment_link)} (not a regular file)" in log, log
    assert segments_of(daemon.pid) == []


def test_a_daemon_of_another_user_starts_despite_a_planted_lock(tmp_path, planted):
    """The reported failure: a non-root daemon opened the planted 0666 lock,
    took it for a dead daemon's, and its unlink's PermissionError (/dev/shm
    is sticky) ended startup."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test needs root and setpriv to run the daemon as another user")
    uid = 61000 + secrets.randbelow(900)
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    skip_unless_envd_runs_as(setpriv)
    planted(f".envd-{instance()}.lock")
    folder = Path(f"/tmp/envd-sweep-{uid}-{secrets.token_hex(4)}")
    folder.mkdir(mode=0o700)
    os.chown(folder, uid, uid)
    try:
        with DaemonProcess(folder, "--threads", "1", prefix=setpriv) as daemon:
            with daemon.connect() as client:
                assert client.status()["pid"] == daemon.pid
            log = daemon.log()
        assert daemon.proc.returncode == 0, log
        assert "not this daemon's to remove" in log, log
    finally:
        shutil.rmtree(folder, ignore_errors=True)
