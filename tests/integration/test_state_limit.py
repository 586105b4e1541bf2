"""--max-state-bytes: the heap of the sessions' env state (num_envs *
state_size with the per-env slots, the vec's private input copies, the
bound of the async books) is counted at make and refused before anything is
allocated, with ``limit_exceeded`` naming the flag and by how much; the
daemon and every other session carry on (issue 15, defect 9)."""
from __future__ import annotations

import argparse
import re

import pytest
import zmq
from support.daemon import Bystander, segments_of, start_daemon, stop_daemon, wait_until
from support.plugin_checks import VARIANTS_SOURCE, build_plugin
from test_limits import Raw

import envd
from envd.native._envd_native import lib
from envd.native.registry import get_spec
from envd.server import config as config_module
from envd.server.config import Config, from_args
from envd.server.sessions import state_plan

BIG_STATE = 16 << 20  # the BigState-v0 plugin's state_size: 16 MiB per env


def bystander_state() -> int:
    return sum(state_plan(get_spec(env_id), n) for env_id, n, _ in Bystander.ENVS)


def test_state_plan_counts_the_state_and_the_books():
    spec = get_spec("CartPole-v1")
    state_size = int(spec.definition.state_size)
    vec = int(lib.envd_vec_memory_bytes(spec.definition, 1000))
    assert vec >= 1000 * (state_size + 8 + 8 + 1)  # state, action, seed, mask copies
    assert state_plan(spec, 1000) >= vec + int(lib.envd_session_books_max_bytes(1000))
    # linear in num_envs: per-env costs only, plus fixed headers
    assert state_plan(spec, 2001) - state_plan(spec, 2000) == \
        state_plan(spec, 1001) - state_plan(spec, 1000)


def test_the_flag_reads_its_variable_and_defaults_to_a_quarter_of_the_memory(monkeypatch):
    parser = argparse.ArgumentParser()
    config_module.add_arguments(parser)
    assert from_args(parser.parse_args([]), {"ENVD_MAX_STATE_BYTES": "12345"}).max_state_bytes \
        == 12345
    assert from_args(parser.parse_args(["--max-state-bytes", "777"]),
                     {"ENVD_MAX_STATE_BYTES": "12345"}).max_state_bytes == 777
    with pytest.raises(ValueError, match="--max-state-bytes"):
        Config(max_state_bytes=0)
    monkeypatch.setattr(config_module, "_memory_bytes", lambda: 8 << 30)
    assert Config().max_state_bytes == 2 << 30
    monkeypatch.setattr(config_module, "_memory_bytes", lambda: None)
    assert Config().max_state_bytes == config_module.FALLBACK_STATE_BYTES


def test_max_state_bytes(tmp_path):
    plugin = build_plugin(VARIANTS_SOURCE, tmp_path / "libbig_state.so", "ENV_ID=\"BigState-v0\"",
                          f"STATE_SIZE={BIG_STATE}")
    base = bystander_state()
    size = state_plan(get_spec("CartPole-v1"), 1000)
    limit = base + 2 * size + size // 2  # room for two sessions of 1000 CartPoles, not three
    proc = start_daemon(tmp_path / "state", "--max-state-bytes", str(limit),
                        "--plugin", str(plugin), "--max-requests-per-second", "0")
    context = zmq.Context()
    attacker, bystander = Raw(context, proc.endpoint), None
    try:
        bystander = Bystander(proc)
        hello = attacker.hello()
        assert hello["limits"]["max_state_bytes"] == limit
        status = attacker.ok({"type": "status"})
        assert status["state_bytes"] == base and status["limits"]["max_state_bytes"] == limit
        first = attacker.make("CartPole-v1", 1000)["session"]
        second = attacker.make("CartPole-v1", 1000)["session"]
        assert attacker.ok({"type": "status"})["state_bytes"] == base + 2 * size
        before = segments_of(proc.pid)
        message = attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 1000},
                                 "--max-state-bytes", str(limit), str(size),
                                 f"{base + 3 * size - limit} bytes over")
        assert "1000 CartPole-v1 envs" in message
        # a plugin with a huge state_size: refused before anything exists
        message = attacker.error({"type": "make", "env_id": "BigState-v0", "num_envs": 64},
                                 "--max-state-bytes", f"state_size {BIG_STATE}")
        needed = int(re.search(r"needs (\d+) bytes", message)[1])
        assert 64 * BIG_STATE < needed < 64 * BIG_STATE + (1 << 20), message
        assert segments_of(proc.pid) == before
        status = attacker.ok({"type": "status"})
        assert status["state_bytes"] == base + 2 * size and status["sessions"] == 4
        # the refused client keeps working, and its freed bytes come back
        attacker.ok({"type": "close", "session": second})
        wait_until(lambda: attacker.ok({"type": "status"})["state_bytes"] == base + size,
                   what="the closed session's bytes to return")
        with proc.connect() as client:
            with pytest.raises(envd.LimitExceededError, match="--max-state-bytes"):
                client.make("BigState-v0", 64)
            env = client.make("CartPole-v1", 1000, seed=3)  # fits again
            env.reset()
        bystander.check()  # bit-exact, and the daemon is alive
        attacker.ok({"type": "close", "session": first})
        wait_until(lambda: attacker.ok({"type": "status"})["state_bytes"] == base,
                   what="the attacker's bytes to return")
        bystander.close()
        bystander = None
        wait_until(lambda: attacker.ok({"type": "status"})["state_bytes"] == 0,
                   what="state_bytes to return to 0")
    finally:
        if bystander is not None:
            bystander.close()
        attacker.close()
        context.term()
        stop_daemon(proc)



def test_envd_status_shows_the_state_in_use():
    from envd.tools.cli import status_table
    table = status_table({"server": "envd x", "pid": 1, "hostname": "h", "uptime_s": 2.0,
                          "threads": 2, "clients": 1, "sessions": 1, "envs": 1000,
                          "env_steps": 0, "shm_bytes": 4096, "state_bytes": 2_834_000})
    assert "shared memory 4.1kB  env state 2.83MB" in table, table
