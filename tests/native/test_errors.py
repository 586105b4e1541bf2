"""errors.c (the error table, ABI query, dtype sizes, space sizes, definition
validation) and builtin_envs.c (the table of built-in envs), through ctypes.

The expected codes and constants are read from envd.h, so these tests check
the library against its header rather than against copies of its numbers."""
from __future__ import annotations

import ctypes
import math
import re

import cbuild
import numpy as np
import pytest
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS

HEADER = (cbuild.INCLUDE / "envd.h").read_text()
CODES = cbuild.ERROR_CODES
ERROR_MIN = int(re.search(r"#define ENVD_ERROR_MIN\s+\((-\d+)\)", HEADER)[1])
ABI_VERSION = int(re.search(r"#define ENVD_ABI_VERSION\s+(\d+)u", HEADER)[1])
DTYPES = {name: int(value) for name, value in re.findall(r"ENVD_DTYPE_(\w+) = (\d+)", HEADER)}
MAX_DIMS = int(re.search(r"#define ENVD_MAX_DIMS (\d+)", HEADER)[1])
OK, EINVAL, EABI = CODES["ENVD_OK"], CODES["ENVD_EINVAL"], CODES["ENVD_EABI"]

BOX, DISCRETE, MULTI_DISCRETE, MULTI_BINARY = 0, 1, 2, 3
ELEMENT_SIZES = {"FLOAT32": 4, "FLOAT64": 8, "INT64": 8, "INT32": 4, "UINT8": 1, "BOOL": 1,
                 "INT8": 1}
# the rows X(name) of ENVD_BUILTIN_ENVS (builtin_envs.h), the one list of built-ins
BUILTIN_SYMBOLS = ["envd_builtin_" + name for name in re.findall(
    r"^\s+X\((\w+)\)", (cbuild.SRC / "builtin_envs.h").read_text(), re.M)]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


@pytest.fixture(scope="module")
def lib():
    sources = (["errors.c", "builtin_envs.c", "rng.c", "npy_f32_trig.c", "raster.c"]
               + sorted(str(p) for p in (cbuild.SRC / "envs").glob("*.c")))
    lib = cbuild.load(sources)
    lib.envd_strerror.argtypes = [ctypes.c_int]
    lib.envd_strerror.restype = ctypes.c_char_p
    lib.envd_abi_version.argtypes = []
    lib.envd_abi_version.restype = ctypes.c_uint32
    lib.envd_dtype_size.argtypes = [ctypes.c_int]
    lib.envd_dtype_size.restype = ctypes.c_size_t
    lib.envd_space_numel.argtypes = [ctypes.POINTER(cbuild.Space)]
    lib.envd_space_numel.restype = ctypes.c_int64
    lib.envd_env_def_validate.argtypes = [ctypes.POINTER(cbuild.EnvDef)]
    lib.envd_env_def_validate.restype = ctypes.c_int
    lib.envd_env_def_problem.argtypes = [ctypes.POINTER(cbuild.EnvDef)]
    lib.envd_env_def_problem.restype = ctypes.c_char_p
    lib.envd_builtin_count.argtypes = []
    lib.envd_builtin_count.restype = ctypes.c_int
    lib.envd_builtin_get.argtypes = [ctypes.c_int]
    lib.envd_builtin_get.restype = ctypes.POINTER(cbuild.EnvDef)
    return lib


def builtin(lib, symbol="envd_builtin_cartpole") -> cbuild.EnvDef:
    """A modifiable copy of a built-in definition (its pointers still point
    into the library, which stays loaded for the module)."""
    return cbuild.EnvDef.from_buffer_copy(cbuild.EnvDef.in_dll(lib, symbol))


def doubles(*values) -> ctypes.Array:
    return (ctypes.c_double * len(values))(*values)


# ---- the error table --------------------------------------------------------------
def test_header_codes_form_one_table():
    errors = {v for k, v in CODES.items() if k != "ENVD_OK"}
    assert CODES["ENVD_OK"] == 0
    assert min(errors) == ERROR_MIN
    assert errors == set(range(ERROR_MIN, 0)), "error codes are not contiguous"
    assert len(errors) == len(CODES) - 1, "two names share a code"


def test_strerror_distinct_for_every_code(lib):
    messages = [lib.envd_strerror(code) for code in range(ERROR_MIN, 1)]
    assert all(messages), messages
    assert len(set(messages)) == len(messages), messages
    assert b"unknown error code" not in messages
    assert lib.envd_strerror(OK) == b"success"


@pytest.mark.parametrize("code", [1, 2, ERROR_MIN - 1, ERROR_MIN - 100, INT32_MIN, INT32_MAX])
def test_strerror_unknown_code(lib, code):
    assert lib.envd_strerror(code) == b"unknown error code"


def test_abi_version(lib):
    assert ABI_VERSION >= 1
    assert lib.envd_abi_version() == ABI_VERSION


# ---- dtypes and spaces --------------------------------------------------------------
def test_dtype_sizes(lib):
    assert set(DTYPES) == set(ELEMENT_SIZES), "a dtype was added: extend ELEMENT_SIZES"
    for name, value in DTYPES.items():
        assert lib.envd_dtype_size(value) == ELEMENT_SIZES[name], name
    # The numpy dtypes cbuild maps the same enum values to agree on sizes.
    for value, np_dtype in cbuild.DTYPES.items():
        assert lib.envd_dtype_size(value) == np.dtype(np_dtype).itemsize


@pytest.mark.parametrize("dtype", [len(DTYPES), 100, -1, INT32_MAX])
def test_dtype_size_unknown(lib, dtype):
    assert lib.envd_dtype_size(dtype) == 0


def make_space(kind=BOX, dtype=0, shape=(), n=0, start=0, ndim=None, low=None, high=None):
    space = cbuild.Space(kind=kind, dtype=dtype, ndim=len(shape) if ndim is None else ndim,
                         n=n, start=start)
    for i, extent in enumerate(shape):
        space.shape[i] = extent
    if low is not None:
        space.low = ctypes.cast(low, ctypes.POINTER(ctypes.c_double))
    if high is not None:
        space.high = ctypes.cast(high, ctypes.POINTER(ctypes.c_double))
    return space


@pytest.mark.parametrize("shape, numel", [((), 1), ((5,), 5), ((2, 3), 6), ((2, 3, 4), 24),
                                          ((2, 3, 4, 5), 120), ((1, 1, 1, 1), 1),
                                          ((1 << 20, 1 << 12), 1 << 32)])
def test_space_numel_box(lib, shape, numel):
    assert lib.envd_space_numel(make_space(shape=shape)) == numel


def test_space_numel_box_uses_only_ndim_entries(lib):
    space = make_space(shape=(3, 7, 11, 13), ndim=2)
    assert lib.envd_space_numel(space) == 21


def test_space_numel_discrete(lib):
    # One element whatever n, ndim or shape say.
    assert lib.envd_space_numel(make_space(kind=DISCRETE, dtype=DTYPES["INT64"], n=7)) == 1
    space = make_space(kind=DISCRETE, dtype=DTYPES["INT64"], n=3, shape=(4, 5))
    assert lib.envd_space_numel(space) == 1


def test_builtin_spaces_numel(lib):
    for symbol in BUILTIN_SYMBOLS:
        d = cbuild.EnvDef.in_dll(lib, symbol)
        obs = d.observation_space
        assert lib.envd_space_numel(ctypes.byref(obs)) == math.prod(obs.shape[:obs.ndim])


# ---- the built-in table ---------------------------------------------------------------
def test_builtin_table(lib):
    assert lib.envd_builtin_count() == len(BUILTIN_SYMBOLS)
    ids = []
    for i in range(lib.envd_builtin_count()):
        d = lib.envd_builtin_get(i)
        assert d, i
        ids.append(d.contents.id.decode())
    assert sorted(ids) == sorted(BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
    # The table points at the exported definitions themselves.
    addresses = {ctypes.addressof(lib.envd_builtin_get(i).contents)
                 for i in range(lib.envd_builtin_count())}
    assert addresses == {ctypes.addressof(cbuild.EnvDef.in_dll(lib, s)) for s in BUILTIN_SYMBOLS}


@pytest.mark.parametrize("index", [-1, len(BUILTIN_SYMBOLS), len(BUILTIN_SYMBOLS) + 1,
                                   INT32_MIN, INT32_MAX])
def test_builtin_get_out_of_range(lib, index):
    assert not lib.envd_builtin_get(index)


# ---- envd_env_def_validate ----------------------------------------------------------------
def validate(lib, d: cbuild.EnvDef) -> int:
    return lib.envd_env_def_validate(ctypes.byref(d))


@pytest.mark.parametrize("symbol", BUILTIN_SYMBOLS)
def test_validate_accepts_builtins(lib, symbol):
    assert lib.envd_env_def_validate(ctypes.byref(cbuild.EnvDef.in_dll(lib, symbol))) == OK
    assert validate(lib, builtin(lib, symbol)) == OK  # the copy is as good as the original


def test_validate_null(lib):
    assert lib.envd_env_def_validate(None) == EINVAL


@pytest.mark.parametrize("abi", [0, ABI_VERSION + 1, 2**32 - 1])
def test_validate_abi_version(lib, abi):
    d = builtin(lib)
    d.abi_version = abi
    assert validate(lib, d) == EABI


def test_validate_abi_checked_first(lib):
    # A definition from another ABI cannot be read field by field, so its
    # version is the one problem reported.
    d = builtin(lib)
    d.abi_version = ABI_VERSION + 1
    d.id = None
    d.state_size = 0
    assert validate(lib, d) == EABI


# (field, value, expected code): one field of cartpole changed.
TOP_LEVEL = [
    ("id", None, EINVAL),
    ("id", b"", EINVAL),
    ("id", b"x", OK),
    ("state_size", 0, EINVAL),
    ("state_size", 1, OK),
    ("num_agents", 0, EINVAL),
    ("num_agents", 2, OK),  # ABI 4: agents as rows
    ("num_agents", 4096, OK),  # ENVD_MAX_AGENTS
    ("num_agents", 4097, EINVAL),
    ("num_agents", -1, EINVAL),
    ("max_episode_steps", -1, EINVAL),
    ("max_episode_steps", INT32_MIN, EINVAL),
    ("max_episode_steps", 0, OK),
    ("max_episode_steps", INT32_MAX, OK),
    ("init", cbuild.INIT(), EINVAL),
    ("reset", cbuild.RESET(), EINVAL),
    ("step", cbuild.STEP(), EINVAL),
    ("close", cbuild.CLOSE(), OK),
]


@pytest.mark.parametrize("field, value, want", TOP_LEVEL,
                         ids=[f"{f}={v if isinstance(v, (int, bytes, type(None))) else 'NULL'}"
                              for f, v, _ in TOP_LEVEL])
def test_validate_top_level(lib, field, value, want):
    d = builtin(lib)
    setattr(d, field, value)
    assert validate(lib, d) == want


# ---- spaces: (which space, changes, expected code) ----------------------------------------
# Changes are applied to a copy of a built-in's space; "low"/"high" are lists
# turned into double arrays.  Cartpole: Box float32 (4,) obs, Discrete(2)
# actions.  Pendulum: Box float32 (1,) actions with bounds [-2, 2].
NAN, INF = math.nan, math.inf
SPACE_CASES = [
    ("obs", {"kind": 4}, EINVAL),
    ("obs", {"kind": -1}, EINVAL),
    ("obs", {"dtype": len(DTYPES)}, EINVAL),
    ("obs", {"dtype": -1}, EINVAL),
    ("obs", {"dtype": DTYPES["FLOAT64"]}, OK),
    # integer bounds must be values of the dtype (cartpole's are +-4.8, +-inf)
    ("obs", {"dtype": DTYPES["UINT8"]}, EINVAL),
    ("obs", {"dtype": DTYPES["UINT8"], "low": [0, 0, 0, 0], "high": [255, 1, 2, 3]}, OK),
    ("obs", {"dtype": DTYPES["UINT8"], "low": [0, 0, 0, 0], "high": [256, 1, 2, 3]}, EINVAL),
    ("obs", {"dtype": DTYPES["UINT8"], "low": [-1, 0, 0, 0], "high": [1, 1, 2, 3]}, EINVAL),
    ("obs", {"dtype": DTYPES["UINT8"], "low": None, "high": None}, OK),
    ("obs", {"dtype": DTYPES["INT32"], "low": [-2**31, 0, 0, 0], "high": [2**31 - 1, 1, 1, 1]}, OK),
    ("obs", {"dtype": DTYPES["INT32"], "low": [0, 0, 0, 0], "high": [2**31, 1, 1, 1]}, EINVAL),
    ("obs", {"dtype": DTYPES["INT64"], "low": [-2**63, 0, 0, 0], "high": [1, 1, 1, 1]}, OK),
    ("obs", {"dtype": DTYPES["INT64"], "low": [0, 0, 0, 0], "high": [2**63, 1, 1, 1]}, EINVAL),
    ("obs", {"dtype": DTYPES["INT64"], "low": [-INF, 0, 0, 0], "high": [1, 1, 1, 1]}, EINVAL),
    ("obs", {"dtype": DTYPES["BOOL"], "low": [0, 0, 0, 0], "high": [1, 1, 1, 2]}, EINVAL),
    ("obs", {"ndim": -1}, EINVAL),
    ("obs", {"ndim": MAX_DIMS + 1}, EINVAL),
    ("obs", {"ndim": 0}, OK),
    ("obs", {"shape": [0]}, EINVAL),
    ("obs", {"shape": [-4]}, EINVAL),
    ("obs", {"shape": [(1 << 32) + 1], "low": None, "high": None}, EINVAL),
    ("obs", {"ndim": 2, "shape": [1 << 20, 1 << 20], "low": None, "high": None}, EINVAL),
    ("obs", {"ndim": 2, "shape": [4, 0]}, EINVAL),
    ("obs", {"ndim": 2, "shape": [2, 2]}, OK),
    ("obs", {"ndim": 4, "shape": [1, 2, 1, 2]}, OK),
    ("obs", {"low": [0, 0, 0, 0], "high": [0, -1, 0, 0]}, EINVAL),
    ("obs", {"low": [0, 0, 0, 1], "high": [1, 1, 1, 0.5]}, EINVAL),
    ("obs", {"low": [0, NAN, 0, 0], "high": [1, 1, 1, 1]}, EINVAL),
    ("obs", {"low": [0, 0, 0, 0], "high": [1, 1, NAN, 1]}, EINVAL),
    ("obs", {"low": [INF, 0, 0, 0], "high": [1, 1, 1, 1]}, EINVAL),
    ("obs", {"low": [-INF, 0, 0, 0], "high": [INF, 0, 0, 0]}, OK),
    ("obs", {"low": [1, 2, 3, 4], "high": [1, 2, 3, 4]}, OK),
    ("obs", {"low": None, "high": None}, OK),
    ("act", {"n": 0}, EINVAL),
    ("act", {"n": -1}, EINVAL),
    ("act", {"n": 1}, OK),
    ("act", {"n": 2, "start": -7}, OK),
    # actions start .. start + n - 1 must be representable as int64
    ("act", {"n": 2, "start": 2**63 - 2}, OK),
    ("act", {"n": 3, "start": 2**63 - 2}, EINVAL),
    ("act", {"n": 2**62, "start": 2**62}, OK),
    ("act", {"n": 2**62 + 1, "start": 2**62}, EINVAL),
    ("act", {"dtype": DTYPES["INT32"]}, EINVAL),
    ("act", {"dtype": DTYPES["FLOAT32"]}, EINVAL),
    ("act", {"dtype": DTYPES["UINT8"]}, EINVAL),
    ("act", {"dtype": len(DTYPES)}, EINVAL),
    ("act", {"kind": 4}, EINVAL),
    # MULTI_DISCRETE (ABI 4): INT64, ndim >= 1, nvec >= 1, start + nvec - 1 within int64
    ("act", {"kind": MULTI_DISCRETE, "ndim": 1, "shape": [2], "nvec": [3, 1]}, OK),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 2, "shape": [1, 2], "nvec": [3, 4],
             "nvec_start": [-5, 2**63 - 4]}, OK),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 1, "shape": [2], "nvec": [3, 4],
             "nvec_start": [0, 2**63 - 3]}, EINVAL),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 1, "shape": [2], "nvec": [3, 0]}, EINVAL),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 1, "shape": [2], "nvec": [-1, 2]}, EINVAL),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 1, "shape": [2], "nvec": None}, EINVAL),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 0, "nvec": [3]}, EINVAL),
    ("act", {"kind": MULTI_DISCRETE, "ndim": 1, "shape": [1], "nvec": [3],
             "dtype": DTYPES["INT32"]}, EINVAL),
    # MULTI_BINARY (ABI 4): INT8, ndim >= 1
    ("act", {"kind": MULTI_BINARY, "dtype": DTYPES["INT8"], "ndim": 2, "shape": [2, 3]}, OK),
    ("act", {"kind": MULTI_BINARY, "dtype": DTYPES["INT8"], "ndim": 0}, EINVAL),
    ("act", {"kind": MULTI_BINARY, "dtype": DTYPES["UINT8"], "ndim": 1, "shape": [2]}, EINVAL),
    ("obs", {"kind": MULTI_BINARY, "dtype": DTYPES["INT8"], "ndim": 1, "shape": [5]}, OK),
    ("pendulum_act", {"low": [2.0], "high": [-2.0]}, EINVAL),
    ("pendulum_act", {"low": [NAN], "high": [2.0]}, EINVAL),
    ("pendulum_act", {"low": [-2.0], "high": [NAN]}, EINVAL),
    ("pendulum_act", {"dtype": DTYPES["BOOL"]}, EINVAL),  # bounds -2, 2 are not bools
    ("pendulum_act", {"dtype": DTYPES["BOOL"], "low": [0.0], "high": [1.0]}, OK),
    ("pendulum_act", {"kind": DISCRETE, "n": 0}, EINVAL),
    ("pendulum_act", {"kind": DISCRETE, "n": 3}, EINVAL),  # dtype is FLOAT32
    ("pendulum_act", {"kind": DISCRETE, "dtype": DTYPES["INT64"], "n": 3}, OK),
]


def apply_space_changes(space: cbuild.Space, changes: dict, keep: list):
    for key, value in changes.items():
        if key == "shape":
            for i, extent in enumerate(value):
                space.shape[i] = extent
        elif key in ("nvec", "nvec_start"):  # int64 arrays in low's and high's storage
            field = "low" if key == "nvec" else "high"
            pointer = ctypes.POINTER(ctypes.c_double)
            if value is None:
                setattr(space, field, pointer())
            else:
                array = (ctypes.c_int64 * len(value))(*value)
                keep.append(array)
                setattr(space, field, ctypes.cast(array, pointer))
        elif key in ("low", "high"):
            pointer = ctypes.POINTER(ctypes.c_double)
            if value is None:
                setattr(space, key, pointer())
            else:
                array = doubles(*value)
                keep.append(array)  # alive for the call
                setattr(space, key, ctypes.cast(array, pointer))
        else:
            setattr(space, key, value)


@pytest.mark.parametrize("which, changes, want", SPACE_CASES,
                         ids=[f"{w}-{c}" for w, c, _ in SPACE_CASES])
def test_validate_space(lib, which, changes, want):
    keep = []
    if which == "pendulum_act":
        d = builtin(lib, "envd_builtin_pendulum")
        space = d.action_space
    else:
        d = builtin(lib)
        space = d.observation_space if which == "obs" else d.action_space
    apply_space_changes(space, changes, keep)
    assert validate(lib, d) == want


# ---- params ---------------------------------------------------------------------------------
# One param, changed from a valid FLOAT param (default 0 in [-1, 1]).
PARAM_CASES = [
    ({}, OK),
    ({"name": None}, EINVAL),
    ({"doc": None}, OK),
    ({"type": 3}, EINVAL),
    ({"type": -1}, EINVAL),
    ({"type": 1}, OK),
    ({"type": 2}, OK),
    ({"default_value": -1.5}, EINVAL),
    ({"default_value": 1.5}, EINVAL),
    ({"default_value": NAN}, EINVAL),
    ({"default_value": -1.0}, OK),
    ({"default_value": 1.0}, OK),
    ({"min_value": NAN}, EINVAL),
    ({"max_value": NAN}, EINVAL),
    ({"min_value": 0.5}, EINVAL),
    ({"min_value": -INF, "max_value": INF}, OK),
    ({"min_value": 2.0, "max_value": 1.0, "default_value": 1.5}, EINVAL),
]


@pytest.mark.parametrize("changes, want", PARAM_CASES, ids=[str(c) for c, _ in PARAM_CASES])
def test_validate_param(lib, changes, want):
    fields = dict(name=b"p", type=0, default_value=0.0, min_value=-1.0, max_value=1.0,
                  doc=b"a test param")
    fields.update(changes)
    params = (cbuild.Param * 2)(cbuild.Param(name=b"ok", type=0, default_value=0.0,
                                             min_value=0.0, max_value=1.0, doc=None),
                                cbuild.Param(**fields))
    d = builtin(lib)
    d.params = params
    d.num_params = 2  # the bad param second, so checking only the first is caught
    assert validate(lib, d) == want


@pytest.mark.parametrize("num_params, null_params, want", [
    (-1, False, EINVAL),
    (1, True, EINVAL),
    (0, True, OK),
    (0, False, OK),
])
def test_validate_param_count(lib, num_params, null_params, want):
    d = builtin(lib)
    d.num_params = num_params
    if null_params:
        d.params = ctypes.POINTER(cbuild.Param)()
    assert validate(lib, d) == want


# ---- info fields and envd_env_def_problem ---------------------------------------------
WRITE_INFO = cbuild.WRITE_INFO(lambda state, fields: OK)


def with_info_fields(lib, fields: list[dict], write_info=WRITE_INFO, count=None):
    """Cartpole with info fields built from dicts of InfoField members."""
    d = builtin(lib)
    array = (cbuild.InfoField * max(1, len(fields)))()
    for slot, field in zip(array, fields):
        for key, value in field.items():
            if key == "shape":
                for i, extent in enumerate(value):
                    slot.shape[i] = extent
            else:
                setattr(slot, key, value)
    d.info_fields = ctypes.cast(array, ctypes.POINTER(cbuild.InfoField))
    d.num_info_fields = len(fields) if count is None else count
    d.write_info = write_info
    d._keep = array
    return d


MASK = {"name": b"action_mask", "dtype": DTYPES["UINT8"], "ndim": 1, "shape": [7]}
INFO_CASES = [
    # (fields, num_info_fields override, write_info, expected problem or None)
    ([MASK], None, WRITE_INFO, None),
    ([MASK, {**MASK, "name": b"other", "ndim": 0}], None, WRITE_INFO, None),
    ([MASK] * 8, None, WRITE_INFO, "two fields share a name"),
    ([{**MASK, "name": f"f{k}".encode()} for k in range(9)], None, WRITE_INFO,
     "num_info_fields must be in 0..8"),
    ([MASK], -1, WRITE_INFO, "num_info_fields must be in 0..8"),
    ([MASK], None, cbuild.WRITE_INFO(), "needs info_fields and write_info"),
    ([{**MASK, "name": None}], None, WRITE_INFO, "a field has no name"),
    ([{**MASK, "name": b""}], None, WRITE_INFO, "a field has no name"),
    ([{**MASK, "dtype": 99}], None, WRITE_INFO, "unknown dtype"),
    ([{**MASK, "ndim": 5}], None, WRITE_INFO, "ndim must be in 0..4"),
    ([{**MASK, "shape": [0]}], None, WRITE_INFO, "every shape entry must be in 1..2^32"),
    ([{**MASK, "ndim": 2, "shape": [1 << 20, 1 << 13]}], None, WRITE_INFO, "more than 2^32"),
    ([{**MASK, "name": b"episode"}], None, WRITE_INFO, "a field name is reserved"),
    ([{**MASK, "name": b"env_id"}], None, WRITE_INFO, "a field name is reserved"),
    ([{**MASK, "name": b"_action_mask"}], None, WRITE_INFO, "a field name is reserved"),
    ([{**MASK, "name": b"final_obs"}], None, WRITE_INFO, "a field name is reserved"),
    ([{**MASK, "name": b"episodes"}], None, WRITE_INFO, None),
]


@pytest.mark.parametrize("fields, count, write_info, problem", INFO_CASES,
                         ids=[p or "ok-" + str(len(f)) for f, _, _, p in INFO_CASES])
def test_info_fields_validation(lib, fields, count, write_info, problem):
    d = with_info_fields(lib, fields, write_info, count)
    text = lib.envd_env_def_problem(ctypes.byref(d))
    if problem is None:
        assert text is None and validate(lib, d) == OK
    else:
        assert text.decode().startswith("info_fields: ") and problem in text.decode()
        assert validate(lib, d) == EINVAL


def test_no_info_fields_needs_no_callback(lib):
    d = builtin(lib)
    assert d.num_info_fields == 0 and not d.info_fields and not d.write_info
    assert lib.envd_env_def_problem(ctypes.byref(d)) is None


@pytest.mark.parametrize("field, value, problem", [
    ("id", None, "id is NULL or empty"),
    ("state_size", 0, "state_size"),
    ("num_agents", 0, "num_agents must be in 1..ENVD_MAX_AGENTS"),
    ("max_episode_steps", -1, "max_episode_steps must be >= 0"),
    ("step", cbuild.STEP(), "init, reset and step must not be NULL"),
    ("abi_version", ABI_VERSION + 1, "abi_version differs"),
])
def test_problem_names_the_field(lib, field, value, problem):
    d = builtin(lib)
    setattr(d, field, value)
    assert problem in lib.envd_env_def_problem(ctypes.byref(d)).decode()


@pytest.mark.parametrize("which, changes, prefix", [
    ("obs", {"ndim": 5}, "observation_space: ndim"),
    ("act", {"n": 0}, "action_space: a discrete space needs n >= 1"),
    ("act", {"dtype": DTYPES["INT32"]}, "action_space: a discrete space must have dtype INT64"),
    ("obs", {"low": [0, 0, 0, 1], "high": [1, 1, 1, 0]}, "observation_space: a bound is NaN"),
])
def test_problem_names_the_space(lib, which, changes, prefix):
    d = builtin(lib)
    keep = []
    apply_space_changes(d.observation_space if which == "obs" else d.action_space, changes, keep)
    assert lib.envd_env_def_problem(ctypes.byref(d)).decode().startswith(prefix)


def test_problem_of_null_and_of_a_bad_parameter(lib):
    assert lib.envd_env_def_problem(None) == b"the definition is NULL"
    d = builtin(lib)
    param = cbuild.Param(name=b"p", type=0, default_value=5.0, min_value=0.0, max_value=1.0)
    d.params = ctypes.pointer(param)
    d.num_params = 1
    assert b"default is NaN or outside" in lib.envd_env_def_problem(ctypes.byref(d))


# ---- rendering (ABI 3) --------------------------------------------------------------
ABI_VERSION_MIN = int(re.search(r"#define ENVD_ABI_VERSION_MIN\s+(\d+)u", HEADER)[1])
FRAMES = {"envd_builtin_cartpole": (600, 400, 50), "envd_builtin_pendulum": (500, 500, 30),
          "envd_builtin_mountain_car": (600, 400, 30),
          "envd_builtin_mountain_car_continuous": (600, 400, 30),
          "envd_builtin_acrobot": (500, 500, 15), "envd_builtin_snake": (240, 240, 15),
          "envd_builtin_connect_four": (560, 480, 2),
          "envd_builtin_simple_spread": (700, 700, 10),
          "envd_builtin_simple_spread_continuous": (700, 700, 10)}


def render_info(lib, d: cbuild.EnvDef) -> tuple[int, int, int] | None:
    lib.envd_env_def_render_info.restype = ctypes.c_bool
    size = (ctypes.c_int32 * 3)()
    if not lib.envd_env_def_render_info(ctypes.byref(d), ctypes.byref(size, 0),
                                        ctypes.byref(size, 4), ctypes.byref(size, 8)):
        return None
    return tuple(size)


def test_every_builtin_renders():
    assert sorted(FRAMES) == sorted(BUILTIN_SYMBOLS)


@pytest.mark.parametrize("symbol", sorted(FRAMES))
def test_render_info_of_builtins(lib, symbol):
    assert render_info(lib, cbuild.EnvDef.in_dll(lib, symbol)) == FRAMES[symbol]


def test_abi_2_definitions_load_and_their_render_fields_are_never_read(lib):
    """An ABI 2 definition ends before render_width: whatever bytes follow it
    are neither validated nor used."""
    assert ABI_VERSION == 5 and ABI_VERSION_MIN == 2
    d = builtin(lib)
    d.abi_version = 2
    d.render_width, d.render_height, d.render_fps = -7, 99999, -1  # invalid if read
    assert validate(lib, d) == OK and lib.envd_env_def_problem(ctypes.byref(d)) is None
    assert render_info(lib, d) is None


def test_abi_below_the_oldest_loadable_is_refused(lib):
    d = builtin(lib)
    d.abi_version = ABI_VERSION_MIN - 1
    assert validate(lib, d) == EABI


def test_no_render_callback_means_no_rendering(lib):
    d = builtin(lib)
    d.render_width = d.render_height = d.render_fps = 0
    d.render = cbuild.RENDER()
    assert validate(lib, d) == OK and render_info(lib, d) is None


@pytest.mark.parametrize("changes, problem", [
    ({"render_width": 0}, "render_width and render_height must be in 1..ENVD_MAX_RENDER_SIDE"),
    ({"render_height": 4097}, "render_width and render_height must be in 1.."),
    ({"render_width": -1}, "render_width and render_height must be in 1.."),
    ({"render_fps": 0}, "render: render_fps must be >= 1"),
    ({"render": cbuild.RENDER()}, "render_width/height are set but render is NULL"),
])
def test_render_problems_name_the_field(lib, changes, problem):
    d = builtin(lib)
    for field, value in changes.items():
        setattr(d, field, value)
    assert problem in lib.envd_env_def_problem(ctypes.byref(d)).decode()
    assert validate(lib, d) == EINVAL


@pytest.mark.parametrize("abi", [2, 3])
@pytest.mark.parametrize("which, changes, problem", [
    ("top", {"num_agents": 2}, "num_agents must be 1 in an ABI 2 or 3 definition; rebuild"),
    ("act", {"kind": MULTI_BINARY, "dtype": DTYPES["INT8"], "ndim": 1, "shape": [2]},
     "action_space: MULTI_DISCRETE, MULTI_BINARY and INT8 need ABI 4; rebuild"),
    ("obs", {"dtype": DTYPES["INT8"], "low": None, "high": None},
     "observation_space: MULTI_DISCRETE, MULTI_BINARY and INT8 need ABI 4; rebuild"),
])
def test_abi_4_values_are_refused_in_older_definitions(lib, abi, which, changes, problem):
    """ABI 4 changed no layout, only values an ABI 2 or 3 definition cannot
    have: a definition of those versions that has them is refused, saying how
    to rebuild, and is valid with the ABI 4 version."""
    d = builtin(lib)
    keep = []
    if which == "top":
        for field, value in changes.items():
            setattr(d, field, value)
    else:
        apply_space_changes(d.observation_space if which == "obs" else d.action_space,
                            changes, keep)
    assert validate(lib, d) == OK
    d.abi_version = abi
    assert problem in lib.envd_env_def_problem(ctypes.byref(d)).decode()
    assert validate(lib, d) == EINVAL


# ---- ABI 5: flags, describe, seed, the episode log ----------------------------------
RESETS_ITSELF = int(re.search(r"#define ENVD_ENV_RESETS_ITSELF \(1u << (\d+)\)", HEADER)[1])
RESETS_ITSELF = 1 << RESETS_ITSELF
SERIAL_INIT = 1 << int(re.search(r"#define ENVD_ENV_SERIAL_INIT \(1u << (\d+)\)", HEADER)[1])
MAX_EPISODE_FIELDS = int(re.search(r"#define ENVD_MAX_EPISODE_FIELDS (\d+)", HEADER)[1])
_EPISODE_END = cbuild.EPISODE_END(lambda state, values: 0)


def episode_names(*names: bytes) -> ctypes.Array:
    return (ctypes.c_char_p * max(1, len(names)))(*names)


def resets_itself(lib, *names: bytes):
    d = builtin(lib)
    d.max_episode_steps = 0
    d.flags = RESETS_ITSELF
    d.episode_end = _EPISODE_END
    keep = episode_names(*names)
    d.episode_fields = ctypes.cast(keep, ctypes.POINTER(ctypes.c_char_p))
    d.num_episode_fields = len(names)
    return d, keep


def test_abi_5_fields_are_valid_when_zero_and_with_both_flags(lib):
    d = builtin(lib)
    assert d.abi_version == 5 and d.flags == 0 and validate(lib, d) == OK
    d.flags = SERIAL_INIT
    assert validate(lib, d) == OK
    d, keep = resets_itself(lib, b"episode_return", b"episode_length", b"score")
    d.flags |= SERIAL_INIT
    assert validate(lib, d) == OK, lib.envd_env_def_problem(ctypes.byref(d))


@pytest.mark.parametrize("abi", [2, 3, 4])
def test_abi_5_fields_are_never_read_from_older_definitions(lib, abi):
    """An ABI 2..4 definition ends before flags: whatever bytes follow it are
    neither validated nor used."""
    d = builtin(lib)
    d.flags = 0xFFFF
    d.num_episode_fields = -3
    d.abi_version = abi
    assert validate(lib, d) == OK and lib.envd_env_def_problem(ctypes.byref(d)) is None


@pytest.mark.parametrize("change, problem", [
    (lambda d: setattr(d, "flags", 1 << 5), "flags: a bit this host does not know is set"),
    (lambda d: setattr(d, "flags", 1 << 31), "flags: a bit this host does not know is set"),
    (lambda d: setattr(d, "max_episode_steps", 500),
     "max_episode_steps must be 0 for an env with ENVD_ENV_RESETS_ITSELF"),
    (lambda d: setattr(d, "num_episode_fields", MAX_EPISODE_FIELDS + 1),
     "num_episode_fields must be in 0..ENVD_MAX_EPISODE_FIELDS"),
    (lambda d: setattr(d, "num_episode_fields", -1),
     "num_episode_fields must be in 0..ENVD_MAX_EPISODE_FIELDS"),
    (lambda d: setattr(d, "episode_end", cbuild.EPISODE_END()),
     "num_episode_fields > 0 needs episode_fields and episode_end"),
    (lambda d: setattr(d, "episode_fields", None),
     "num_episode_fields > 0 needs episode_fields and episode_end"),
    (lambda d: setattr(d, "flags", SERIAL_INIT),
     "episode_end: only an env with ENVD_ENV_RESETS_ITSELF"),
])
def test_abi_5_problems_name_the_field(lib, change, problem):
    d, keep = resets_itself(lib, b"episode_return", b"score")
    change(d)
    assert problem in (lib.envd_env_def_problem(ctypes.byref(d)) or b"").decode()
    assert validate(lib, d) == EINVAL


@pytest.mark.parametrize("names, problem", [
    ((b"score", b""), "episode_fields: a field has no name"),
    ((b"score", None), "episode_fields: a field has no name"),
    ((b"score", b"perf", b"score"), "episode_fields: two fields share a name"),
])
def test_episode_field_names_are_checked(lib, names, problem):
    d, keep = resets_itself(lib, *names)
    assert problem in lib.envd_env_def_problem(ctypes.byref(d)).decode()
