"""`envd list --endpoint` asks a running daemon which envs it can make (its
hosted Python envs too), as text and JSON; and `envd list` writes integer
bounds in full."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from support.daemon import DEADLINE

from envd.native import get_spec


def run_envd(cwd, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}
    return subprocess.run([sys.executable, "-m", "envd", *args], cwd=cwd,
                          env={**environ, **(env or {})}, capture_output=True, text=True,
                          timeout=DEADLINE * 2)


def test_list_endpoint_shows_the_daemons_envs(harness, tmp_path):
    daemon = harness.daemon("--threads", "1", "--python-env", "Acrobot-v1")
    with daemon.connect() as client:
        want = client.list_envs()
    assert "py:Acrobot-v1" in want
    listed = run_envd(tmp_path, "list", "--endpoint", daemon.endpoint, "--json")
    assert listed.returncode == 0, listed.stderr
    described = json.loads(listed.stdout)
    assert [env["id"] for env in described] == want
    hosted = next(env for env in described if env["id"] == "py:Acrobot-v1")
    assert hosted["source"] == "python" and hosted["plugin"] is None
    assert hosted["action_space"] == {"type": "Discrete", "n": 3, "start": 0}
    text = run_envd(tmp_path, "list", "--endpoint", env={"ENVD_ENDPOINT": daemon.endpoint})
    assert text.returncode == 0, text.stderr
    assert "py:Acrobot-v1  hosted Python env, max_episode_steps 500" in text.stdout
    assert "CartPole-v1  built-in" in text.stdout


def test_list_and_status_take_a_dns_endpoint_of_several_daemons(harness, tmp_path):
    """dns+tcp:// stands for every daemon a name resolves to (a MultiClient):
    list shows what every one of them can make, status each daemon's table."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tcp = f"tcp://127.0.0.1:{port}"
    daemon = harness.daemon("--threads", "1", "--python-env", "Acrobot-v1", "--bind", tcp)
    with daemon.connect() as client:
        want = client.list_envs()
    dns = f"dns+tcp://localhost:{port}"
    listed = run_envd(tmp_path, "list", "--endpoint", dns, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [env["id"] for env in json.loads(listed.stdout)] == want
    status = run_envd(tmp_path, "status", "--endpoint", dns)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"{tcp}\n")
    as_json = run_envd(tmp_path, "status", "--endpoint", dns, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert isinstance(json.loads(as_json.stdout), list)


def test_list_endpoint_without_a_daemon_fails_in_one_line(tmp_path):
    missing = f"ipc://{tmp_path}/none.sock"
    listed = run_envd(tmp_path, "list", "--endpoint", missing)
    assert listed.returncode == 1 and listed.stdout == ""
    assert listed.stderr.strip() == listed.stderr.strip().splitlines()[0]
    assert listed.stderr.startswith(f"envd list: no envd daemon at {missing}")


def test_integer_bounds_are_written_in_full(tmp_path):
    param = next(p for p in get_spec("simple_spread_v3").params if p.type == "int")
    listed = run_envd(tmp_path, "list")
    line = next(line for line in listed.stdout.splitlines() if f" {param.name} (int" in line)
    assert f"in [{int(param.min_value)}, {int(param.max_value)}]" in line
    assert "e+" not in line


def test_integer_bounds_are_ints_in_json(tmp_path):
    param = next(p for p in get_spec("simple_spread_v3").params if p.type == "int")
    listed = json.loads(run_envd(tmp_path, "list", "--json").stdout)
    described = next(p for env in listed if env["id"] == "simple_spread_v3"
                     for p in env["params"] if p["name"] == param.name)
    assert described["max"] == int(param.max_value) and type(described["max"]) is int
    assert type(described["min"]) is int
