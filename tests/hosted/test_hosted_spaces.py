"""Spaces and infos of hosted Python envs beyond the equivalence runs: the
wire form of every space, the info codec, action range checks (from the
backend's private copy, naming the leaf), info limits, refused spaces and
batched action structure errors."""
from __future__ import annotations

import daemon_envs  # noqa: F401  (registers the envd-test/ ids)
import gymnasium
import msgpack
import numpy as np
import pytest
from envs import failing_creator
from gymnasium import spaces

import envd
from envd import info_codec, leaves
from envd.native._envd_native import ffi, lib

DICT_OBS = "py:daemon_envs:envd-test/DictObs-v0"
MULTI = "py:daemon_envs:envd-test/MultiDiscrete-v0"

NESTED = spaces.Dict({
    "a": spaces.Box(np.array([-1, -np.inf], np.float32), np.array([1, np.inf], np.float32)),
    "b": spaces.Tuple((spaces.Discrete(5, start=-3), spaces.MultiBinary((2, 3)),
                       spaces.Dict({"z": spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, -1],
                                                                                     [2, 3]],
                                                             dtype=np.int32)}))),
    "c": spaces.Box(-(2**40), 2**40, (2,), np.int64),
    "d": spaces.Box(0, 255, (1,), np.uint8)}, sort_keys=False)


def test_every_space_round_trips_through_msgpack_in_leaf_order():
    wire = msgpack.unpackb(msgpack.packb(leaves.space_to_wire(NESTED)), raw=False)
    back = leaves.space_from_wire(wire)
    assert back == NESTED
    assert [p for p, _ in leaves.leaves(back)] == [p for p, _ in leaves.leaves(NESTED)]
    assert back["c"].low.dtype == np.int64 and back["c"].high[0] == 2**40  # (exact, not float)


def test_unsorted_dict_keeps_its_order_and_packed_rows_view_each_leaf():
    space = spaces.Dict({"z": spaces.Discrete(3), "a": spaces.Box(0, 1, (3,), np.float32),
                         "m": spaces.MultiBinary(1)}, sort_keys=False)
    (width,), dtype = leaves.action_row(space)
    rows = np.zeros((4, width), dtype)
    z, a, m = leaves.leaf_views(space, rows)
    z[:] = [0, 1, 2, 1]
    a[:] = 0.5
    m[:, 0] = [1, 0, 1, 0]
    assert z.dtype == np.int64 and a.shape == (4, 3) and m.dtype == np.int8
    again = leaves.leaf_views(space, rows)  # the bytes hold them, nothing else
    assert again[0].tolist() == [0, 1, 2, 1] and (again[1] == 0.5).all()
    assert leaves.first_row_out_of_range(space, rows) == -1
    again[2][3, 0] = 2
    assert leaves.first_row_out_of_range(space, rows) == 3


def test_info_codec_keeps_types_dtypes_and_shapes():
    value = {"f": np.float32(1.5), "i": np.int16(-3), "b": np.bool_(True),
             "a": np.arange(6, dtype=np.uint16).reshape(2, 3), "t": (1, "x", None),
             "n": {"deep": [1.0, True, b"raw"]}, 7: "int key"}
    back = info_codec.decode(info_codec.encode(value))
    assert back.keys() == value.keys()
    for key in ("f", "i", "b"):
        assert type(back[key]) is type(value[key]) and back[key] == value[key]
    assert back["a"].dtype == np.uint16 and back["a"].shape == (2, 3)
    assert np.array_equal(back["a"], value["a"]) and back["a"].flags.writeable
    assert back["t"] == (1, "x", None) and back["n"] == value["n"] and back[7] == "int key"
    with pytest.raises(TypeError, match="builtins.object"):
        info_codec.encode({"x": object()})
    with pytest.raises(TypeError):
        info_codec.encode({"x": np.array([object()])})


def test_a_bounded_decode_refuses_deep_nesting_and_too_many_objects_before_building_them():
    import msgpack
    value = {"a": (1, (2, np.arange(3))), "b": [1, 2], "c": np.float32(2)}
    back = info_codec.decode(info_codec.encode(value), max_objects=32)
    assert back["a"][0] == 1 and back["a"][1][0] == 2 and back["c"] == value["c"]
    assert np.array_equal(back["a"][1][1], np.arange(3)) and back["b"] == [1, 2]
    inner = msgpack.packb([])
    for _ in range(info_codec.MAX_EXT_DEPTH + 1):  # one level too many
        inner = msgpack.packb(msgpack.ExtType(info_codec.EXT_TUPLE, inner))
    with pytest.raises(ValueError, match="deep"):
        info_codec.decode(inner, max_objects=1 << 16)
    assert info_codec.decode(inner) is not None  # (trusted bytes: no bound)
    with pytest.raises(ValueError, match="max_array_len"):  # refused before it is built
        info_codec.decode(bytes([0xdd]) + (10**9).to_bytes(4, "big"), max_objects=1 << 16)
    with pytest.raises(ValueError, match="too many objects"):
        info_codec.decode(msgpack.packb([[1] * 40] * 40), max_objects=1000)
    assert len(info_codec.decode(msgpack.packb([[1] * 40] * 20), max_objects=1000)) == 20


@pytest.mark.parametrize("num_workers", [0, 2])
def test_discrete_with_negative_start_refuses_a_huge_action(num_workers):
    """Discrete(3, start=-1): INT64_MAX is out of range (the check once
    computed action - start, which overflows and let it through)."""
    with envd.make(failing_creator(-1, 0), 2, seed=0, num_workers=num_workers) as env:
        env.reset()
        for bad in (2**63 - 1, -2, 2):
            with pytest.raises(envd.InvalidActionError, match=f"action {bad} of env 1"):
                env.step(np.array([0, bad], np.int64))
        obs = env.step(np.array([-1, 1], np.int64))[0]  # the env is still usable
        assert obs[:, 1].tolist() == [-1, 1]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_out_of_range_leaves_are_refused_naming_the_leaf(num_workers):
    with envd.make(MULTI, 3, seed=0, num_workers=num_workers) as env:
        env.reset()
        good = np.array([[-1, 0, 5]] * 3)
        env.step(good)
        bad = good.copy()
        bad[2, 1] = 4  # MultiDiscrete([3, 4, 2], start=[-1, 0, 5]): element 1 in 0..3
        with pytest.raises(envd.InvalidActionError, match=r"action\[1\] 4 of env 2 .*0\.\.3"):
            env.step(bad)
        env.step(good)
    with envd.make(DICT_OBS, 2, seed=0, num_workers=num_workers) as env:
        env.reset()
        actions = (np.array([0, 0]), np.array([[0, 1], [1, 3]], np.int8),
                   np.zeros((2, 2), np.float32))
        with pytest.raises(envd.InvalidActionError, match=r"action\[1\]\[1\] 3 of env 1"):
            env.step(actions)
        with pytest.raises(envd.InvalidActionError, match="tuple of 3 items"):
            env.step(actions[:2])
        with pytest.raises(envd.InvalidActionError, match=r"actions\[2\] must have shape"):
            env.step((*actions[:2], np.zeros((2, 3), np.float32)))


def test_backend_validates_its_checks_table():
    """The checks table the backend applies to its private copy of each row:
    one entry per integer element; an entry reaching past the row is refused."""
    space = spaces.Tuple((spaces.Discrete(3, start=-1), spaces.MultiBinary(2)))
    checks = leaves.range_checks(space)
    assert checks == [(0, 8, True, -1, 1), (8, 1, True, 0, 1), (9, 1, True, 0, 1)]
    bad = ffi.new("envd_action_check_t[]", [{"offset": 7, "size": 2, "is_signed": 1,
                                             "low": 0, "high": 1}])
    config = ffi.new("envd_workers_config_t *", {
        "num_envs": 1, "agents": 1, "num_workers": 0, "ctl": ffi.cast("envd_worker_ctl_t *", 1),
        "run_inline": lib.envd_hosted_run_inline, "action_bytes": 8,
        "action_checks": bad, "num_action_checks": 1})
    out = ffi.new("envd_backend_t **")
    assert lib.envd_backend_workers_create(out, config) == lib.ENVD_EINVAL  # past the row


@pytest.mark.parametrize("num_workers", [1, 2])
def test_an_info_over_its_slot_is_a_clear_error(num_workers):
    """(Workers encode infos; in the caller's process, num_workers=0, an
    info is never encoded: test_hosted_info_columns.py.)"""
    with envd.make(DICT_OBS, 2, seed=0, num_workers=num_workers, info_bytes=16) as env:
        with pytest.raises(envd.EnvError, match=r"info of env \d is \d+ bytes encoded, over "
                                                r"its 16-byte slot"):
            env.reset()
            for _ in range(6):
                env.step(env.action_space.sample())
    with envd.make(DICT_OBS, 2, seed=0, num_workers=num_workers, info_bytes=0) as env:
        _, info = env.reset()
        for _ in range(6):
            info.update(env.step(env.action_space.sample())[4])
        assert not {"start", "t", "energy", "combo"} & set(info)  # not carried


class ObjectInfoEnv(gymnasium.Env):
    observation_space = spaces.Discrete(2)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return 0, {"handle": object()}

    def step(self, action):
        return 0, 0.0, False, False, {}


def test_an_info_msgpack_cannot_carry_names_its_type():
    with envd.make(ObjectInfoEnv, 2, num_workers=1) as env:
        with pytest.raises(envd.EnvError, match=r"TypeError: the info of env 0 holds a "
                                                r"builtins.object"):
            env.reset()


def test_batched_spaces_are_gymnasium_s():
    with envd.make(DICT_OBS, 3, seed=0, num_workers=0, copy=True) as env:
        ref = gymnasium.make_vec("envd-test/DictObs-v0", 3, vectorization_mode="sync")
        assert env.observation_space == ref.observation_space
        assert env.action_space == ref.action_space
        obs, _ = env.reset()
        assert obs in env.observation_space
        again, _ = env.reset()
        assert obs["pos"] is not again["pos"]  # copy=True copies every leaf
        ref.close()
