"""ABI 5 through the daemon (`envd --plugin`): spaces described from a
client's params reach it through the make reply, seeds, envs that reset
themselves and their episode log arrive as in-process (shm and inline,
sync and async), the refusals leave the daemon serving, and `list_envs`
shows the description at the defaults."""
from __future__ import annotations

import pytest
from support.abi5_checks import (
    ENV_ID,
    FIELDS,
    SOURCE,
    check_async,
    check_bound,
    check_episodes,
    check_spaces,
    check_staggered_log,
)
from support.daemon import DaemonProcess, segments_of
from support.plugin_checks import build_plugin

from envd.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    folder = tmp_path_factory.mktemp("abi5d")
    plugin = build_plugin(SOURCE, folder / "libabi5.so")
    with DaemonProcess(folder / "d", "--threads", "2", "--plugin", str(plugin)) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


def test_list_shows_the_description_at_the_defaults(daemon):
    with daemon.connect() as client:
        env = {e["id"]: e for e in client.describe_envs()}[ENV_ID]
        assert env["observation_space"]["shape"] == [9]
        assert env["describes"] and env["resets_itself"] and env["episode_fields"] == list(FIELDS)
        assert [p["name"] for p in env["params"]] == ["size", "agents", "episode_len"]


@pytest.mark.parametrize("transport", ["shm", "inline"])
@pytest.mark.parametrize("size, agents", [(5, 2), (2, 1)])
def test_described_seeded_self_resetting_env(daemon, transport, size, agents):
    with daemon.connect() as client, \
            client.make(ENV_ID, 3, seed=10, size=size, agents=agents, episode_len=3,
                        transport=transport) as env:
        check_spaces(env, size, agents, 3)
        check_episodes(env, 10, size, agents, 3)


@pytest.mark.parametrize("transport, copy", [("shm", False), ("shm", True), ("inline", False)])
def test_staggered_episode_log(daemon, transport, copy):
    """Episodes ending at different steps: the log's rows without one read 0."""
    with daemon.connect() as client, \
            client.make(ENV_ID, 3, seed=0, episode_len=[2, 3, 5], transport=transport,
                        copy=copy) as env:
        check_staggered_log(env, [2, 3, 5], 1, copy)


@pytest.mark.parametrize("fast_path", [False, None])
def test_async_episode_log(daemon, fast_path):
    with daemon.connect() as client, \
            client.make(ENV_ID, 4, seed=3, batch_size=2, episode_len=2,
                        fast_path=fast_path) as env:
        check_async(env, 2)


@pytest.mark.parametrize("kwargs, expected", [
    ({"max_episode_steps": 10}, "resets itself"),
    ({"autoreset_mode": "same_step"}, "make it without autoreset_mode"),
    ({"size": [4, 5]}, "envs of one vec must have the same spaces"),
    ({"size": 7}, "describe failed for the params of env 0"),
    ({"size": 8}, "out of memory"),
])
def test_refusals_leave_the_daemon_serving(daemon, kwargs, expected):
    with daemon.connect() as client:
        with pytest.raises(InvalidArgumentError, match=expected):
            client.make(ENV_ID, 2, seed=0, **kwargs)
        with client.make(ENV_ID, 2, seed=0) as env:
            env.reset()


@pytest.fixture(scope="module")
def second_daemon(tmp_path_factory):
    folder = tmp_path_factory.mktemp("abi5d2")
    plugin = build_plugin(SOURCE, folder / "libabi5.so")
    with DaemonProcess(folder / "d", "--threads", "1", "--plugin", str(plugin)) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()


@pytest.mark.parametrize("batch_size", [None, 2])
def test_over_two_daemons(daemon, second_daemon, batch_size):
    """One VecEnv over two daemons: env i is the same wherever it runs."""
    import envd
    with envd.connect([daemon.endpoint, second_daemon.endpoint], timeout=30) as client:
        if batch_size is None:
            with client.make(ENV_ID, 4, seed=10, size=3, agents=2, episode_len=3) as env:
                check_spaces(env, 3, 2, 4)
                check_episodes(env, 10, 3, 2, 3)
        else:
            with client.make(ENV_ID, 4, seed=3, batch_size=2, episode_len=2) as env:
                check_async(env, 2)


@pytest.mark.parametrize("variant, bound", [("OBS_ROWS", True), ("OBS_ROWS_PRIVATE", False)])
def test_rows_in_shared_memory_are_bound_only_for_write_only_envs(variant, bound, tmp_path):
    """A daemon's rows lie in shared memory its client can write: an env that
    reads its rows back (ENVD_ENV_OBS_ROWS_PRIVATE) is never bound there and
    copies; a write-only one (ENVD_ENV_OBS_ROWS) is.  Either way it steps as
    in-process, sync and async, shm and inline."""
    plugin = build_plugin(SOURCE, tmp_path / f"lib{variant}.so", variant)
    with DaemonProcess(tmp_path / "d", "--threads", "2", "--plugin", str(plugin)) as proc:
        with proc.connect() as client:
            for transport in ("shm", "inline"):
                with client.make(ENV_ID, 4, seed=0, size=3, agents=2, batch_size=2,
                                 transport=transport) as env:
                    check_bound(env, bound, 2)
                with client.make(ENV_ID, 3, seed=10, size=2, agents=2, episode_len=3,
                                 transport=transport) as env:
                    check_episodes(env, 10, 2, 2, 3)
    assert proc.proc.returncode == 0, proc.log()
