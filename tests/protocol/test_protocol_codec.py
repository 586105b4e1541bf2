"""Unit tests of the wire protocol (src/envd/protocol.py) and the shared-memory
layout (src/envd/shm.py), without a daemon."""
from __future__ import annotations

import os
import stat
from secrets import token_hex

import msgpack
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import envd
from envd import errors, protocol, shm
from envd.buffer_layout import buffer_layout

BIG = 1 << 20

# ---- validate_request ---------------------------------------------------------------

#: One well-formed request of every type, with and without its optional fields,
#: and the number of data frames it carries.
WELL_FORMED = [
    ({"type": "hello", "id": 1, "version": protocol.PROTOCOL_VERSION}, 0),
    ({"type": "hello", "id": 1, "version": protocol.PROTOCOL_VERSION, "client_name": "t"}, 0),
    ({"type": "heartbeat", "id": 0}, 0),
    ({"type": "heartbeat", "id": 2, "client": b"\x01" + bytes(15)}, 0),
    ({"type": "list_envs", "id": 3}, 0),
    ({"type": "status", "id": -4}, 0),
    ({"type": "make", "id": 5, "env_id": "CartPole-v1", "num_envs": 4}, 0),
    ({"type": "make", "id": 5, "env_id": "CartPole-v1", "num_envs": 2, "seed": 7,
      "autoreset_mode": "same_step", "max_episode_steps": 10,
      "env_kwargs": {"sutton_barto_reward": True}}, 0),
    ({"type": "make", "id": 5, "env_id": "CartPole-v1", "num_envs": 2, "seed": [1, 2],
      "max_episode_steps": None}, 0),
    ({"type": "make", "id": 5, "env_id": "CartPole-v1", "num_envs": 2, "seed": None}, 0),
    ({"type": "reset", "id": 6, "session": "ab"}, 0),
    ({"type": "reset", "id": 6, "session": "ab", "seeds": True, "mask": False}, 0),
    ({"type": "reset", "id": 6, "session": "ab", "seeds": True, "async": True}, 1),
    ({"type": "step", "id": 7, "session": "ab"}, 0),
    ({"type": "step", "id": 2**63, "session": "ab", "actions": {"dtype": "<i8", "shape": [2]}}, 1),
    ({"type": "close", "id": 8, "session": "ab"}, 0),
]


def check_bad_request(header, num_blobs=0, code="bad_request", *words):
    with pytest.raises(protocol.BadRequest) as info:
        protocol.validate_request(header, num_blobs)
    exc = info.value
    assert exc.error_code == code
    assert code in protocol.ERROR_CODES
    assert isinstance(exc, protocol.ERROR_CODES[code])
    message = str(exc)
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("header, num_blobs", WELL_FORMED,
                         ids=[f"{h['type']}-{i}" for i, (h, _) in enumerate(WELL_FORMED)])
def test_validate_request_accepts_well_formed_messages(header, num_blobs):
    assert protocol.validate_request(header, num_blobs) == header["type"]
    # and after a trip over the wire
    wire = protocol.unpack(protocol.pack(header), BIG)
    assert wire == header
    assert protocol.validate_request(wire, num_blobs) == header["type"]


_EXAMPLE_VALUES = {int: 1, str: "x", bytes: b"\x01x", bool: True, dict: {}, object: None}


def minimal(kind: str) -> dict:
    """A well-formed request of this type with its required fields only (built
    from MESSAGE_FIELDS, so a type added later is covered too)."""
    header = {"type": kind, "id": 1}
    for name, (types, required) in protocol.MESSAGE_FIELDS[kind].items():
        if required:
            header[name] = _EXAMPLE_VALUES[types[0]]
    return header


def test_the_well_formed_examples_are_known_types():
    assert {h["type"] for h, _ in WELL_FORMED} <= set(protocol.MESSAGE_FIELDS)
    assert {"hello", "heartbeat", "list_envs", "status", "make", "reset", "step",
            "close"} <= set(protocol.MESSAGE_FIELDS)


@pytest.mark.parametrize("kind", sorted(protocol.MESSAGE_FIELDS))
def test_validate_request_accepts_every_type_with_its_required_fields(kind):
    header = minimal(kind)
    assert protocol.validate_request(header, 0) == kind
    assert protocol.validate_request(header, protocol.MAX_BLOBS.get(kind, 0)) == kind


@pytest.mark.parametrize("kind", sorted(protocol.MESSAGE_FIELDS))
def test_missing_required_fields_are_rejected(kind):
    full = minimal(kind)
    required = [name for name, (_, req) in protocol.MESSAGE_FIELDS[kind].items() if req]
    for name in required:
        header = {k: v for k, v in full.items() if k != name}
        check_bad_request(header, 0, "bad_request", kind, "missing", repr(name))


#: Values of every msgpack type (bool apart from int).
SAMPLES = [0, 7, -1, True, False, 1.5, "text", b"bytes", [1], {"a": 1}, None]


@pytest.mark.parametrize("kind", sorted(protocol.MESSAGE_FIELDS))
def test_fields_of_the_wrong_type_are_rejected(kind):
    full = minimal(kind)
    checked = 0
    for name, (types, _) in protocol.MESSAGE_FIELDS[kind].items():
        if types == (object,):  # checked by the handler (as envd.make checks it)
            continue
        for value in SAMPLES:
            fits = isinstance(value, types) and (not isinstance(value, bool) or bool in types)
            if fits:
                continue
            header = {**full, name: value}
            check_bad_request(header, 0, "bad_request", kind, repr(name), "must be")
            checked += 1
    assert checked or not any(t != (object,) for t, _ in protocol.MESSAGE_FIELDS[kind].values())


@pytest.mark.parametrize("header", [
    {"type": "make", "id": 1, "env_id": "CartPole-v1", "num_envs": True},
    {"type": "make", "id": 1, "env_id": "CartPole-v1", "num_envs": False},
    {"type": "hello", "id": 1, "version": True},
])
def test_bool_is_not_an_int(header):
    check_bad_request(header, 0, "bad_request", "must be int", "got bool")


@pytest.mark.parametrize("request_id", [True, False, "1", 1.0, None, [1], {"a": 1}, b"1"])
def test_the_id_must_be_an_int(request_id):
    check_bad_request({"type": "status", "id": request_id}, 0, "bad_request", "'id'", "int")
    check_bad_request({"type": "status"}, 0, "bad_request", "'id'")


@pytest.mark.parametrize("kind", [5, None, b"status", ["status"], True])
def test_the_type_must_be_a_str(kind):
    check_bad_request({"type": kind, "id": 1}, 0, "bad_request", "'type'", "str")
    check_bad_request({"id": 1}, 0, "bad_request", "'type'")


@pytest.mark.parametrize("header, num_blobs", WELL_FORMED,
                         ids=[f"{h['type']}-{i}" for i, (h, _) in enumerate(WELL_FORMED)])
def test_extra_fields_are_rejected(header, num_blobs):
    message = check_bad_request({**header, "zzz_unknown": 1}, num_blobs, "bad_request",
                                "unknown fields", "zzz_unknown")
    assert header["type"] in message


@pytest.mark.parametrize("kind", sorted(protocol.MESSAGE_FIELDS))
def test_too_many_data_frames_are_rejected(kind):
    header = minimal(kind)
    allowed = protocol.MAX_BLOBS.get(kind, 0)
    assert protocol.validate_request(header, 0) == kind
    check_bad_request(header, allowed + 1, "bad_request", "data frames", str(allowed + 1))
    check_bad_request(header, 100, "bad_request", "data frames")


@pytest.mark.parametrize("kind", ["bogus", "", "HELLO", "step ", "__class__", "get"])
def test_unknown_types_have_their_own_code(kind):
    message = check_bad_request({"type": kind, "id": 3}, 0, "unknown_type", repr(kind))
    for known in protocol.MESSAGE_FIELDS:
        assert known in message  # lists what is known


# ---- unpack ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [[1, 2], 5, -3, "str", b"bin", None, True, 1.5, []])
def test_unpack_rejects_non_maps(value):
    with pytest.raises(protocol.BadRequest) as info:
        protocol.unpack(msgpack.packb(value, use_bin_type=True), BIG)
    assert info.value.error_code == "bad_request"
    assert "must be a msgpack map" in str(info.value)
    assert type(value).__name__ in str(info.value)


@pytest.mark.parametrize("frame", [
    b"", b"\xc1", b"\x82\xa4type", b"\x81", b"\x81\x01\x02",  # int key
    msgpack.packb({"a": 1}) + b"\x00",  # trailing data
    msgpack.packb({"e": msgpack.ExtType(1, b"x")}),  # ext types are refused
    b"\xdd\xff\xff\xff\xff",  # claims an array of 2**32-1 items
    b"\x91" * 5000 + b"\x00",  # nested deeper than msgpack's stack
    bytes(range(256)), b"\xff" * 64,
], ids=lambda f: f[:8].hex() or "empty")
def test_unpack_rejects_garbage(frame):
    with pytest.raises(protocol.BadRequest) as info:
        protocol.unpack(frame, BIG)
    assert info.value.error_code == "bad_request"
    message = str(info.value)
    assert "msgpack" in message and "Traceback" not in message


def test_unpack_bounds_the_frame_and_every_container():
    header = {"type": "status", "id": 1, "x": "a" * 100}
    frame = protocol.pack(header)
    assert protocol.unpack(frame, len(frame)) == header
    with pytest.raises(protocol.BadRequest) as info:
        protocol.unpack(frame, len(frame) - 1)
    assert info.value.error_code == "bad_request" and "--max-header-bytes" in str(info.value)
    with pytest.raises(protocol.BadRequest):
        protocol.unpack(protocol.pack({"x": list(range(50))}), 49)
    with pytest.raises(protocol.BadRequest):
        protocol.unpack(protocol.pack({"x": b"b" * 50}), 49)


def _nested(depth: int) -> bytes:
    """A map whose value is depth - 1 arrays nested in each other."""
    return b"\x81\xa1x" + b"\x91" * (depth - 2) + b"\x90"


def test_the_scan_bounds_nesting_before_decoding():
    value = protocol.unpack(_nested(32), BIG)["x"]
    for _ in range(30):
        assert len(value) == 1
        value = value[0]
    assert value == []
    with pytest.raises(protocol.BadRequest) as info:
        protocol.unpack(_nested(33), BIG)
    assert info.value.error_code == "bad_request" and "deeper than 32" in str(info.value)
    # 16- and 32-bit arrays and maps count too, and so do maps' values
    wide = b"\x81\xa1x" + b"\xdc\x00\x01" * 31 + b"\xde\x00\x01\xa1k\x90"
    with pytest.raises(protocol.BadRequest, match="deeper than 32"):
        protocol.unpack(wide, BIG)
    assert protocol.unpack(b"\x81\xa1x" + b"\xdc\x00\x01" * 30 + b"\x90", BIG)


def test_the_scan_bounds_the_object_count():
    frame = protocol.pack({"x": [0] * 1000})
    assert protocol.unpack(frame, BIG, max_objects=1003)
    with pytest.raises(protocol.BadRequest, match="more than 1002 msgpack objects"):
        protocol.unpack(frame, BIG, max_objects=1002)
    # by default a header holds at most one object per 8 bytes
    frame = protocol.pack({"x": [None] * 2000})
    with pytest.raises(protocol.BadRequest, match="objects"):
        protocol.unpack(frame, 8 * 1000)


@pytest.mark.parametrize("frame", [
    b"\x81\xa1x\xdd\x00\x00\x00\x05\x90",  # claims more items than bytes
    b"\x81\xa1x\xc7\x01\x01x",  # ext 8
    b"\x81\xa1x\xd4\x01\x01",  # fixext 1
    b"\x81\xa1x\xda\xff",  # a str16 whose length is cut
], ids=lambda f: f.hex())
def test_the_scan_refuses_what_msgpack_would(frame):
    with pytest.raises(protocol.BadRequest, match="msgpack"):
        protocol.unpack(frame, BIG)
    with pytest.raises(protocol.BadRequest, match="msgpack"):
        protocol.scan(frame, 32, 1000)


#: Units a hostile header repeats: (msgpack bytes, objects in them).
_UNITS = {"empty arrays": (b"\x90", 1), "empty maps": (b"\x80", 1),
          "one-entry maps": (b"\x81\xa0\x00", 3), "floats": (b"\xcb" + bytes(8), 1),
          "short strs": (b"\xa2ab", 1), "ints": (b"\xcd\x10\x00", 1),
          "one-item arrays": (b"\x91\x90", 2)}


def _hostile_headers(cap: int) -> dict[str, bytes]:
    """Headers of at most cap bytes built to decode to as much as they may:
    an array of as many units as the bytes and the object count allow."""
    objects = cap // protocol.HEADER_BYTES_PER_OBJECT - 3  # (the map, its key, the array)
    frames = {}
    for name, (unit, count) in _UNITS.items():
        n = min((cap - 16) // len(unit), objects // count)
        frames[name] = b"\x81\xa1x\xdd" + n.to_bytes(4, "big") + unit * n
    frames["nested maps"] = b"\x81\xa1x" + b"\x81\xa0" * 30 + b"\x90"  # 32 deep
    frames["one str"] = protocol.pack({"x": "y" * (cap - 16)})
    return frames


@pytest.mark.parametrize("name", list(_hostile_headers(1024)))
def test_what_a_header_at_the_cap_decodes_to_is_bounded(name):
    """SECURITY.md: decoding a header of at most H bytes allocates under 100 H
    (whatever it holds: the scan refuses what would be more)."""
    import tracemalloc
    cap = protocol.DEFAULT_MAX_HEADER_BYTES
    frame = _hostile_headers(cap)[name]
    assert len(frame) <= cap
    tracemalloc.start()
    try:
        header = protocol.unpack(frame, cap)  # within the bounds: decoded
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del header
    assert peak <= 100 * cap, f"{name}: {peak} bytes decoded from {len(frame)}"


def test_the_client_decodes_what_the_daemon_sends():
    """Replies carry spaces whose bounds are nested lists (an object per
    element) and nest deeper than requests: unpack_reply takes them."""
    space = spaces.Dict({"a": spaces.Dict({"b": spaces.Dict({"c": spaces.Box(
        0, 255, (84, 84, 3), np.uint8)})})})
    reply = {"id": 1, "ok": True, "observation_space": protocol.space_to_wire(space)}
    assert protocol.unpack_reply(protocol.pack(reply)) == reply
    with pytest.raises(errors.ProtocolError, match="deeper than 64"):
        protocol.unpack_reply(_nested(65))


def test_per_env_lists_round_trip_through_data_frames():
    blobs: list[bytes] = []
    values = [[True, False], [1, 2, 3], [2**63, 1], [0.5, 1.5], np.arange(4, dtype=np.int32),
              np.array([1.25], np.float32), ["a", "b"], [1, 2.0], 7, [], None]
    refs = [protocol.list_to_blob(v, blobs) for v in values]
    assert [isinstance(r, dict) for r in refs] == [True] * 6 + [False] * 5
    assert len(blobs) == 6
    used: set[int] = set()
    back = [protocol.list_from_blob(r, blobs, used, 8) for r in refs]
    assert back[:6] == [[True, False], [1, 2, 3], [2**63, 1], [0.5, 1.5], [0, 1, 2, 3], [1.25]]
    assert type(back[0][0]) is bool and type(back[1][0]) is int
    assert back[6:] == [["a", "b"], [1, 2.0], 7, [], None] and used == set(range(6))
    with pytest.raises(protocol.BadRequest, match="named twice"):
        protocol.list_from_blob(refs[0], blobs, used, 8)


def test_a_per_env_list_longer_than_a_session_is_refused_before_it_is_built():
    blobs: list[bytes] = []
    ref = protocol.list_to_blob([True] * 9, blobs)
    with pytest.raises(protocol.BadRequest, match="holds 9 values, more than the 8 envs"):
        protocol.list_from_blob(ref, blobs, set(), 8)
    assert protocol.list_from_blob(ref, blobs, set(), 9) == [True] * 9


def test_unpack_keeps_str_and_bin_apart():
    header = protocol.unpack(protocol.pack({"s": "x", "b": b"x"}), BIG)
    assert header == {"s": "x", "b": b"x"}
    assert type(header["s"]) is str and type(header["b"]) is bytes


# ---- error replies ---------------------------------------------------------------------

def _exception_for(code: str, cls: type, message: str) -> errors.EnvdError:
    if cls is errors.NativeError:
        return cls(message, -7)
    if cls is errors.EnvError:
        return cls(message, -7, env_index=5)
    if code != cls.error_code:  # the aliases of ProtocolError
        return protocol.BadRequest(message, code)
    return cls(message)


def test_the_error_code_table():
    for code, cls in protocol.ERROR_CODES.items():
        assert issubclass(cls, errors.EnvdError)
        assert cls.error_code == code or (cls is errors.ProtocolError and code in
                                          ("unsupported_version", "unknown_type"))
    for cls in (errors.ProtocolError, errors.UnknownEnvError, errors.InvalidArgumentError,
                errors.InvalidActionError, errors.EnvStateError, errors.NativeError,
                errors.LimitExceededError, errors.UnknownSessionError,
                errors.SessionExpiredError, errors.DaemonError, errors.ShuttingDownError):
        assert protocol.ERROR_CODES[cls.error_code] is cls


@pytest.mark.parametrize("code", [[1, 2], {"a": 1}, 7, None, "no_such_code"])
def test_an_error_reply_with_an_unknown_code_is_a_daemon_error(code):
    """A reply's code is the daemon's to send: one that is not a code the
    client knows (not a string at all, even an unhashable list or map) is a
    DaemonError carrying the message, never a TypeError of the lookup."""
    exc = protocol.error_from_reply({"id": 1, "ok": False, "code": code, "message": "it broke"})
    assert type(exc) is errors.DaemonError
    assert "it broke" in str(exc)
    known = protocol.error_from_reply({"id": 1, "ok": False, "code": "unknown_session",
                                       "message": "gone"})
    assert type(known) is errors.UnknownSessionError


@pytest.mark.parametrize("code", sorted(protocol.ERROR_CODES))
def test_error_reply_and_raise_error_round_trip(code):
    cls = protocol.ERROR_CODES[code]
    message = f"something about {code} went wrong: é ✓"
    reply = protocol.error_reply(41, _exception_for(code, cls, message))
    expected = {"id": 41, "ok": False, "code": code, "message": message}
    if issubclass(cls, errors.NativeError):
        expected["native_code"] = -7
    if cls is errors.EnvError:
        expected["env_index"] = 5
    assert reply == expected
    wire = protocol.unpack(protocol.pack(reply), BIG)  # as the client receives it
    with pytest.raises(errors.EnvdError) as info:
        protocol.raise_error(wire)
    assert type(info.value) is cls
    assert str(info.value) == message
    if issubclass(cls, errors.NativeError):
        assert info.value.code == -7
    if cls is errors.EnvError:
        assert info.value.env_index == 5
    if code == cls.error_code:
        assert info.value.error_code == code


def test_error_reply_without_an_id():
    reply = protocol.error_reply(None, protocol.BadRequest("not msgpack"))
    assert reply == {"id": None, "ok": False, "code": "bad_request", "message": "not msgpack"}


def test_a_code_from_a_newer_daemon_becomes_a_daemon_error_keeping_its_code():
    reply = {"id": 3, "ok": False, "code": "quota_of_the_future", "message": "too many futures"}
    with pytest.raises(envd.DaemonError) as info:
        protocol.raise_error(reply)
    assert type(info.value) is errors.DaemonError
    assert str(info.value) == "too many futures"
    assert info.value.error_code == "quota_of_the_future"
    assert errors.DaemonError.error_code == "internal"  # the class is untouched
    with pytest.raises(envd.DaemonError) as info:
        protocol.raise_error({"id": 3, "ok": False, "code": "internal", "message": "bug"})
    assert info.value.error_code == "internal"


def test_raise_error_with_fields_missing():
    with pytest.raises(envd.DaemonError) as info:
        protocol.raise_error({"id": 1, "ok": False})
    assert str(info.value) == "the daemon gave no message"
    with pytest.raises(envd.NativeError) as info:
        protocol.raise_error({"id": 1, "ok": False, "code": "native", "message": "m"})
    assert info.value.code == -1 and str(info.value) == "m"


def test_ok_reply():
    assert protocol.ok_reply(9, num_done=2) == {"id": 9, "ok": True, "num_done": 2}


# ---- spaces ------------------------------------------------------------------------------

def _same_space(a, b):
    assert type(a) is type(b)
    assert a == b
    assert a.dtype == b.dtype
    if isinstance(a, spaces.Box):
        assert a.shape == b.shape
        assert a.low.dtype == b.low.dtype and a.high.dtype == b.high.dtype
        assert a.low.tobytes() == b.low.tobytes()
        assert a.high.tobytes() == b.high.tobytes()
    else:
        assert (a.n, a.start) == (b.n, b.start)


@pytest.mark.parametrize("env_id", envd.list_envs())
def test_spaces_of_every_builtin_env_round_trip(env_id):
    spec = envd.native.get_spec(env_id)
    for space in (spec.observation_space, spec.action_space):
        wire = protocol.unpack(protocol.pack(protocol.space_to_wire(space)), BIG)
        _same_space(protocol.space_from_wire(wire), space)


def test_the_builtin_envs_are_the_expected_ones():
    from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS, listed_builtins
    assert listed_builtins() == sorted(BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)


@pytest.mark.parametrize("space", [
    spaces.Discrete(5, start=-3),
    spaces.Discrete(1),
    spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
    spaces.Box(np.float32(-0.1), np.float32(np.nextafter(np.float32(1), np.float32(2))), (4,),
               np.float32),
    spaces.Box(0, 255, (2, 2, 3), np.uint8),
    spaces.Box(-5, 5, (3,), np.int32),
], ids=str)
def test_other_spaces_round_trip(space):
    wire = protocol.unpack(protocol.pack(protocol.space_to_wire(space)), BIG)
    _same_space(protocol.space_from_wire(wire), space)


def test_spaces_without_a_wire_form():
    with pytest.raises(TypeError, match="Text"):
        protocol.space_to_wire(spaces.Text(5))
    with pytest.raises(TypeError, match="Sequence"):
        protocol.space_to_wire(spaces.Dict({"a": spaces.Sequence(spaces.Discrete(2))}))


def test_every_hosted_space_has_a_wire_form():
    space = spaces.Tuple((spaces.MultiDiscrete([2, 3], start=[-1, 0]), spaces.MultiBinary(4),
                          spaces.Dict({"b": spaces.Box(0, 1, (2,), np.float16),
                                       "a": spaces.Discrete(3, start=-2)})))
    wire = protocol.unpack(protocol.pack({"space": protocol.space_to_wire(space)}),
                           1 << 20)["space"]
    assert protocol.space_from_wire(wire) == space


# ---- default_endpoint -----------------------------------------------------------------

def test_default_endpoint_prefers_envd_endpoint(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVD_ENDPOINT", "tcp://127.0.0.1:5999")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert protocol.default_endpoint() == "tcp://127.0.0.1:5999"


def test_default_endpoint_uses_xdg_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("ENVD_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert protocol.default_endpoint() == f"ipc://{tmp_path}/envd.sock"
    monkeypatch.setenv("ENVD_ENDPOINT", "")  # empty: as if unset
    assert protocol.default_endpoint() == f"ipc://{tmp_path}/envd.sock"


@pytest.mark.parametrize("runtime", [None, "", "missing"])
def test_default_endpoint_falls_back_to_tmp(monkeypatch, tmp_path, runtime):
    monkeypatch.delenv("ENVD_ENDPOINT", raising=False)
    if runtime is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / runtime) if runtime else "")
    assert protocol.default_endpoint() == f"ipc:///tmp/envd-{os.getuid()}/envd.sock"


# ---- shm.plan ------------------------------------------------------------------------------

def _check_plan(layout):
    arrays, size = shm.plan(layout)
    assert list(arrays) == list(layout)
    end = shm.HEADER_SIZE
    for name, (shape, dtype) in layout.items():
        offset, dtype_str, planned_shape = arrays[name]
        assert offset % 64 == 0 and offset >= shm.HEADER_SIZE
        assert offset >= end, f"{name} overlaps the array before it"
        assert dtype_str == np.dtype(dtype).str and planned_shape == list(shape)
        end = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    assert size % 64 == 0 and size >= end and size - end < 64
    return arrays, size


@pytest.mark.parametrize("env_id", envd.list_envs())
@pytest.mark.parametrize("num_envs", [1, 3, 7, 1000])
def test_plan_of_every_env_layout(env_id, num_envs):
    spec = envd.native.get_spec(env_id)
    for mode in AutoresetMode:
        layout = buffer_layout(spec.observation_space, spec.action_space, num_envs, mode)
        arrays, _ = _check_plan(layout)
        assert arrays["observations"][0] == shm.HEADER_SIZE


def test_plan_of_odd_sizes():
    layout = {"a": ((3,), np.dtype(np.uint8)), "b": ((1,), np.dtype(np.float64)),
              "c": ((5, 3), np.dtype(np.bool_)), "d": ((0,), np.dtype(np.int64)),
              "e": ((17,), np.dtype(np.int32)), "f": ((1,), np.dtype(np.uint8))}
    arrays, size = _check_plan(layout)
    assert [arrays[k][0] for k in "abc"] == [4096, 4160, 4224]
    assert arrays["f"][0] > arrays["e"][0]
    assert size == arrays["f"][0] + 64
    assert shm.plan({}) == ({}, shm.HEADER_SIZE)


# ---- shm.Segment --------------------------------------------------------------------------

@pytest.fixture
def segment_name():
    name = f"envd-{os.getpid()}-{token_hex(16)}"
    yield name
    try:
        os.unlink(os.path.join(shm.SHM_DIR, name))
    except FileNotFoundError:
        pass


def _layout():
    spec = envd.native.get_spec("Pendulum-v1")
    return shm.plan(buffer_layout(spec.observation_space, spec.action_space, 5,
                                  AutoresetMode.SAME_STEP))


def test_create_and_attach_share_memory(segment_name):
    arrays, size = _layout()
    session = token_hex(16)
    created = shm.Segment.create(segment_name, session, arrays, size)
    try:
        path = os.path.join(shm.SHM_DIR, segment_name)
        assert created.path == path and created.size == size
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == size
        with open(path, "rb") as f:
            head = f.read(96)
        assert head[:8] == shm.MAGIC
        assert head[64:96].decode() == session

        attached = shm.Segment.attach(segment_name, session, arrays, size, where="the test")
        assert attached.size == size
        assert set(attached.arrays) == set(arrays)
        for name, (_offset, dtype, shape) in arrays.items():
            a, b = created.arrays[name], attached.arrays[name]
            assert a.dtype.str == dtype and list(a.shape) == shape
            assert b.dtype.str == dtype and list(b.shape) == shape
        rng = np.random.default_rng(0)
        created.arrays["observations"][...] = rng.random((5, 3), dtype=np.float32)
        np.testing.assert_array_equal(attached.arrays["observations"],
                                      created.arrays["observations"])
        attached.arrays["actions"][...] = [[0.5], [-1], [2], [0], [1e-3]]
        assert created.arrays["actions"].tobytes() == attached.arrays["actions"].tobytes()
        attached.arrays["reset_seeds"][...] = 2**64 - 1
        assert (created.arrays["reset_seeds"] == 2**64 - 1).all()
        # the arrays do not overlap: writing one leaves the others alone
        before = {k: v.copy() for k, v in attached.arrays.items()}
        created.arrays["rewards"][...] = 7
        for name, value in attached.arrays.items():
            if name != "rewards":
                assert value.tobytes() == before[name].tobytes(), name
        assert (attached.arrays["rewards"] == 7).all()
        # the sequence counters
        assert (attached.step_seq, attached.done_seq) == (0, 0)
        created.bump_step_seq()
        created.bump_step_seq()
        created.bump_done_seq()
        assert (attached.step_seq, attached.done_seq) == (2, 1)
        assert created.describe() == {"name": segment_name, "size": size}
    finally:
        created.unlink()
    assert not os.path.exists(path)
    created.unlink()  # idempotent
    # the mappings outlive the name
    created.arrays["rewards"][0] = 3
    assert attached.arrays["rewards"][0] == 3


def test_create_never_takes_an_existing_name(segment_name):
    arrays, size = _layout()
    first = shm.Segment.create(segment_name, token_hex(16), arrays, size)
    try:
        with pytest.raises(FileExistsError):
            shm.Segment.create(segment_name, token_hex(16), arrays, size)
        assert os.path.exists(first.path)  # the failed create left it alone
    finally:
        first.unlink()


def test_attach_with_a_wrong_session_id(segment_name):
    arrays, size = _layout()
    created = shm.Segment.create(segment_name, token_hex(16), arrays, size)
    try:
        other = token_hex(16)
        with pytest.raises(envd.SharedMemoryError) as info:
            shm.Segment.attach(segment_name, other, arrays, size, where="the daemon X")
        message = str(info.value)
        assert other in message and segment_name in message and "the daemon X" in message
    finally:
        created.unlink()


def test_attach_a_segment_smaller_than_announced(segment_name):
    arrays, size = _layout()
    session = token_hex(16)
    created = shm.Segment.create(segment_name, session, arrays, size)
    try:
        with pytest.raises(envd.SharedMemoryError, match="smaller"):
            shm.Segment.attach(segment_name, session, arrays, size + 4096, where="d")
    finally:
        created.unlink()


def test_attach_a_missing_segment():
    name = f"envd-{os.getpid()}-{token_hex(16)}"
    with pytest.raises(envd.SharedMemoryError) as info:
        shm.Segment.attach(name, token_hex(16), {}, 4096, where="the daemon at ipc:///x")
    message = str(info.value)
    assert name in message and "no such segment" in message
    assert "the daemon at ipc:///x" in message
    assert isinstance(info.value, OSError)
    assert not os.path.exists(os.path.join(shm.SHM_DIR, name))


@pytest.mark.parametrize("name", ["envd-1/../../etc/passwd", "../envd-1-x", "envd-/x",
                                  "/dev/shm/envd-1-x", "other-1-x", ""])
def test_attach_refuses_bad_names(name):
    with pytest.raises(envd.SharedMemoryError) as info:
        shm.Segment.attach(name, token_hex(16), {}, 4096, where="d")
    assert "invalid segment name" in str(info.value)
    assert repr(name) in str(info.value)
