"""native/src/batch_rows.c through envd.native.batch_rows: the in-process
env's send-id check and recv gather agree with the numpy ones they replace."""
from pathlib import Path

import numpy as np
import pytest
from cbuild import run_stress

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
    assert row_copier([(np.zeros((10, 2), np.float32), buffer[:3, :2])]) is None
    # no pairs: a copier all the same (None would send the caller to numpy)
    assert callable(row_copier([]))


def _unaligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of array that starts one byte past an aligned
    address (as np.frombuffer(..., offset=1) gives)."""
    raw = np.zeros(array.nbytes + 1, np.uint8)
    out = np.frombuffer(raw.data, array.dtype, count=array.size, offset=1).reshape(array.shape)
    out[...] = array
    assert out.flags.c_contiguous and (out.itemsize == 1 or not out.flags.aligned)
    return out


@pytest.mark.parametrize("dtype", ["int16", "uint32", "int64"])
def test_unaligned_ids_are_read(dtype):
    ids = _unaligned(np.array([7, 0, 3], dtype))
    assert IdChecker(10).check(ids).tolist() == [7, 0, 3]


@pytest.mark.parametrize("dtype", [np.int16, np.float32, np.float64])
def test_gather_of_unaligned_buffers_and_rows_equals_numpy_take(dtype):
    rng = np.random.default_rng(1)
    buffer = _unaligned(rng.normal(size=(30,)).astype(dtype))
    slot = _unaligned(np.zeros(12, dtype))
    rows = rng.permutation(30)[:12].astype(np.int64)
    copier = row_copier([(buffer, slot)])
    copier(rows)
    np.testing.assert_array_equal(slot, buffer[rows])
    copier(_unaligned(rows[::-1].copy()))  # (rows the native copy does not read: numpy's)
    np.testing.assert_array_equal(slot, buffer[rows[::-1]])


def test_gather_of_more_rows_than_the_slot_raises_and_writes_nothing_past_it():
    buffer = np.arange(10, dtype=np.float64)
    memory = np.full(8, -1.0)
    slot = memory[:3]  # (the rest of memory: what a copy past the slot would hit)
    copier = row_copier([(buffer, slot)])
    with pytest.raises(ValueError):
        copier(np.arange(5, dtype=np.int64))
    assert memory[3:].tolist() == [-1.0] * 5
    copier(np.array([9, 8, 7], np.int64))
    assert memory.tolist() == [9, 8, 7] + [-1.0] * 5


def test_gather_rows_not_int64_or_not_contiguous_are_copied_as_numpy_does():
    buffer = np.arange(20, dtype=np.int32).reshape(10, 2)
    slot = np.zeros((3, 2), np.int32)
    copier = row_copier([(buffer, slot)])
    copier(np.array([4, 1, 6], np.int32))
    np.testing.assert_array_equal(slot, buffer[[4, 1, 6]])
    copier(np.arange(9, dtype=np.int64)[::3])
    np.testing.assert_array_equal(slot, buffer[[0, 3, 6]])


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


@pytest.mark.parametrize("kind", ["plain", "asan"])
def test_batch_rows_c_under_sanitizers(kind):
    """batch_rows.c on its own (tests/native/batch_rows_check.c), plain and
    under AddressSanitizer + UBSan: ids and rows at unaligned addresses are
    read and written without undefined behaviour."""
    run_stress([Path(__file__).with_name("batch_rows_check.c"), "batch_rows.c"],
               "batch_rows_check", kind, 1, timeout=120)
