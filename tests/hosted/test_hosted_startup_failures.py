"""Issue 38 N4: a daemon that cannot start says why in one line and exits.

An allowed env that hung while the daemon described it at startup left the
daemon neither serving nor exiting, its log empty (after 25 s with
--hosted-timeout 3); a --python-env typo printed a 27-line traceback, an
--import typo a traceback or a warning, and a --plugin typo only a log line
while the daemon served.  Each now ends the startup with one line naming the
flag and its value, and exit status 1 (the real CLI, as a subprocess).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from envs import DAEMON_ENV
from support.daemon import DEADLINE

CASES = {
    "hanging env": (["--import", "daemon_envs", "--python-env",
                     "envd-test/HangingConstructor-v0", "--hosted-timeout", "2"],
                    "--python-env envd-test/HangingConstructor-v0", "longer than 2 s"),
    "failing env": (["--import", "daemon_envs", "--python-env",
                     "envd-test/ExitingConstructor-v0"],
                    "--python-env envd-test/ExitingConstructor-v0", "SystemExit"),
    "python-env typo": (["--python-env", "CartPoel-v1"], "--python-env CartPoel-v1",
                        "doesn't exist"),
    "import typo": (["--import", "daemon_envz", "--python-env", "CartPole-v1"],
                    "--import daemon_envz", "No module named 'daemon_envz'"),
    "import typo alone": (["--import", "daemon_envz"], "--import daemon_envz",
                          "No module named 'daemon_envz'"),
    "plugin typo": (["--plugin", "/nonexistent/libmy_envs.so"],
                    "--plugin /nonexistent/libmy_envs.so", "no such file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_startup_failure_is_one_line_naming_the_culprit(tmp_path, case):
    args, culprit, reason = CASES[case]
    run = subprocess.run(
        [sys.executable, "-m", "envd", "--bind", f"ipc://{tmp_path}/envd.sock", "--threads", "1",
         *args], cwd=tmp_path, env={**os.environ, **DAEMON_ENV}, capture_output=True,
        text=True, timeout=DEADLINE)  # (a daemon that serves or hangs never exits)
    output = (run.stdout + run.stderr).strip()
    print(f"\n{case}: exit {run.returncode}: {output}")
    assert run.returncode == 1, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "cannot start" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], output
    assert errors[0].startswith("envd: cannot start: " + culprit), output
    assert reason in errors[0], output
