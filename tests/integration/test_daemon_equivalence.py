"""A daemon-served env is the in-process env: every built-in env, stepped
through a real daemon, gives bit-identical trajectories (observations,
rewards, terminations, truncations, info dicts) to ``envd.make`` with the same
seed and actions, in every autoreset mode, across resets and reseeding, with
env kwargs and time limits; it has the same spaces, the same view/copy rules
and fails with the same errors (class and message)."""
from __future__ import annotations

import functools
import mmap

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS, random_actions
from support.daemon import DaemonProcess, segments_of, wait_until

import envd

MODES = ["next_step", "same_step", "disabled"]


# ---- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One daemon for the module (2 threads, 10 s lease); at the end every
    session must be closed, and it must drain to exit status 0 leaving no segment."""
    proc = DaemonProcess(tmp_path_factory.mktemp("equivalence") / "daemon",
                         "--threads", "2", "--lease-timeout", "10")
    try:
        yield proc
        with proc.connect() as probe:
            wait_until(lambda: probe.status()["sessions"] == 0, what="every session closed")
    finally:
        returncode = proc.stop()
    assert returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


@pytest.fixture(scope="module", params=["shm", "inline"])
def client(daemon, request):
    """A client whose makes take one transport: every test runs over shared
    memory and over the inline transport (arrays in the messages), which must
    be indistinguishable."""
    with daemon.connect() as c:
        c.make = functools.partial(c.make, transport=request.param)
        yield c


def make_pair(client, env_id, num_envs, **kwargs):
    """(remote, local): the same make through the daemon and in-process."""
    remote = client.make(env_id, num_envs, **kwargs)
    try:
        local = envd.make(env_id, num_envs, num_threads=0, **kwargs)
    except BaseException:
        remote.close()
        raise
    return remote, local


# ---- comparisons ----------------------------------------------------------------------------
def assert_same_array(a, b, what):
    assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), what
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert a.tobytes() == b.tobytes(), f"{what} differ:\n{a}\n{b}"


def assert_same_info(ri, li, where):
    assert ri.keys() == li.keys(), f"info keys differ {where}: {sorted(ri)} vs {sorted(li)}"
    env_fields = set(li) - {"envd_episode", "_envd_episode", "final_obs", "_final_obs", "final_info",
                            "_final_info"}
    for name in env_fields:  # the env's own info fields (e.g. ConnectFour's action_mask)
        assert_same_array(ri[name], li[name], f"info[{name!r}] {where}")
    if "envd_episode" in li:
        assert ri["envd_episode"].keys() == li["envd_episode"].keys() == {"r", "l", "t"}
        # t is wall time; r and l are bit-equal.  Only ended episodes are meaningful.
        for key in "rl":
            assert_same_array(ri["envd_episode"][key], li["envd_episode"][key], f"episode[{key!r}] {where}")
        assert_same_array(ri["_envd_episode"], li["_envd_episode"], f"_episode {where}")
    if "final_obs" in li:
        assert_same_array(ri["_final_obs"], li["_final_obs"], f"_final_obs {where}")
        assert_same_array(ri["_final_info"], li["_final_info"], f"_final_info {where}")
        assert ri["final_info"] == li["final_info"] == {}
        assert ri["final_obs"].dtype == li["final_obs"].dtype == object
        for i, (a, b) in enumerate(zip(ri["final_obs"], li["final_obs"], strict=True)):
            if b is None:
                assert a is None, f"final_obs[{i}] {where}"
            else:
                assert_same_array(a, b, f"final_obs[{i}] {where}")


def assert_same_step(remote_result, local_result, where):
    names = ("observations", "rewards", "terminations", "truncations")
    for name, a, b in zip(names, remote_result[:4], local_result[:4]):
        assert_same_array(a, b, f"{name} {where}")
    assert_same_info(remote_result[4], local_result[4], where)
    done = local_result[2] | local_result[3]
    if "envd_episode" in local_result[4]:
        np.testing.assert_array_equal(local_result[4]["_envd_episode"], done)
    else:
        assert not done.any(), where


def run_steps(remote, local, steps, rng, where="", reset_done=False):
    """Step both with the same random actions; returns the number of ended episodes.
    reset_done: reset the envs that ended with a reset_mask (disabled mode)."""
    episodes = 0
    for step in range(steps):
        actions = random_actions(local.single_action_space, local.num_envs, rng)
        local_result = local.step(actions)
        remote_result = remote.step(actions)
        assert_same_step(remote_result, local_result, f"{where} step {step}")
        done = local_result[2] | local_result[3]
        episodes += int(done.sum())
        if reset_done and done.any():
            mask = done.copy()
            r_obs, r_info = remote.reset(options={"reset_mask": mask})
            l_obs, l_info = local.reset(options={"reset_mask": mask})
            assert_same_array(r_obs, l_obs, f"masked reset obs {where} step {step}")
            assert_same_info(r_info, l_info, f"masked reset {where} step {step}")
    return episodes


def assert_same_error(call, client, exc_type):
    """call(make) raises exc_type with the same message for make=envd.make and
    make=client.make; returns the message."""
    messages = []
    for maker in (envd.make, client.make):
        with pytest.raises(envd.EnvdError) as info:
            call(maker)
        assert type(info.value) is exc_type, (maker, repr(info.value))
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    return messages[0]


# ---- trajectories -------------------------------------------------------------------------
#: Time limits short enough for every env to end episodes within STEPS
#: (None: the registered limit; CartPole, Snake and ConnectFour end early under
#: random actions).
TIME_LIMITS = {"CartPole-v1": None, "Pendulum-v1": 60, "MountainCar-v0": 70,
               "MountainCarContinuous-v0": 80, "Acrobot-v1": 90, "Snake-v0": None,
               "ConnectFour-v0": None, "simple_spread_v3": None,
               "simple_spread_continuous_v3": None}
STEPS = 240


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
def test_trajectories_bit_identical_to_in_process(client, env_id, mode):
    num_envs, seed = 6, 17
    remote, local = make_pair(client, env_id, num_envs, seed=seed, autoreset_mode=mode,
                              max_episode_steps=TIME_LIMITS[env_id])
    with remote, local:
        assert isinstance(remote, envd.RemoteVecEnv)
        r_obs, r_info = remote.reset()
        l_obs, l_info = local.reset()
        assert_same_array(r_obs, l_obs, "first reset")
        assert_same_info(r_info, l_info, "first reset")
        rng = np.random.default_rng(seed)
        episodes = run_steps(remote, local, STEPS, rng, f"{env_id} {mode}",
                             reset_done=mode == "disabled")
        assert episodes >= num_envs, "the run must cross episode ends"


def test_disabled_mode_without_reset_fails_alike(client):
    """Stepping an env that ended without resetting it is the same EnvStateError."""
    remote, local = make_pair(client, "CartPole-v1", 3, seed=4, autoreset_mode="disabled",
                              max_episode_steps=5)
    with remote, local:
        remote.reset(), local.reset()
        actions = np.zeros(3, np.int64)
        for step in range(5):
            assert_same_step(remote.step(actions), local.step(actions), f"step {step}")
        assert local._dones.all()
        messages = []
        for env in (local, remote):
            with pytest.raises(envd.EnvStateError) as info:
                env.step(actions)
            messages.append(str(info.value))
        assert messages[0] == messages[1]
        assert "disabled" in messages[0]
        mask = np.array([True, False, True])
        assert_same_array(remote.reset(options={"reset_mask": mask})[0],
                          local.reset(options={"reset_mask": mask})[0], "masked reset")
        for env in (local, remote):  # env 1 is still done
            with pytest.raises(envd.EnvStateError, match="env 1 is done"):
                env.step(actions)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_reset_seeds_and_reseeding_mid_run(client, env_id):
    num_envs = 5
    remote, local = make_pair(client, env_id, num_envs, seed=3)  # the make seed is overridden
    with remote, local:
        rng = np.random.default_rng(1)
        assert_same_array(remote.reset(seed=123)[0], local.reset(seed=123)[0], "reset(seed=int)")
        run_steps(remote, local, 40, rng, "after int seed")
        seeds = [9, 2**64 - 1, 0, 9, 2**40 + 7]
        assert_same_array(remote.reset(seed=seeds)[0], local.reset(seed=seeds)[0],
                          "reset(seed=list)")
        run_steps(remote, local, 40, rng, "after list seed")
        array_seeds = np.array([5, 6, 7, 8, 2**63], np.uint64)
        assert_same_array(remote.reset(seed=array_seeds)[0], local.reset(seed=array_seeds)[0],
                          "reset(seed=ndarray)")
        # without a seed, every env continues its own generator
        assert_same_array(remote.reset()[0], local.reset()[0], "reset()")
        run_steps(remote, local, 40, rng, "after reset()")
        mask = np.array([False, True, False, False, True])
        assert_same_array(remote.reset(seed=77, options={"reset_mask": mask})[0],
                          local.reset(seed=77, options={"reset_mask": mask})[0],
                          "reset(seed, reset_mask)")
        run_steps(remote, local, 40, rng, "after masked reseed")

    # the same seed gives the same trajectory; another seed another one
    def first_obs(seed):
        with client.make(env_id, num_envs) as env:
            return env.reset(seed=seed)[0].copy()
    assert first_obs(123).tobytes() == first_obs(123).tobytes()
    assert first_obs(123).tobytes() != first_obs(124).tobytes()


def test_make_seed_int_and_list(client):
    """The make seed is used at the first reset without a seed."""
    for seed in (0, 2**64 - 4, [4, 4, 1, 2**63]):
        remote, local = make_pair(client, "Acrobot-v1", 4, seed=seed)
        with remote, local:
            assert_same_array(remote.reset()[0], local.reset()[0], f"make seed {seed}")
            run_steps(remote, local, 20, np.random.default_rng(0), f"make seed {seed}")


@pytest.mark.parametrize("env_id,kwargs,changes_trajectory", [
    ("CartPole-v1", {"sutton_barto_reward": True}, True),
    ("Pendulum-v1", {"g": 3.5}, True),
    ("MountainCar-v0", {"goal_velocity": 0.25}, False),
    ("MountainCarContinuous-v0", {"goal_velocity": -0.5}, False),
])
def test_env_kwargs(client, env_id, kwargs, changes_trajectory):
    spec = envd.native.get_spec(env_id)
    for name, value in kwargs.items():
        (param,) = [p for p in spec.params if p.name == name]
        assert value != param.default
    described = {e["id"]: e for e in client.describe_envs()}
    assert list(described) == envd.list_envs() == client.list_envs()
    assert [(p["name"], p["type"], p["default"]) for p in described[env_id]["params"]] == \
        [(p.name, p.type, p.default) for p in spec.params]
    remote, local = make_pair(client, env_id, 4, seed=8, max_episode_steps=50, **kwargs)
    with remote, local:
        assert_same_array(remote.reset()[0], local.reset()[0], "reset")
        digest_remote = []
        rng = np.random.default_rng(2)
        for step in range(120):
            actions = random_actions(local.single_action_space, 4, rng)
            result = remote.step(actions)
            assert_same_step(result, local.step(actions), f"step {step}")
            digest_remote.append(result[0].tobytes() + result[1].tobytes())
    if changes_trajectory:  # the parameter reached the daemon's envs
        with client.make(env_id, 4, seed=8, max_episode_steps=50) as default:
            default.reset()
            rng = np.random.default_rng(2)
            digest_default = []
            for _ in range(120):
                result = default.step(random_actions(default.single_action_space, 4, rng))
                digest_default.append(result[0].tobytes() + result[1].tobytes())
        assert digest_default != digest_remote


@pytest.mark.parametrize("mode", MODES)
def test_max_episode_steps_override(client, mode):
    limit = 37
    remote, local = make_pair(client, "Pendulum-v1", 3, seed=1, max_episode_steps=limit,
                              autoreset_mode=mode)
    with remote, local:
        assert remote.max_episode_steps == local.max_episode_steps == limit
        remote.reset(), local.reset()
        rng = np.random.default_rng(5)
        for step in range(1, limit + 1):
            actions = random_actions(local.single_action_space, 3, rng)
            result = remote.step(actions)
            assert_same_step(result, local.step(actions), f"step {step}")
            if step < limit:
                assert not result[3].any(), step
            else:
                assert result[3].all()
        assert result[4]["envd_episode"]["l"].tolist() == [limit] * 3
        if mode == "disabled":
            mask = np.ones(3, bool)
            assert_same_array(remote.reset(options={"reset_mask": mask})[0],
                              local.reset(options={"reset_mask": mask})[0], "reset")
        run_steps(remote, local, limit + 5, rng, "second episode", reset_done=mode == "disabled")
    # 0 means no limit: Pendulum runs past its registered 200 steps
    remote, local = make_pair(client, "Pendulum-v1", 2, seed=1, max_episode_steps=0,
                              autoreset_mode=mode)
    with remote, local:
        assert remote.max_episode_steps is local.max_episode_steps is None
        remote.reset(), local.reset()
        assert run_steps(remote, local, 230, np.random.default_rng(0), "no limit") == 0
    # the registered limit by default
    with client.make("Pendulum-v1", 2) as env, envd.make("Pendulum-v1", 2, num_threads=0) as loc:
        assert env.max_episode_steps == loc.max_episode_steps == 200


def test_episode_statistics_off(client):
    remote, local = make_pair(client, "CartPole-v1", 4, seed=2, episode_statistics=False,
                              autoreset_mode="same_step")
    with remote, local:
        remote.reset(), local.reset()
        rng = np.random.default_rng(3)
        for step in range(80):
            actions = random_actions(local.single_action_space, 4, rng)
            result = remote.step(actions)
            expected = local.step(actions)
            assert "envd_episode" not in result[4] and "_envd_episode" not in result[4]
            for a, b in zip(result[:4], expected[:4]):
                assert_same_array(a, b, f"step {step}")
            assert_same_info(result[4], expected[4], f"step {step}")


# ---- spaces ---------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
def test_spaces_and_attributes_match(client, env_id):
    for mode in MODES:
        remote, local = make_pair(client, env_id, 3, autoreset_mode=mode)
        with remote, local:
            assert remote.single_observation_space == local.single_observation_space
            assert remote.single_action_space == local.single_action_space
            assert remote.observation_space == local.observation_space
            assert remote.action_space == local.action_space
            for a, b in ((remote.single_observation_space, local.single_observation_space),
                         (remote.single_action_space, local.single_action_space)):
                assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                if hasattr(b, "low"):  # exact bounds, not just allclose
                    assert a.low.tobytes() == b.low.tobytes()
                    assert a.high.tobytes() == b.high.tobytes()
                else:
                    assert (a.n, a.start) == (b.n, b.start)
            assert remote.metadata["autoreset_mode"] is local.metadata["autoreset_mode"] \
                is AutoresetMode[mode.upper()]
            assert remote.num_agents == local.num_agents == envd.native.get_spec(env_id).num_agents
            assert remote.num_envs == local.num_envs == 3 * local.num_agents  # (rows)
            assert remote.num_env_instances == local.num_env_instances == 3
            assert remote.env_id == local.env_id == env_id
            assert remote.max_episode_steps == local.max_episode_steps
            assert remote.render_mode is local.render_mode is None


# ---- views and copies -----------------------------------------------------------------------
def test_default_results_are_views_overwritten_by_the_next_step(client, daemon):
    remote, local = make_pair(client, "CartPole-v1", 4, seed=0, max_episode_steps=1,
                              autoreset_mode="same_step")
    with remote, local:
        assert len(segments_of(daemon.pid)) >= 1
        for env in (remote, local):
            obs0, _ = env.reset()
            first = env.step(np.ones(4, np.int64))
            snapshot = [a.copy() for a in first[:4]]
            episode_r = first[4]["envd_episode"]["r"]
            second = env.step(np.zeros(4, np.int64))
            for a, b in zip(first[:4], second[:4]):
                assert a is b and np.shares_memory(a, b)
            assert np.shares_memory(obs0, first[0])
            # the first step's arrays now hold the second step's results
            assert first[0].tobytes() == second[0].tobytes() != snapshot[0].tobytes()
            assert np.shares_memory(episode_r, second[4]["envd_episode"]["r"])
            assert np.shares_memory(first[4]["_envd_episode"], second[4]["_envd_episode"])
        # the remote arrays are views of the session's shared-memory mapping
        base = remote.step(np.zeros(4, np.int64))[0]
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        assert isinstance(base, mmap.mmap)


def test_copy_true_results_do_not_share_memory(client):
    remote, local = make_pair(client, "CartPole-v1", 4, seed=0, max_episode_steps=1, copy=True,
                              autoreset_mode="same_step")
    with remote, local:
        for env in (remote, local):
            obs0, _ = env.reset()
            first = env.step(np.ones(4, np.int64))
            snapshot = [a.copy() for a in first[:4]]
            info_snapshot = first[4]["envd_episode"]["r"].copy(), first[4]["envd_episode"]["l"].copy()
            second = env.step(np.zeros(4, np.int64))
            assert not np.shares_memory(obs0, first[0])
            for a, b, old in zip(first[:4], second[:4], snapshot):
                assert a is not b and not np.shares_memory(a, b)
                assert a.tobytes() == old.tobytes()  # kept
            assert first[0].tobytes() != second[0].tobytes()
            for key in "rlt":
                assert not np.shares_memory(first[4]["envd_episode"][key], second[4]["envd_episode"][key])
            assert not np.shares_memory(first[4]["_envd_episode"], second[4]["_envd_episode"])
            assert first[4]["envd_episode"]["r"].tobytes() == info_snapshot[0].tobytes()
            assert first[4]["envd_episode"]["l"].tobytes() == info_snapshot[1].tobytes()
            for a, b in zip(first[4]["final_obs"], second[4]["final_obs"]):
                assert not np.shares_memory(a, b)
        # and the copies are bit-identical between remote and in-process
        remote.reset(seed=5), local.reset(seed=5)
        run_steps(remote, local, 30, np.random.default_rng(0), "copy=True")


# ---- errors ---------------------------------------------------------------------------------
def _made(maker, *args, reset=True, **kwargs):
    env = maker(*args, **kwargs)
    if reset:
        env.reset()
    return env


def test_action_errors_match(client):
    envs = []

    def make(maker, env_id, reset=True, **kwargs):
        if maker == envd.make:
            kwargs["num_threads"] = 0
        env = _made(maker, env_id, 4, seed=0, reset=reset, **kwargs)
        envs.append(env)
        return env

    try:
        cases = [
            ("CartPole-v1", np.zeros(5, np.int64), envd.InvalidActionError),   # shape
            ("CartPole-v1", np.zeros((4, 1), np.int64), envd.InvalidActionError),
            ("CartPole-v1", np.zeros(4, np.float32), envd.InvalidActionError),  # dtype
            ("CartPole-v1", np.array([0, 1, 2, 0]), envd.InvalidActionError),   # range
            ("CartPole-v1", np.array([0, -1, 1, 0]), envd.InvalidActionError),
            ("CartPole-v1", np.array([0, 1, 2**40, 0], np.uint64), envd.InvalidActionError),
            ("Acrobot-v1", [0, 1, 3, 2], envd.InvalidActionError),
            ("Pendulum-v1", np.zeros((4,), np.float32), envd.InvalidActionError),
            ("Pendulum-v1", np.zeros((4, 1), np.float64), envd.InvalidActionError),
            ("Pendulum-v1", np.zeros((4, 1), np.complex64), envd.InvalidActionError),
            ("MountainCarContinuous-v0", "left", envd.InvalidActionError),
        ]
        for env_id, actions, exc_type in cases:
            message = assert_same_error(
                lambda m, env_id=env_id, actions=actions: make(m, env_id).step(actions),
                client, exc_type)
            assert env_id in message
        range_message = assert_same_error(
            lambda m: make(m, "CartPole-v1").step(np.array([0, 1, 2, 0])), client,
            envd.InvalidActionError)
        assert "action 2 of env 2 is out of range" in range_message
        # before any reset
        message = assert_same_error(
            lambda m: make(m, "CartPole-v1", reset=False).step(np.zeros(4, np.int64)), client,
            envd.EnvStateError)
        assert "never reset" in message
        # after an action error, both envs go on alike
        remote, local = make(client.make, "Acrobot-v1"), make(envd.make, "Acrobot-v1")
        for env in (remote, local):
            with pytest.raises(envd.InvalidActionError):
                env.step(np.array([0, 1, 7, 2]))
        run_steps(remote, local, 20, np.random.default_rng(0), "after an action error")
        # Python lists and safe casts are accepted alike
        remote, local = make(client.make, "Pendulum-v1"), make(envd.make, "Pendulum-v1")
        for actions in ([[0.5], [-3.0], [1], [2.5]], np.ones((4, 1), np.float16),
                        np.ones((4, 1), np.int8)):
            assert_same_step(remote.step(actions), local.step(actions), repr(actions))
    finally:
        for env in envs:
            env.close()


BAD_MAKES = {
    "unknown env": (lambda m: m("NoSuchEnv-v0", 2), envd.UnknownEnvError),
    "unknown env, case": (lambda m: m("cartpole-v1", 2), envd.UnknownEnvError),
    "unknown kwarg": (lambda m: m("CartPole-v1", 2, gravity=1.0), envd.InvalidArgumentError),
    "kwarg on an env without params": (lambda m: m("Acrobot-v1", 2, g=1.0), envd.InvalidArgumentError),
    "kwarg type": (lambda m: m("CartPole-v1", 2, sutton_barto_reward=1), envd.InvalidArgumentError),
    "kwarg type str": (lambda m: m("Pendulum-v1", 2, g="9.8"), envd.InvalidArgumentError),
    "kwarg range": (lambda m: m("Pendulum-v1", 2, g=-1.0), envd.InvalidArgumentError),
    "kwarg nan": (lambda m: m("MountainCar-v0", 2, goal_velocity=float("nan")), envd.InvalidArgumentError),
    "kwarg list": (lambda m: m("CartPole-v1", 2, sutton_barto_reward=[True]), envd.InvalidArgumentError),
    "seed negative": (lambda m: m("CartPole-v1", 2, seed=-1), envd.InvalidArgumentError),
    "seed overflow": (lambda m: m("CartPole-v1", 4, seed=2**64 - 3), envd.InvalidArgumentError),
    "seed float": (lambda m: m("CartPole-v1", 2, seed=1.5), envd.InvalidArgumentError),
    "seed str": (lambda m: m("CartPole-v1", 2, seed="7"), envd.InvalidArgumentError),
    "seed list length": (lambda m: m("CartPole-v1", 3, seed=[1, 2]), envd.InvalidArgumentError),
    "seed list negative": (lambda m: m("CartPole-v1", 2, seed=[1, -2]), envd.InvalidArgumentError),
    "seed list float": (lambda m: m("CartPole-v1", 2, seed=[1, 2.0]), envd.InvalidArgumentError),
    "max_episode_steps negative": (lambda m: m("CartPole-v1", 2, max_episode_steps=-1), envd.InvalidArgumentError),
    "max_episode_steps float": (lambda m: m("CartPole-v1", 2, max_episode_steps=2.5), envd.InvalidArgumentError),
    "num_envs zero": (lambda m: m("CartPole-v1", 0), envd.InvalidArgumentError),
    "num_envs float": (lambda m: m("CartPole-v1", 2.0), envd.InvalidArgumentError),
    "autoreset_mode": (lambda m: m("CartPole-v1", 2, autoreset_mode="sometimes"), envd.InvalidArgumentError),
}


BAD_MAKES.update({  # arguments msgpack would change or cannot carry
    "env_id not a str": (lambda m: m(5, 2), envd.InvalidArgumentError),
    "seed beyond 2**64": (lambda m: m("CartPole-v1", 2, seed=2**64), envd.InvalidArgumentError),
    "seed list beyond 2**64": (lambda m: m("CartPole-v1", 2, seed=[1, 2**64]), envd.InvalidArgumentError),
    "seed bool": (lambda m: m("CartPole-v1", 2, seed=True), envd.InvalidArgumentError),
    "max_episode_steps bool": (lambda m: m("CartPole-v1", 2, max_episode_steps=True),
                               envd.InvalidArgumentError),
})


@pytest.mark.parametrize("case", BAD_MAKES)
def test_make_errors_match(client, case):
    call, exc_type = BAD_MAKES[case]
    assert_same_error(call, client, exc_type)


def test_a_kwarg_msgpack_cannot_carry_is_refused_with_the_same_class(client):
    # An int beyond 64 bits cannot cross the wire: the client refuses it
    # itself, with its own message (in-process says "out of range").
    for make in (envd.make, client.make):
        with pytest.raises(envd.InvalidArgumentError, match="g"):
            make("Pendulum-v1", 2, g=10**30)


def test_reset_errors_match(client):
    remote, local = make_pair(client, "MountainCar-v0", 3, seed=0)
    with remote, local:
        cases = [
            ({"seed": -1}, envd.InvalidArgumentError),
            ({"seed": [1, 2]}, envd.InvalidArgumentError),
            ({"seed": 2**64 - 2}, envd.InvalidArgumentError),
            ({"seed": 0.5}, envd.InvalidArgumentError),
            ({"options": {"reset_mask": np.zeros(3, bool)}}, envd.InvalidArgumentError),
            ({"options": {"reset_mask": [True, True, True]}}, envd.InvalidArgumentError),
            ({"options": {"reset_mask": np.ones(4, bool)}}, envd.InvalidArgumentError),
            ({"options": {"other": 1}}, envd.InvalidArgumentError),
            ({"options": "x"}, envd.InvalidArgumentError),
        ]
        for kwargs, exc_type in cases:
            messages = []
            for env in (local, remote):
                with pytest.raises(exc_type) as info:
                    env.reset(**kwargs)
                messages.append(str(info.value))
            assert messages[0] == messages[1], kwargs
        # nothing was reset or reseeded by the failed calls
        assert_same_array(remote.reset()[0], local.reset()[0], "reset after errors")


def test_closed_env_raises_env_state_error(client, daemon):
    remote, local = make_pair(client, "Pendulum-v1", 2, seed=0)
    remote.reset(), local.reset()
    session = remote.session
    segment = remote._segment.name
    assert segment in segments_of(daemon.pid)
    remote.close(), local.close()
    assert segment not in segments_of(daemon.pid)  # the close reply comes after the unlink
    remote.close(), local.close()  # idempotent
    assert remote.closed and local.closed
    for call in (lambda env: env.step(np.zeros((2, 1), np.float32)), lambda env: env.reset(),
                 lambda env: env.reset(seed=1)):
        messages = []
        for env in (local, remote):
            with pytest.raises(envd.EnvStateError) as info:
                call(env)
            messages.append(str(info.value))
        assert messages[0] == messages[1] == "this Pendulum-v1 VecEnv is closed"
    # the daemon freed the session: its id is unknown now
    with pytest.raises(envd.UnknownSessionError):
        client.channel.request({"type": "step", "session": session})
