"""The one Python mirror of the per-env refusals (client/multi.py's
_needs_reset and _validate_step, the multi-daemon pre-check) refuses exactly
what the C rules refuse (env_slot.h's envd_slot_next, through the pool vec)
(issue 39): over the same random sequences of masked resets and steps, with
actions now and then out of range, in every autoreset mode, a MultiVecEnv
over two daemons and the in-process env raise the same error naming the same
env, or neither does; and a refused step steps nothing on any daemon (the
results stay bit-identical).  A time limit of 4 steps ends every episode
(CartPole cannot fall within 4 steps), so envs are done, reset, never reset
or stepping in every mix."""
from __future__ import annotations

import numpy as np
import pytest
from support.daemon import daemon_group

import envd

NUM_ENVS = 5  # 2 + 3 over the two daemons
OPERATIONS = 60
MODES = ["next_step", "same_step", "disabled"]
RESULT_NAMES = ("observations", "rewards", "terminations", "truncations")


@pytest.fixture(scope="module")
def multi_client(tmp_path_factory):
    """A MultiClient over two daemons of one thread each."""
    folder = tmp_path_factory.mktemp("mirror")
    flags = ("--threads", "1", "--lease-timeout", "10")
    with daemon_group(folder, flags, flags) as procs:
        client = envd.connect([proc.endpoint for proc in procs], timeout=30)
        try:
            yield client
        finally:
            client.close()


def outcome(call):
    """("ok", call()'s arrays) or (the error's type, its message without the env id)."""
    try:
        result = call()
    except envd.EnvdError as exc:
        return type(exc), str(exc).split(": ", 1)[1]
    arrays = result[:-1]  # (the info dict: its episode times are wall clock)
    return "ok", [np.asarray(a) for a in arrays]


def assert_same(got, expected, where):
    assert got[0] == expected[0], f"{where}: {got} vs {expected}"
    if got[0] == "ok":
        for a, b, name in zip(got[1], expected[1], RESULT_NAMES):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"{where}: {name} {a} vs {b}"
    else:
        assert got[1] == expected[1], where


def operations(rng: np.random.Generator):
    """A step before any reset, a reset of env 0 alone, a step with env 0's
    action out of range (named before env 1, never reset: each env's state,
    then its action, env by env), then OPERATIONS random operations:
    ("reset", a mask with at least one True) or ("step", actions 0 or 1, now
    and then a 2, which is out of range)."""
    yield "step", np.zeros(NUM_ENVS, np.int64)
    yield "reset", np.arange(NUM_ENVS) == 0
    yield "step", np.where(np.arange(NUM_ENVS) == 0, 2, 0)
    for _ in range(OPERATIONS):
        if rng.random() < 0.25:
            mask = rng.random(NUM_ENVS) < 0.5
            mask[rng.integers(NUM_ENVS)] = True
            yield "reset", mask
        else:
            actions = rng.integers(0, 2, NUM_ENVS)
            if rng.random() < 0.15:
                actions[rng.integers(NUM_ENVS)] = 2
            yield "step", actions


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sequence", range(3))
def test_mirror_refuses_what_the_c_rules_refuse(multi_client, mode, sequence):
    kwargs = {"seed": 0, "autoreset_mode": mode, "max_episode_steps": 4}
    local = envd.make("CartPole-v1", NUM_ENVS, **kwargs)
    multi = multi_client.make("CartPole-v1", NUM_ENVS, **kwargs)
    refused = {"state": 0, "range": 0}
    try:
        for k, (op, value) in enumerate(operations(np.random.default_rng(sequence))):
            where = f"{mode}, sequence {sequence}, operation {k} ({op} {value})"
            if op == "reset":
                calls = [lambda env=env: env.reset(options={"reset_mask": value})
                         for env in (local, multi)]
            else:
                calls = [lambda env=env: env.step(value) for env in (local, multi)]
            expected, got = (outcome(call) for call in calls)
            assert_same(got, expected, where)
            if expected[0] is envd.EnvStateError:
                refused["state"] += 1
            elif expected[0] is envd.InvalidActionError:
                refused["range"] += 1
    finally:
        local.close()
        multi.close()
    # (the sequences reach both kinds of refusal: the comparison is not vacuous)
    assert refused["state"] > 0 and refused["range"] > 0, refused
