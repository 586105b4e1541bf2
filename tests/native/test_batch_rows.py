"""native/src/batch_rows.c through envd.native.batch_rows: the in-process
env's send-id check and recv gather agree with the numpy ones they replace."""
import numpy as np
import pytest

import envd
from envd.errors import InvalidArgumentError
from envd.native.batch_rows import IdChecker, row_copier
from envd.vector_base import BatchedVecEnv


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                   "int64", "uint64"])
def test_ids_of_every_integer_dtype_become_int64(dtype):
    ids = np.array([5, 0, 99, 3], dtype)
    out = IdChecker(100).check(ids)
    assert out.dtype == np.int64 and out.tolist() == [5, 0, 99, 3]


def test_ids_out_of_range_or_repeated_are_refused():
    checker = IdChecker(10)
    assert checker.check(np.array([1, 10])) is None
    assert checker.check(np.array([-1, 2])) is None
    assert checker.check(np.array([2**64 - 1], np.uint64)) is None  # (reads negative)
    assert checker.check(np.array([3, 4, 3])) is None
    # each check starts afresh: the ids of a refused or earlier check are no repeats
    assert checker.check(np.array([3, 4])).tolist() == [3, 4]
    assert checker.check(np.array([4, 3])).tolist() == [4, 3]


def test_strided_ids_are_read_and_foreign_byte_order_is_left_to_numpy():
    checker = IdChecker(10)
    assert checker.check(np.arange(10)[::3]).tolist() == [0, 3, 6, 9]
    assert checker.check(np.array([1, 2], ">i4")) is None


@pytest.mark.parametrize("shape,dtype", [((), np.bool_), ((), np.int16), ((), np.float32),
                                         ((), np.float64), ((3,), np.float32),
                                         ((6, 7), np.int8)])
def test_gather_equals_numpy_take(shape, dtype):
    rng = np.random.default_rng(0)
    buffers = [rng.integers(0, 100, (50, *shape)).astype(dtype),
               rng.normal(size=(50, 4)).astype(np.float32)]
    slots = [np.empty((20, *b.shape[1:]), b.dtype) for b in buffers]
    rows = rng.permutation(50)[:20].astype(np.int64)
    row_copier(list(zip(buffers, slots)))(rows)
    for buffer, slot in zip(buffers, slots):
        np.testing.assert_array_equal(slot, buffer[rows])


def test_gather_declines_arrays_not_contiguous():
    buffer = np.zeros((10, 4), np.float32)
    assert row_copier([(buffer[:, :2], np.empty((3, 2), np.float32))]) is None
    assert row_copier([])(np.arange(3, dtype=np.int64)) is None


@pytest.mark.parametrize("env_id,mode", [("CartPole-v1", "next_step"),
                                         ("Acrobot-v1", "same_step")])
def test_recv_and_send_match_the_numpy_paths(env_id, mode, monkeypatch):
    """The same async run twice, the second with BatchedVecEnv's numpy
    hooks: every batch equal (episodes end in it, so the on-done copies run)."""
    def run():
        batches = []
        with envd.make(env_id, 16, seed=3, batch_size=8, autoreset_mode=mode,
                       max_episode_steps=5, num_threads=0) as env:
            env.async_reset()
            actions = np.ones(8, env.single_action_space.dtype)
            for _ in range(12):
                obs, rew, term, trunc, info = env.recv()
                batches.append((obs.copy(), rew.copy(), term.copy(), trunc.copy(),
                                info["env_id"].copy(), sorted(info)))
                env.send(actions, info["env_id"])
        return batches

    native = run()
    monkeypatch.setattr(envd.native.vector_env.VecEnv, "_checked_ids",
                        BatchedVecEnv._checked_ids)
    monkeypatch.setattr(envd.native.vector_env.VecEnv, "_row_copier",
                        BatchedVecEnv._row_copier)
    numpy_path = run()
    assert any("envd_episode" in batch[5] for batch in native)
    for a, b in zip(native, numpy_path, strict=True):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_bad_send_ids_raise_the_numpy_messages():
    with envd.make("CartPole-v1", 8, seed=0, batch_size=4, num_threads=0) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        actions = np.zeros(4, np.int64)
        with pytest.raises(InvalidArgumentError, match="repeated ids"):
            env.send(actions, np.array([ids[0], ids[0], ids[1], ids[2]]))
        with pytest.raises(InvalidArgumentError, match=r"must be in \[0, 8\), got 8"):
            env.send(actions, np.array([ids[0], 8, ids[1], ids[2]]))
        env.send(actions, ids)  # nothing was sent by the refused calls
