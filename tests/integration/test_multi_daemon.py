"""One VecEnv over many daemons (envd.connect([...]).make): env i behaves as
env i of the in-process ``envd.make(env_id, N, seed=s)`` bit for bit, however
many daemons serve the envs (1, 2 or 3 here), in every autoreset mode, across
seeded and masked resets; its info dict equals the single env's; it refuses
what the single env refuses with the same message; envs are spread in
proportion to the daemons' threads; a daemon that dies or stops answering is
named in the error; dns+tcp://NAME:PORT connects to every address of NAME."""
from __future__ import annotations

import re
import signal
import socket
import threading
import time

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, VectorEnv
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS
from support.daemon import (
    DEADLINE,
    daemon_group,
    in_bounds_actions,
    seconds_to_time_out,
    wait_until,
)

import envd

MODES = ["next_step", "same_step", "disabled"]
#: Short time limits, so every env ends episodes within STEPS (None: the
#: registered limit; CartPole, Snake and ConnectFour end early under random actions).
TIME_LIMITS = {"CartPole-v1": None, "Pendulum-v1": 40, "MountainCar-v0": 45,
               "MountainCarContinuous-v0": 50, "Acrobot-v1": 55, "Snake-v0": None,
               "ConnectFour-v0": None, "simple_spread_v3": None,
               "simple_spread_continuous_v3": None}
STEPS = 120
NUM_ENVS = 7  # uneven over 2 and 3 daemons


# ---- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    """Three daemons for the module, with 1, 2 and 0 threads (weights 1, 2, 1:
    7 envs split 2+5 over the first two, 2+3+2 over all three).  At the end
    every session must be closed and each must drain to exit 0 leaving no segment."""
    folder = tmp_path_factory.mktemp("multi")
    flags = [("--threads", threads, "--lease-timeout", "10") for threads in ("1", "2", "0")]
    with daemon_group(folder, *flags) as procs:
        yield procs


@pytest.fixture(scope="module")
def multis(daemons):
    """MultiClients over the first 1, 2 and 3 daemons."""
    clients = {}
    try:
        for k in (1, 2, 3):
            clients[k] = envd.connect([d.endpoint for d in daemons[:k]], timeout=30)
        yield clients
    finally:
        for client in clients.values():
            client.close()


@pytest.fixture(scope="module")
def single(daemons):
    """A plain Client of the first daemon (for single RemoteVecEnvs to compare with)."""
    with daemons[0].connect() as client:
        yield client


# ---- comparisons ----------------------------------------------------------------------------
def assert_same_value(a, b, where):
    """a equals b: dicts key for key (recursively), arrays by dtype, shape and
    bytes (object arrays element by element), anything else by ==."""
    if isinstance(b, dict):
        assert isinstance(a, dict), f"{where}: {type(a).__name__} instead of a dict"
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in b:
            if key == "t" and where.endswith("['envd_episode']"):
                # episode times are wall clock: only their layout must agree
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, where
            else:
                assert_same_value(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray), f"{where}: {type(a).__name__} instead of an array"
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if b.dtype == object:
            for i, (x, y) in enumerate(zip(a, b)):
                if y is None:
                    assert x is None, f"{where}[{i}]"
                else:
                    assert_same_value(x, y, f"{where}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), f"{where} differ:\n{a}\n{b}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_same_result(got, want, where):
    names = ("observations", "rewards", "terminations", "truncations", "info")
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        assert_same_value(a, b, f"{name} {where}")


def make_trio(multi, single, env_id, num_envs, **kwargs):
    """The same make over the MultiClient, one daemon and in-process."""
    envs = [multi.make(env_id, num_envs, **kwargs)]
    try:
        envs.append(single.make(env_id, num_envs, **kwargs))
        envs.append(envd.make(env_id, num_envs, num_threads=0, **kwargs))
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


def run_trio(envs, steps, rng, where, reset_done=False):
    """Step all with the same in-bounds actions, comparing every result with
    the in-process env's; returns the number of episodes that ended."""
    episodes = 0
    local = envs[-1]
    for step in range(steps):
        actions = in_bounds_actions(local.single_action_space, local.num_envs, rng)
        results = [env.step(actions) for env in envs]
        for env, result in zip(envs[:-1], results[:-1]):
            assert_same_result(result, results[-1], f"{where} step {step} ({type(env).__name__})")
        done = results[-1][2] | results[-1][3]
        episodes += int(done.sum())
        if reset_done and done.any():
            mask = done.copy()
            results = [env.reset(options={"reset_mask": mask}) for env in envs]
            for result in results[:-1]:
                assert_same_result(result, results[-1], f"{where} masked reset at step {step}")
    return episodes


# ---- bit identity ---------------------------------------------------------------------------
@pytest.mark.parametrize("num_daemons", [1, 2, 3])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
def test_trajectories_bit_identical_to_one_env(multis, single, env_id, mode, num_daemons):
    envs = make_trio(multis[num_daemons], single, env_id, NUM_ENVS, seed=17,
                     autoreset_mode=mode, max_episode_steps=TIME_LIMITS[env_id])
    try:
        multi = envs[0]
        assert isinstance(multi, envd.MultiVecEnv) and isinstance(multi, VectorEnv)
        assert len(multi.shards) == num_daemons
        results = [env.reset() for env in envs]
        for result in results[:-1]:
            assert_same_result(result, results[-1], "first reset")
        episodes = run_trio(envs, STEPS, np.random.default_rng(17), f"{env_id} {mode}",
                            reset_done=mode == "disabled")
        assert episodes >= NUM_ENVS, "the run must cross episode ends"
    finally:
        for env in envs:
            env.close()


def test_split_over_the_module_daemons(multis, daemons):
    """7 envs over weights 1, 2, 1: 2+5 over two daemons, 2+3+2 over three."""
    for k, sizes in ((1, [7]), (2, [2, 5]), (3, [2, 3, 2])):
        with multis[k].make("CartPole-v1", NUM_ENVS, seed=0) as env:
            assert [s.stop - s.start for s in env.shard_slices] == sizes
            assert [s.num_envs for s in env.shards] == sizes
            assert env.shard_endpoints == tuple(d.endpoint for d in daemons[:k])
            assert env.shard_slices[0].start == 0 and env.shard_slices[-1].stop == NUM_ENVS


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "ConnectFour-v0"])
def test_seeded_and_masked_resets(multis, single, env_id):
    envs = make_trio(multis[3], single, env_id, NUM_ENVS, seed=3, max_episode_steps=30)
    try:
        rng = np.random.default_rng(1)

        def reset_all(where, **kwargs):
            results = [env.reset(**kwargs) for env in envs]
            for result in results[:-1]:
                assert_same_result(result, results[-1], where)

        reset_all("reset(seed=int)", seed=123)
        run_trio(envs, 25, rng, "after int seed")
        seeds = [9, 2**64 - 1, 0, 9, 2**40 + 7, 5, 1]
        reset_all("reset(seed=list)", seed=seeds)
        run_trio(envs, 25, rng, "after list seed")
        reset_all("reset(seed=ndarray)", seed=np.arange(100, 107, dtype=np.uint64))
        reset_all("reset()")  # each env continues its own generator
        run_trio(envs, 25, rng, "after reset()")
        # a mask inside the middle shard only (envs 2..4 on daemon 1), then across shards
        for mask in ([False, False, False, True, False, False, False],
                     [True, False, False, False, True, True, False]):
            reset_all(f"masked reset {mask}", seed=77, options={"reset_mask": np.array(mask)})
            run_trio(envs, 25, rng, f"after masked reset {mask}")
    finally:
        for env in envs:
            env.close()


def test_results_are_views_and_copy_true_copies(multis):
    with multis[2].make("CartPole-v1", 4, seed=0, max_episode_steps=1,
                        autoreset_mode="same_step") as env:
        env.reset()
        first = env.step(np.ones(4, np.int64))
        snapshot = first[0].copy()
        second = env.step(np.zeros(4, np.int64))
        for a, b in zip(first[:4], second[:4]):
            assert a is b  # the env's buffers, overwritten by the next step
        assert first[0].tobytes() == second[0].tobytes() != snapshot.tobytes()
    with multis[2].make("CartPole-v1", 4, seed=0, max_episode_steps=1, copy=True,
                        autoreset_mode="same_step") as env:
        env.reset()
        first = env.step(np.ones(4, np.int64))
        snapshot = [a.copy() for a in first[:4]]
        second = env.step(np.zeros(4, np.int64))
        for a, b, old in zip(first[:4], second[:4], snapshot):
            assert not np.shares_memory(a, b) and a.tobytes() == old.tobytes()
        assert not np.shares_memory(first[4]["envd_episode"]["r"], second[4]["envd_episode"]["r"])


def test_in_place_step_equals_step_over_two_daemons(multis):
    """env.actions written, step_in_place(): the same results and infos as
    step() of a MultiVecEnv with the same seeds and actions; a bad action
    written into the buffer gets step()'s error (naming the global env)."""
    steps, n = 60, 5
    with multis[2].make("CartPole-v1", n, seed=7, max_episode_steps=20) as by_step, \
            multis[2].make("CartPole-v1", n, seed=7, max_episode_steps=20) as in_place:
        by_step.reset(seed=7)
        in_place.reset(seed=7)
        rng = np.random.default_rng(0)
        ended = 0
        for k in range(steps):
            actions = rng.integers(0, 2, n)
            obs, rewards, terminations, truncations, info = by_step.step(actions)
            in_place.actions[...] = actions
            ended += in_place.step_in_place()
            for mine, theirs in ((in_place.observations, obs), (in_place.rewards, rewards),
                                 (in_place.terminations, terminations),
                                 (in_place.truncations, truncations)):
                assert mine.tobytes() == theirs.tobytes(), f"step {k}"
            got = in_place.step_info()
            assert got.keys() == info.keys(), f"step {k}"
            for key, value in info.items():  # (the episodes' "t" is measured: never equal)
                if isinstance(value, dict):
                    for name in value.keys() - {"t"}:
                        assert np.array_equal(got[key][name], value[name]), f"step {k}"
                else:
                    assert np.array_equal(got[key], value), f"step {k}"
        assert ended > 0
        bad = np.zeros(n, np.int64)
        bad[3] = 5
        with pytest.raises(envd.InvalidActionError) as from_step:
            by_step.step(bad)
        in_place.actions[...] = bad
        with pytest.raises(envd.InvalidActionError) as from_buffer:
            in_place.step_in_place()
        assert str(from_buffer.value) == str(from_step.value)


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
def test_spaces_and_attributes_match(multis, env_id):
    for mode in MODES:
        with multis[3].make(env_id, 5, autoreset_mode=mode) as multi, \
                envd.make(env_id, 5, num_threads=0, autoreset_mode=mode) as local:
            assert multi.num_envs == local.num_envs == 5 * local.num_agents  # (rows)
            assert multi.num_agents == local.num_agents
            assert multi.single_observation_space == local.single_observation_space
            assert multi.single_action_space == local.single_action_space
            assert multi.observation_space == local.observation_space
            assert multi.action_space == local.action_space
            assert multi.metadata["autoreset_mode"] is local.metadata["autoreset_mode"]
            assert multi.max_episode_steps == local.max_episode_steps
            assert multi.env_id == env_id


# ---- errors read as the single env's ------------------------------------------------------------
def same_error(call, multi_client, exc_type):
    """call(maker) raises exc_type with the same message for envd.make and
    the MultiClient's make; returns the message."""
    messages = []
    for maker in (lambda *a, **k: envd.make(*a, num_threads=0, **k), multi_client.make):
        with pytest.raises(envd.EnvdError) as info:
            call(maker)
        assert type(info.value) is exc_type, repr(info.value)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    return messages[0]


def test_step_errors_name_the_global_env_index(multis):
    multi_client = multis[3]
    made = []

    def make(maker, env_id, reset=True, **kwargs):
        env = maker(env_id, NUM_ENVS, seed=0, **kwargs)
        made.append(env)
        if reset:
            env.reset()
        return env

    try:
        bad = np.zeros(NUM_ENVS, np.int64)
        bad[5] = 2  # env 5 lives on the third daemon
        message = same_error(lambda m: make(m, "CartPole-v1").step(bad), multi_client,
                             envd.InvalidActionError)
        assert "action 2 of env 5 is out of range" in message
        for actions in (np.zeros(NUM_ENVS + 1, np.int64), np.zeros(NUM_ENVS, np.float32)):
            same_error(lambda m, a=actions: make(m, "CartPole-v1").step(a), multi_client,
                       envd.InvalidActionError)
        same_error(lambda m: make(m, "Pendulum-v1").step(np.zeros((NUM_ENVS, 1), np.float64)),
                   multi_client, envd.InvalidActionError)
        message = same_error(lambda m: make(m, "Acrobot-v1", reset=False).step(bad * 0),
                             multi_client, envd.EnvStateError)
        assert "env 0 was never reset" in message
        # disabled mode: env 4 (second daemon) ends and is not reset
        message = same_error(lambda m: stepped_past_a_done(make(m, "CartPole-v1",
                                                                 autoreset_mode="disabled",
                                                                 max_episode_steps=3)),
                             multi_client, envd.EnvStateError)
        assert "env 4 is done and autoreset_mode is 'disabled'" in message
        # a refused step stepped nothing: both go on alike
        local, multi = made[-2:]  # same_error makes in-process first
        mask = np.zeros(NUM_ENVS, bool)
        mask[4] = True
        assert_same_result(multi.reset(options={"reset_mask": mask}),
                           local.reset(options={"reset_mask": mask}), "reset of env 4")
        for step in range(3):
            actions = np.ones(NUM_ENVS, np.int64)
            assert_same_result(multi.step(actions), local.step(actions), f"step {step}")
    finally:
        for env in made:
            env.close()


def stepped_past_a_done(env):
    """Reset all, end every episode (time limit 3), reset all but env 4 and step."""
    env.reset()
    for _ in range(3):
        env.step(np.zeros(env.num_envs, np.int64))
    mask = np.ones(env.num_envs, bool)
    mask[4] = False
    env.reset(options={"reset_mask": mask})
    env.step(np.zeros(env.num_envs, np.int64))


@pytest.mark.parametrize("call", [
    lambda m: m("CartPole-v1", 3, seed=[1, 2]),
    lambda m: m("CartPole-v1", 2, seed=-1),
    lambda m: m("CartPole-v1", 4, seed=2**64 - 3),
    lambda m: m("CartPole-v1", 0),
    lambda m: m("CartPole-v1", 2.0),
    lambda m: m(5, 2),
    lambda m: m("CartPole-v1", 2, autoreset_mode="sometimes"),
    lambda m: m("CartPole-v1", 2, gravity=1.0),
    lambda m: m("Pendulum-v1", 2, g=-1.0),
    lambda m: m("CartPole-v1", 2, max_episode_steps=-1),
], ids=["seed list length", "seed negative", "seed overflow", "num_envs 0", "num_envs float",
        "env_id int", "autoreset_mode", "unknown kwarg", "kwarg range", "max_episode_steps"])
def test_make_errors_match(multis, call):
    same_error(call, multis[3], envd.InvalidArgumentError)


def test_unknown_env_names_a_daemon(multis, daemons):
    with pytest.raises(envd.UnknownEnvError) as info:
        multis[2].make("NoSuchEnv-v0", 4)
    assert "NoSuchEnv-v0" in str(info.value) and daemons[0].endpoint in str(info.value)


def test_reset_errors_and_closed_env_match(multis):
    with multis[3].make("MountainCar-v0", NUM_ENVS, seed=0) as multi, \
            envd.make("MountainCar-v0", NUM_ENVS, seed=0, num_threads=0) as local:
        for kwargs in ({"seed": -1}, {"seed": [1, 2]}, {"seed": 0.5},
                       {"options": {"reset_mask": np.zeros(NUM_ENVS, bool)}},
                       {"options": {"reset_mask": [True] * NUM_ENVS}}, {"options": {"other": 1}}):
            messages = []
            for env in (local, multi):
                with pytest.raises(envd.InvalidArgumentError) as info:
                    env.reset(**kwargs)
                messages.append(str(info.value))
            assert messages[0] == messages[1], kwargs
        assert_same_result(multi.reset(), local.reset(), "reset after errors")
    for env in (local, multi):
        env.close()  # idempotent
        with pytest.raises(envd.EnvStateError, match="^this MountainCar-v0 VecEnv is closed$"):
            env.step(np.zeros(NUM_ENVS, np.int64))
    assert multi.shards == ()


def test_async_calls_of_a_sync_multivecenv_are_refused(multis):
    # (async mode over several daemons: tests/integration/test_multi_daemon_async.py)
    with pytest.raises(envd.InvalidArgumentError, match="batch_size"):
        multis[2].make("CartPole-v1", 8, batch_size=9)
    with multis[2].make("CartPole-v1", 8, batch_size=8) as env:  # = num_envs: plain steps
        env.reset(seed=0)
        env.step(np.zeros(8, np.int64))
        for call in (env.async_reset, lambda: env.send(np.zeros(1, np.int64), [0]), env.recv):
            with pytest.raises(envd.EnvStateError, match="async mode"):
                call()


def test_multiclient_api(multis, daemons):
    multi = multis[3]
    assert multi.endpoints == tuple(d.endpoint for d in daemons)
    assert [c.endpoint for c in multi.clients] == list(multi.endpoints)
    statuses = multi.status()
    assert isinstance(statuses, list)
    assert [s["pid"] for s in statuses] == [d.pid for d in daemons]
    assert [s["threads"] for s in statuses] == [1, 2, 0]
    assert daemons[2].endpoint in repr(multi)
    # a plain string still gives a plain Client
    with envd.connect(daemons[0].endpoint) as client:
        assert type(client) is envd.Client
    # a one-element list is a MultiClient all the same
    with envd.connect([daemons[0].endpoint]) as one:
        assert isinstance(one, envd.MultiClient) and len(one.clients) == 1


# ---- placement over daemons of different sizes, failures ----------------------------------
def test_envs_spread_in_proportion_to_threads(harness):
    small, large = harness.daemon("--threads", "1"), harness.daemon("--threads", "2")
    with envd.connect([small.endpoint, large.endpoint]) as multi, \
            small.connect() as probe_small, large.connect() as probe_large:
        for num_envs, sizes in ((5, [2, 3]), (3, [1, 2]), (6, [2, 4]), (1, [0, 1])):
            with multi.make("Pendulum-v1", num_envs, seed=4) as env:
                hosted = [probe_small.status()["envs"], probe_large.status()["envs"]]
                assert hosted == sizes, num_envs
                assert [s.stop - s.start for s in env.shard_slices] == [n for n in sizes if n]
                with envd.make("Pendulum-v1", num_envs, seed=4, num_threads=0) as local:
                    assert_same_result(env.reset(), local.reset(), f"reset {num_envs}")
                    actions = np.full((num_envs, 1), 0.5, np.float32)
                    assert_same_result(env.step(actions), local.step(actions), f"step {num_envs}")
        assert probe_small.status()["envs"] == probe_large.status()["envs"] == 0


def envd_threads() -> set[threading.Thread]:
    """The worker threads of MultiClients and MultiVecEnvs alive now."""
    return {t for t in threading.enumerate() if t.name.startswith("envd-multi")}


@pytest.mark.parametrize("path", [{"fast_path": True}, {"fast_path": False},
                                  {"transport": "inline"}], ids=["doorbell", "shm", "inline"])
def test_a_sync_step_steps_every_shard_on_the_callers_thread(multis, path):
    """A sync step posts a step on every shard through its transport's
    non-blocking half, then waits for them, all on the caller's thread: no
    pool thread touches a shard's stepper (nor its socket or doorbell), and
    every daemon is asked before the first answer is waited for (so they
    step at once)."""
    calls: list[tuple[str, int, int]] = []

    def spy_on(call, name, k):
        """call, recording its name, shard and calling thread first (set on
        the instance: what a call on it finds)."""
        def spy(*args):
            calls.append((name, k, threading.get_ident()))
            return call(*args)
        return spy

    with multis[3].make("CartPole-v1", NUM_ENVS, seed=3, **path) as env:
        env.reset()
        for k, shard in enumerate(env.shards):
            stepper = shard.stepper
            for name in ("step", "post_step", "wait"):
                setattr(stepper, name, spy_on(getattr(stepper, name), name, k))
        for _ in range(3):
            env.step(np.zeros(NUM_ENVS, np.int64))
    assert {thread for _, _, thread in calls} == {threading.get_ident()}
    one_step = [("post_step", k) for k in range(3)] + [("wait", k) for k in range(3)]
    assert [(name, k) for name, k, _ in calls] == one_step * 3


def test_a_killed_daemon_is_named_and_the_rest_closes_cleanly(harness):
    threads_before = envd_threads()
    first, second = harness.daemon("--threads", "1"), harness.daemon("--threads", "1")
    timeout = 10.0
    multi = envd.connect([first.endpoint, second.endpoint], timeout=timeout)
    try:
        env = multi.make("CartPole-v1", 6, seed=1)
        env.reset()
        env.step(np.zeros(6, np.int64))
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait(30)
        started = time.monotonic()
        with pytest.raises((envd.ConnectionLostError, envd.EnvdTimeoutError)) as info:
            env.step(np.zeros(6, np.int64))
        assert time.monotonic() - started < timeout + 5  # the Client timeout bounds it
        assert second.endpoint in str(info.value)
        assert first.endpoint not in str(info.value)
        # the env stays refused, with the same culprit
        with pytest.raises(envd.ConnectionLostError) as info:
            env.step(np.zeros(6, np.int64))
        assert second.endpoint in str(info.value) and "envs 3..5" in str(info.value)
        env.close()
        env.close()
        with first.connect() as probe:  # the surviving daemon freed its shard
            wait_until(lambda: probe.status()["sessions"] == 0,
                       what="the first daemon's shard closed")
    finally:
        multi.close()
    assert envd_threads() <= threads_before


def test_a_daemon_that_stops_answering_is_named(harness):
    threads_before = envd_threads()
    first, second = harness.daemon("--threads", "1"), harness.daemon("--threads", "1")
    multi = envd.connect([first.endpoint, second.endpoint], timeout=DEADLINE)
    try:
        env = multi.make("Acrobot-v1", 4, seed=1)
        env.reset()
        first.signal(signal.SIGSTOP)  # (returns once it is stopped)
        for client in multi.clients:  # short only while a daemon cannot answer
            client.timeout = 2.0
        try:
            with pytest.raises(envd.EnvdTimeoutError) as info:
                env.step(np.zeros(4, np.int64))
            assert first.endpoint in str(info.value) and second.endpoint not in str(info.value)
        finally:
            first.proc.send_signal(signal.SIGCONT)
        for client in multi.clients:
            client.timeout = DEADLINE
        env.close()
    finally:
        multi.close()
    assert envd_threads() <= threads_before


@pytest.mark.parametrize("fast_path", [True, False], ids=["doorbell", "shm"])
def test_a_step_on_daemons_that_all_hang_takes_one_timeout(harness, fast_path):
    """Both daemons stop answering: the sync step raises EnvdTimeoutError
    after one Client timeout in all (one deadline for the step, shared by
    every shard's wait), not one per daemon, naming the first daemon; both
    steps may still run, so the env refuses a step until their late answers
    came, then steps again."""
    timeout = 3.0  # (one per daemon would be >= 6 s: the bound below has 2.5 s of margin)
    threads_before = envd_threads()
    daemons = [harness.daemon("--threads", "1"), harness.daemon("--threads", "1")]
    multi = envd.connect([d.endpoint for d in daemons], timeout=DEADLINE)
    try:
        env = multi.make("CartPole-v1", 4, seed=1, fast_path=fast_path)
        assert [shard.fast_path for shard in env.shards] == [fast_path, fast_path]
        env.reset()
        env.step(np.zeros(4, np.int64))
        elapsed, error = seconds_to_time_out(daemons, multi.clients, timeout,
                                             lambda: env.step(np.zeros(4, np.int64)))
        assert timeout <= elapsed < 2 * timeout - 0.5, f"the step took {elapsed:.2f} s"
        message = str(error)
        assert daemons[0].endpoint in message and daemons[1].endpoint not in message
        assert f"within {timeout:g} s (Client timeout)" in message

        def steps() -> bool:
            """A step, once both late answers came (refused until then)."""
            try:
                env.step(np.zeros(4, np.int64))
            except envd.EnvStateError as exc:
                assert "timed out" in str(exc)
                return False
            return True

        wait_until(steps, what="a step once the late answers came")
        env.close()
    finally:
        multi.close()
    assert envd_threads() <= threads_before


def test_connect_fails_naming_the_missing_daemon_and_closes_the_others(harness, tmp_path):
    threads_before = envd_threads()
    daemon = harness.daemon("--threads", "1")
    missing = f"ipc://{tmp_path}/nobody/envd.sock"
    with pytest.raises(envd.ConnectionLostError, match=re.escape(missing)):
        envd.connect([daemon.endpoint, missing], timeout=5)
    with daemon.connect() as probe:  # only the probe is left
        wait_until(lambda: probe.status()["clients"] == 1, what="the first connection closed")
    assert envd_threads() <= threads_before


def test_close_closes_every_env_and_is_idempotent(harness):
    threads_before = envd_threads()
    daemons = [harness.daemon("--threads", "1") for _ in range(2)]
    multi = envd.connect([d.endpoint for d in daemons])
    env = multi.make("CartPole-v1", 4, seed=0)
    env.reset()
    multi.close()
    multi.close()
    assert env.closed
    with pytest.raises(envd.EnvStateError, match="closed"):
        env.step(np.zeros(4, np.int64))
    with pytest.raises(envd.EnvStateError, match="closed"):
        multi.make("CartPole-v1", 2)
    assert envd_threads() <= threads_before


# ---- dns+tcp ----------------------------------------------------------------------------------
def free_port_on(*hosts: str) -> int:
    """A tcp port free on every host address (tried a few times)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts:
                with socket.socket() as other:
                    other.bind((host, port))
            return port
        except OSError:
            continue
    raise AssertionError(f"no port free on all of {hosts}")


def test_dns_name_connects_to_every_address(harness, monkeypatch):
    """A headless Service: one name, two pod addresses, one port.  Both
    daemons listen on loopback (127.0.0.1 and 127.0.0.2), where no CURVE is needed."""
    port = free_port_on("127.0.0.1", "127.0.0.2")
    daemons = [harness.daemon("--threads", "1", "--bind", f"tcp://{host}:{port}")
               for host in ("127.0.0.2", "127.0.0.1")]
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host == "envd-headless.test.svc":  # answers in the resolver's order, not sorted
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))
                    for ip in ("127.0.0.2", "127.0.0.1", "127.0.0.2")]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    threads_before = envd_threads()
    with envd.connect(f"dns+tcp://envd-headless.test.svc:{port}", timeout=10) as multi:
        assert isinstance(multi, envd.MultiClient)
        assert multi.endpoints == (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.2:{port}")
        assert [s["pid"] for s in multi.status()] == [daemons[1].pid, daemons[0].pid]
        with multi.make("Acrobot-v1", 5, seed=9, max_episode_steps=40) as env, \
                envd.make("Acrobot-v1", 5, seed=9, max_episode_steps=40, num_threads=0) as local:
            assert len(env.shards) == 2
            assert_same_result(env.reset(), local.reset(), "reset")
            rng = np.random.default_rng(0)
            for step in range(60):
                actions = in_bounds_actions(local.single_action_space, 5, rng)
                assert_same_result(env.step(actions), local.step(actions), f"step {step}")
    assert envd_threads() <= threads_before


def test_dns_localhost_for_real(harness):
    """localhost resolves (here: to 127.0.0.1 and maybe ::1); with a daemon on
    127.0.0.1 only, connect works whenever localhost is IPv4 only."""
    from envd.client.discovery import resolve
    port = free_port_on("127.0.0.1")
    endpoints = resolve(f"dns+tcp://localhost:{port}")
    if endpoints != [f"tcp://127.0.0.1:{port}"]:
        pytest.skip(f"localhost resolves to {endpoints} here; the daemon listens on IPv4 only")
    daemon = harness.daemon("--threads", "1", "--bind", f"tcp://127.0.0.1:{port}")
    with envd.connect(f"dns+tcp://localhost:{port}", timeout=10) as multi:
        assert [s["pid"] for s in multi.status()] == [daemon.pid]
        with multi.make("CartPole-v1", 3, seed=2) as env, \
                envd.make("CartPole-v1", 3, seed=2, num_threads=0) as local:
            assert_same_result(env.reset(), local.reset(), "reset")
            assert env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP


def test_ipv4_and_ipv6_addresses_of_one_name(harness, monkeypatch):
    """A name with an A and an AAAA record (dual-stack Service): one daemon on
    127.0.0.1, one on [::1]; both serve one VecEnv."""
    try:
        port = free_port_on("127.0.0.1")
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", port))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    daemons = [harness.daemon("--threads", "1", "--bind", endpoint)
               for endpoint in (f"tcp://127.0.0.1:{port}", f"tcp://[::1]:{port}")]
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host == "envd-dual.test.svc":
            return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                     ("::1", port, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                     ("127.0.0.1", port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with envd.connect(f"dns+tcp://envd-dual.test.svc:{port}", timeout=10) as multi:
        assert multi.endpoints == (f"tcp://127.0.0.1:{port}", f"tcp://[::1]:{port}")
        assert [s["pid"] for s in multi.status()] == [d.pid for d in daemons]
        with multi.make("CartPole-v1", 4, seed=5) as env, \
                envd.make("CartPole-v1", 4, seed=5, num_threads=0) as local:
            assert_same_result(env.reset(), local.reset(), "reset")
            for step in range(20):
                actions = np.arange(4) % 2
                assert_same_result(env.step(actions), local.step(actions), f"step {step}")
