"""Compile native C files straight from the source tree and drive them with ctypes.

Native unit tests use this instead of the installed extension so that each C
file is tested on its own, and so that sanitizer builds (-fsanitize=thread or
address) of the same sources are one flag away.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
INCLUDE = NATIVE / "include"
SRC = NATIVE / "src"
ABI_VERSION = int(re.search(r"#define ENVD_ABI_VERSION\s+(\d+)u", (INCLUDE / "envd.h").read_text())[1])
#: envd.h's error codes, name -> value: the rows X(ENVD_<name>, value, "message")
#: of its one table, ENVD_ERRNO_MAP (read from the header, not copied).
ERROR_CODES = {name: int(value) for name, value in re.findall(
    r'^\s+X\((ENVD_(?:OK|E[A-Z]+)), (-?\d+), "[^"]+"\)', (INCLUDE / "envd.h").read_text(), re.M)}

# The flags the package build uses (native/build_ffi.py): no FMA contraction, no
# fast-math, so C arithmetic rounds exactly as numpy's does.
BASE_FLAGS = ["-O2", "-std=gnu11", "-fPIC", "-ffp-contract=off", "-fno-fast-math",
              "-Wall", "-Wextra", "-Werror", "-pthread"]

_BUILD_DIR = Path(tempfile.gettempdir()) / f"envd-cbuild-{os.getuid()}"


def build(sources: list[str | Path], flags: list[str] = (), shared: bool = True,
          name: str = "lib") -> Path:
    """Compile sources (paths relative to native/src or absolute) into a cached
    shared library or executable and return its path."""
    paths = [Path(s) if Path(s).is_absolute() else SRC / s for s in sources]
    key = hashlib.sha256()
    for p in paths:
        key.update(str(p).encode())
        key.update(p.read_bytes())
    # every header a source may include: the library's and the tests' own
    headers = sorted(INCLUDE.glob("*.h")) + sorted(SRC.rglob("*.h"))
    for h in headers + sorted(Path(__file__).resolve().parent.glob("*.h")):
        key.update(h.read_bytes())
    key.update(" ".join(list(flags) + [str(shared)]).encode())
    _BUILD_DIR.mkdir(mode=0o700, exist_ok=True)
    out = _BUILD_DIR / f"{name}-{key.hexdigest()[:16]}{'.so' if shared else ''}"
    if not out.exists():
        cmd = ["gcc", *BASE_FLAGS, *flags, f"-I{INCLUDE}", f"-I{SRC}"]
        if shared:
            cmd.append("-shared")
        tmp = out.with_suffix(out.suffix + f".tmp{os.getpid()}")
        cmd += [str(p) for p in paths] + ["-o", str(tmp), "-lm"]
        subprocess.run(cmd, check=True, capture_output=False)
        tmp.rename(out)
    return out


def load(sources: list[str | Path], flags: list[str] = ()) -> ctypes.CDLL:
    return ctypes.CDLL(str(build(sources, flags)))


# ---- sanitizer runs of the C stress programs ----------------------------------
SANITIZER_REPORTS = ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
                     "ERROR: LeakSanitizer", "runtime error")
# kind -> (compiler flags, environment of the run)
SANITIZERS = {
    "plain": ([], {}),
    "tsan": (["-fsanitize=thread", "-g", "-O1"],
             {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}),
    "asan": (["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer", "-g", "-O1"],
             {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}),
}


def run_stress(sources: list[str | Path], name: str, kind: str, divisor: int,
               timeout: float) -> None:
    """Build a stress program (its main takes a loop divisor) as `kind` and run
    it: it must exit 0, print "<name>: ok" and trigger no sanitizer report."""
    flags, env = SANITIZERS[kind]
    exe = build(sources, flags, shared=False, name=f"{name}_{kind}")
    proc = subprocess.run([str(exe), str(divisor)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, report
    assert not any(s in proc.stderr for s in SANITIZER_REPORTS), report
    assert f"{name}: ok" in proc.stdout, report


# ---- ctypes mirror of envd.h's env definition --------------------------------
MAX_DIMS = 4
DTYPES = {0: np.float32, 1: np.float64, 2: np.int64, 3: np.int32, 4: np.uint8, 5: np.bool_}


class Rng(ctypes.Structure):
    _fields_ = [("state_hi", ctypes.c_uint64), ("state_lo", ctypes.c_uint64),
                ("inc_hi", ctypes.c_uint64), ("inc_lo", ctypes.c_uint64)]


class Space(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS),
                ("low", ctypes.POINTER(ctypes.c_double)), ("high", ctypes.POINTER(ctypes.c_double)),
                ("n", ctypes.c_int64), ("start", ctypes.c_int64)]


class Param(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int), ("default_value", ctypes.c_double),
                ("min_value", ctypes.c_double), ("max_value", ctypes.c_double), ("doc", ctypes.c_char_p)]


INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_double))
RESET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Rng), ctypes.c_void_p)
STEP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Rng), ctypes.c_void_p,
                        ctypes.c_void_p, ctypes.POINTER(ctypes.c_double),
                        ctypes.POINTER(ctypes.c_bool), ctypes.POINTER(ctypes.c_bool))
CLOSE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
WRITE_INFO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
RENDER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint8))
SEED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64)
EPISODE_END = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_double))
# (describe's description pointer is opaque here: the C tests fill it)
DESCRIBE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_void_p)


class InfoField(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("doc", ctypes.c_char_p)]


class EnvDef(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("id", ctypes.c_char_p),
                ("observation_space", Space), ("action_space", Space),
                ("state_size", ctypes.c_size_t), ("num_agents", ctypes.c_int32),
                ("max_episode_steps", ctypes.c_int32),
                ("params", ctypes.POINTER(Param)), ("num_params", ctypes.c_int32),
                ("init", INIT), ("reset", RESET), ("step", STEP), ("close", CLOSE),
                ("info_fields", ctypes.POINTER(InfoField)), ("num_info_fields", ctypes.c_int32),
                ("write_info", WRITE_INFO),
                # since ABI 3
                ("render_width", ctypes.c_int32), ("render_height", ctypes.c_int32),
                ("render_fps", ctypes.c_int32), ("render", RENDER),
                # since ABI 5
                ("flags", ctypes.c_uint32), ("describe", DESCRIBE), ("seed", SEED),
                ("episode_fields", ctypes.POINTER(ctypes.c_char_p)),
                ("num_episode_fields", ctypes.c_int32), ("episode_end", EPISODE_END)]


def _space_shape(space: Space) -> tuple[int, ...]:
    return tuple(space.shape[i] for i in range(space.ndim))


class SingleEnv:
    """One instance of a C env definition, stepped directly (no vec layer)."""

    def __init__(self, lib: ctypes.CDLL, symbol: str, params: dict[str, float] | None = None):
        self.lib = lib
        self.define = EnvDef.in_dll(lib, symbol)
        d = self.define
        self.param_names = [d.params[i].name.decode() for i in range(d.num_params)]
        values = [d.params[i].default_value for i in range(d.num_params)]
        for k, v in (params or {}).items():
            values[self.param_names.index(k)] = float(v)
        self._params = (ctypes.c_double * max(1, len(values)))(*values)
        self._state = ctypes.create_string_buffer(d.state_size)
        self.rng = Rng()
        self.obs = np.zeros(_space_shape(d.observation_space), DTYPES[d.observation_space.dtype])
        act_dtype = DTYPES[d.action_space.dtype]
        self.action = np.zeros(_space_shape(d.action_space), act_dtype)
        rc = d.init(self._state, self._params)
        assert rc == 0, rc
        lib.envd_rng_seed.argtypes = [ctypes.POINTER(Rng), ctypes.c_uint64]

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self.lib.envd_rng_seed(ctypes.byref(self.rng), seed)
        rc = self.define.reset(self._state, ctypes.byref(self.rng), self.obs.ctypes.data)
        assert rc == 0, rc
        return self.obs.copy()

    def step(self, action) -> tuple[np.ndarray, float, bool, bool]:
        self.action[...] = action
        reward = ctypes.c_double()
        term, trunc = ctypes.c_bool(), ctypes.c_bool()
        rc = self.define.step(self._state, ctypes.byref(self.rng), self.action.ctypes.data,
                              self.obs.ctypes.data, ctypes.byref(reward),
                              ctypes.byref(term), ctypes.byref(trunc))
        assert rc == 0, rc
        return self.obs.copy(), reward.value, term.value, trunc.value

    def info(self) -> dict[str, np.ndarray]:
        """The env's info fields for the current state, through its write_info."""
        d = self.define
        fields = {}
        for k in range(d.num_info_fields):
            f = d.info_fields[k]
            fields[f.name.decode()] = np.zeros(tuple(f.shape[i] for i in range(f.ndim)),
                                               DTYPES[f.dtype])
        if not fields:
            return fields
        ptrs = (ctypes.c_void_p * len(fields))(*(a.ctypes.data for a in fields.values()))
        rc = d.write_info(self._state, ptrs)
        assert rc == 0, rc
        return fields

    def snapshot(self) -> tuple[bytes, tuple[int, int, int, int]]:
        """A copy of the state block and the RNG, for restore()."""
        r = self.rng
        return self._state.raw, (r.state_hi, r.state_lo, r.inc_hi, r.inc_lo)

    def restore(self, snap: tuple[bytes, tuple[int, int, int, int]]) -> None:
        state, (self.rng.state_hi, self.rng.state_lo, self.rng.inc_hi, self.rng.inc_lo) = snap
        ctypes.memmove(self._state, state, len(state))

    def seed_rng(self, seed: int) -> None:
        """Reseed the RNG without resetting the env."""
        self.lib.envd_rng_seed(ctypes.byref(self.rng), seed)
