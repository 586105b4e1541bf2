"""README's quick start, exactly as written: `envd --threads 8` in one
terminal, the trainer snippet in another (both on a temporary endpoint through
ENVD_ENDPOINT, which the daemon and the client both read)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from support.daemon import DEADLINE, segments_of, wait_until

import envd

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> tuple[str, str]:
    """The daemon command and the trainer code of the Quick start section."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return command, code


def test_readme_names_the_two_fresh_machine_commands():
    top = README.read_text().split("## Quick start", 1)[0]
    assert "pip install . && envd --threads 8" in top
    assert "pip install '.[test]' && pytest" in top


def test_quick_start_runs_as_written(tmp_path):
    command, code = quick_start()
    assert command == "envd --threads 8"
    envd_script = shutil.which("envd", path=os.path.dirname(sys.executable)) or shutil.which("envd")
    assert envd_script, "the envd console script is not installed"
    env = {**os.environ, "ENVD_ENDPOINT": f"ipc://{tmp_path}/envd.sock"}
    log = open(tmp_path / "envd.log", "wb")  # noqa: SIM115 -- the daemon's, while it runs
    daemon = subprocess.Popen([envd_script, *command.split()[1:]], cwd=tmp_path, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        def answers() -> bool:
            assert daemon.poll() is None, (tmp_path / "envd.log").read_text()
            try:
                envd.connect(env["ENVD_ENDPOINT"], timeout=2).close()
                return True
            except envd.EnvdError:
                return False
        wait_until(answers, what="the quick-start daemon")
        (tmp_path / "trainer.py").write_text(code)
        trainer = subprocess.run([sys.executable, "trainer.py"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=DEADLINE * 2)
        assert trainer.returncode == 0, trainer.stderr
        returns = [float(line) for line in trainer.stdout.split()]
        assert returns and all(r > 0 for r in returns)  # CartPole pays 1 per step
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(DEADLINE) == 0, (tmp_path / "envd.log").read_text()
        log.close()
    assert segments_of(daemon.pid) == []
