"""A HostedSession made with client buffers (the daemon's sessions): its
native backend copies the rows of each call between the client's buffers and
the private segment itself (backend_workers.h, "Leaves"), so every caller of
the session, the doorbell's thread included, sees the client's buffers only.
Driven in-process here, with plain numpy arrays standing in for the client's
shared memory."""
from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envd
from envd import protocol
from envd.native._envd_native import lib
from envd.native.hosted_env import DEFAULT_INFO_BYTES, hosted_buffer_layout
from envd.native.hosted_segment import Segment, segment_layout
from envd.native.hosted_session import HostedSession, HostedSpec, client_leaves
from envd.native.hosted_template import template

ENV_ID, NUM_ENVS = "CartPole-v1", 4


def make_session(num_workers: int, client: dict[str, np.ndarray] | None = None):
    """A hosted session of NUM_ENVS CartPoles and the client's buffers (the
    same layout as the segment's batch buffers, in private memory here)."""
    probe = gym.make(ENV_ID)
    spec = HostedSpec("py:" + ENV_ID, probe.observation_space, probe.action_space, 500)
    probe.close()
    mode = AutoresetMode.NEXT_STEP
    buffers = hosted_buffer_layout(spec.observation_space, spec.action_space, NUM_ENVS, mode,
                                   DEFAULT_INFO_BYTES)
    if client is None:
        client = {name: np.zeros(shape, dtype) for name, (shape, dtype) in buffers.items()}
    layout, size = segment_layout(NUM_ENVS, num_workers, buffers)
    segment, fd = Segment.create(layout, size)
    try:
        session = HostedSession(spec, NUM_ENVS, num_workers=num_workers, autoreset_mode=mode,
                                maker=("id", ENV_ID, None, {}), segment=segment, fd=fd,
                                template=template(), client_buffers=client)
    except BaseException:
        segment.close()
        raise
    finally:
        os.close(fd)
    return session, client


@pytest.mark.parametrize("num_workers", [1, 2])
def test_client_buffers_see_what_sync_vector_env_returns(num_workers):
    session, client = make_session(num_workers)
    ref = gym.make_vec(ENV_ID, NUM_ENVS, vectorization_mode="sync")
    try:
        client["reset_seeds"][...] = np.arange(NUM_ENVS) + 5
        session.seed()
        session.reset(True, False)
        assert np.array_equal(client["observations"], ref.reset(seed=5)[0])
        rng = np.random.default_rng(0)
        for _ in range(30):
            actions = rng.integers(0, 2, NUM_ENVS)
            client["actions"][...] = actions
            session.step()
            obs, rew, term, trunc, _ = ref.step(actions)
            assert np.array_equal(client["observations"], obs)
            assert client["rewards"].dtype == rew.dtype and np.array_equal(client["rewards"], rew)
            assert np.array_equal(client["terminations"], term)
            assert np.array_equal(client["truncations"], trunc)
    finally:
        session.close()
        ref.close()


def test_only_the_rows_of_the_envs_a_call_finished_are_written():
    """A batch of envs 1 and 3 writes their rows of every output array into
    the client's buffers and leaves the others' rows as they were; a masked
    reset writes the rows of the envs it reset only."""
    session, client = make_session(2)
    try:
        session.reset(False, False)
        for name in protocol.output_arrays(client):
            client[name][...] = 7  # the client scribbles over its own outputs
        client["actions"][...] = 1
        session.send(np.array([1, 3], np.int64))
        assert sorted(session.recv(2).tolist()) == [1, 3]
        for name in ("observations", "rewards"):
            assert (client[name][[0, 2]] == 7).all(), name
            assert not (client[name][[1, 3]] == 7).all(), name
        mask = np.array([True, False, False, False])
        client["reset_mask"][...] = mask
        session.reset(False, True)
        assert not (client["observations"][0] == 7).all()
        assert (client["observations"][2] == 7).all()
    finally:
        session.close()


def test_actions_are_copied_from_the_client_then_checked():
    """An action out of range in the client's buffer is refused naming its
    env (the check runs on the private copy of the client's row); the
    session goes on with the next valid actions."""
    session, client = make_session(1)
    try:
        session.reset(False, False)
        client["actions"][...] = [0, 1, 5, 0]
        with pytest.raises(envd.InvalidActionError, match="env 2"):
            session.step()
        client["actions"][...] = [0, 1, 1, 0]
        assert session.step() == 0
    finally:
        session.close()


def test_a_layout_mismatch_is_refused():
    good = make_session(1)
    good[0].close()
    client = dict(good[1])
    client["observations"] = np.zeros((NUM_ENVS, 3), np.float32)  # not the segment's shape
    with pytest.raises(RuntimeError, match="observations"):
        make_session(1, client)
    # the leaves name every array of the client's layout but the reset's inputs
    inputs, outputs = client_leaves(good[1], good[1], NUM_ENVS)
    assert len(inputs) == 1 and len(outputs) == len(protocol.output_arrays(good[1]))


def test_a_reset_mask_byte_other_than_0_or_1_selects_its_env():
    """The mask lies in the client's memory, where a byte may hold any value:
    the backend reads each as a byte (non-zero selects), never as a C bool
    (undefined for 2); the reset resets exactly the selected envs."""
    session, client = make_session(1)
    try:
        session.reset(False, False)
        client["actions"][...] = 1
        session.step()
        before = client["observations"].copy()
        client["reset_mask"].view(np.uint8)[...] = [2, 0, 255, 0]
        session.reset(False, True)
        assert int(lib.envd_session_reset_count(session.handle)) == 2
        for i in (0, 2):
            assert not np.array_equal(client["observations"][i], before[i]), i
        for i in (1, 3):
            assert np.array_equal(client["observations"][i], before[i]), i
    finally:
        session.close()


def test_only_the_used_bytes_of_an_info_slot_are_copied():
    """An env's info slot is copied only as far as its length (the backend
    reads it from the private segment): CartPole gives no info, so a step
    copies none of its slot's bytes into the client's buffer (what the
    client left there stays; it reads length bytes only), and the lengths
    themselves are copied."""
    session, client = make_session(2)
    try:
        session.reset(False, False)
        client["infos"][...] = 0xAA
        client["info_lengths"][...] = 99
        client["actions"][...] = 1
        session.step()
        assert (client["info_lengths"] == 0).all()
        assert (client["infos"] == 0xAA).all()
    finally:
        session.close()
