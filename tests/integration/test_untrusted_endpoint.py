"""Another user's daemon in a trainer's default socket folder (issue 15, defect 7).

Without XDG_RUNTIME_DIR a trainer connects to /tmp/envd-<its uid>/envd.sock;
anyone can create that folder first and serve their own daemon there, which
would see the trainer's observations and actions.  The trainer (a non-root
user here) must refuse the folder before it says hello.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import DEADLINE, DaemonProcess, skip_unless_envd_runs_as
from test_faults import clean_environ, unused_uid

ATTACKER = 65534

VICTIM = """
import envd
try:
    with envd.connect(timeout=5) as client:
        client.make("CartPole-v1", 4, seed=0).reset()
        print("connected and made an env")
except envd.EnvdError as exc:
    print(type(exc).__name__, exc)
"""


def test_default_folder_planted_by_another_user_is_refused(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test needs root and setpriv to run two other users")
    victim = unused_uid()
    as_victim = ["setpriv", f"--reuid={victim}", f"--regid={victim}", "--clear-groups"]
    as_attacker = ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups"]
    skip_unless_envd_runs_as(as_victim)
    folder = Path(f"/tmp/envd-{victim}")  # the victim's fallback folder, made first
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    os.chown(folder, ATTACKER, ATTACKER)
    try:
        # Under umask 0 its socket file is 0777: anyone may connect to it.
        umask = os.umask(0)
        try:
            attacker = DaemonProcess(folder, "--threads", "1", prefix=as_attacker)
        finally:
            os.umask(umask)
        with attacker:
            out = subprocess.run([*as_victim, sys.executable, "-c", VICTIM], cwd="/",
                                 env=clean_environ(), capture_output=True, text=True,
                                 timeout=DEADLINE, check=False)
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("UntrustedPathError"), out.stdout
            assert f"default socket folder {folder} is not safe" in out.stdout
            assert f"belongs to uid {ATTACKER}" in out.stdout, out.stdout
            assert "session opened" not in attacker.log()  # it never served the victim
    finally:
        shutil.rmtree(folder, ignore_errors=True)
