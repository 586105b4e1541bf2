"""`envd --plugin`: the daemon serves a plugin's envs (info fields included);
a plugin that fails to load is logged and listed by status, and the daemon
serves everything else."""
from __future__ import annotations

import numpy as np
import pytest
from support.daemon import DaemonProcess, segments_of
from support.plugin_checks import (
    EXAMPLE_SOURCE,
    VARIANTS_SOURCE,
    GuessNumber,
    build_plugin,
    check_against_reference,
    check_async_failure,
    guesses,
)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugins")
    return {"good": build_plugin(EXAMPLE_SOURCE, folder / "libguess_number.so"),
            "other_abi": build_plugin(VARIANTS_SOURCE, folder / "libother_abi.so", "OTHER_ABI"),
            "info_fails": build_plugin(VARIANTS_SOURCE, folder / "libinfo_fails.so", "INFO_FAILS")}


@pytest.fixture
def daemon_with_plugins(tmp_path, plugins):
    with DaemonProcess(tmp_path / "d", "--threads", "2", "--plugin", str(plugins["good"]),
                       "--plugin", str(plugins["other_abi"]),
                       "--plugin", str(plugins["info_fails"])) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


def test_daemon_serves_plugin_envs_and_reports_the_broken_one(daemon_with_plugins, plugins):
    with daemon_with_plugins.connect() as client:
        described = {env["id"]: env for env in client.describe_envs()}
        guess = described["GuessNumber-v0"]
        assert guess["origin"] == str(plugins["good"])
        assert guess["info_fields"] == [{"name": "bounds", "dtype": "int64", "shape": [2],
                                         "doc": "[low, high]: where the number can still be"}]
        assert "CartPole-v1" in described  # built-ins still there
        status = client.status()["plugins"]
        assert status[0] == {"path": str(plugins["good"]), "envs": ["GuessNumber-v0"]}
        assert status[1]["path"] == str(plugins["other_abi"])
        assert "built for envd ABI 999" in status[1]["error"]
        with client.make("GuessNumber-v0", 12, seed=5, penalty=0.5) as env:
            assert check_against_reference(env, 5, 0.5) > 12
    log = daemon_with_plugins.log()
    assert "built for envd ABI 999" in log and "serving without it" in log


def test_daemon_async_recv_carries_info_fields(daemon_with_plugins):
    with daemon_with_plugins.connect() as client, \
            client.make("GuessNumber-v0", 8, seed=2, batch_size=4) as env:
        refs = [GuessNumber(2 + i, 0.0) for i in range(8)]
        expected = {i: refs[i].reset()[1] for i in range(8)}
        env.async_reset()
        rng = np.random.default_rng(0)
        for _ in range(30):
            obs, rewards, terms, truncs, info = env.recv()
            ids = info["env_id"]
            assert info["bounds"].tolist() == [expected[i] for i in ids]
            actions = guesses([refs[i] for i in ids], rng)
            for i, a in zip(ids, actions):
                expected[i] = refs[i].step(int(a))[4]
            env.send(actions, ids)


def test_plugins_from_environment_variable(tmp_path, plugins):
    with DaemonProcess(tmp_path / "d", "--threads", "0",
                       env={"ENVD_PLUGINS": f"{plugins['good']}:"}) as proc:
        with proc.connect() as client:
            assert "GuessNumber-v0" in client.list_envs()
    assert proc.proc.returncode == 0, proc.log()


def test_env_failing_inside_async_batches_through_the_daemon(daemon_with_plugins):
    with daemon_with_plugins.connect() as client:
        with client.make("TestPlugin-v0", 6, seed=0, batch_size=2) as env:
            check_async_failure(env)
        with client.make("CartPole-v1", 4, seed=0) as bystander:  # the daemon is fine
            bystander.reset()
            bystander.step(np.zeros(4, np.int64))
