"""Drive an Ocean plugin's ABI 5 definition directly, as envd's host does.

The tests of the adapter itself (trajectories, kwargs, episode logs, one env
per Python thread) call the plugin's callbacks through cffi, in the order
the ABI 5 contract gives: describe, seed, init, reset, step, episode_end,
close.  The declarations are envd.h's, read by cffi's parser from the header
the plugin was built against (its macros and inline functions dropped).
"""
from __future__ import annotations

import re
from pathlib import Path

import cffi
import numpy as np

from envd.native import ocean_build

_DTYPES = {0: np.float32, 1: np.float64, 2: np.int64, 3: np.int32, 4: np.uint8, 5: np.bool_,
           6: np.int8}


def _cdef_source() -> str:
    """envd.h's types and prototypes, without what cffi cannot parse."""
    text = (ocean_build.envd_include() / "envd.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"static inline[^{]*\{(?:[^{}]|\{[^{}]*\})*\}", "", text)
    text = re.sub(r"#(?:\\\n|[^\n])*", "", text)  # every directive, continued lines too
    text = re.sub(r'extern "C" \{|^\}\s*$', "", text, flags=re.M)
    text = re.sub(r"ENVD_ERRNO_MAP\(ENVD_ERROR_ENUM_ENTRY\)", "ENVD_OK = 0", text)
    text = text.replace("ENVD_MAX_DIMS", "4")
    return text


_FFI = cffi.FFI()
_FFI.cdef(_cdef_source())
_FFI.cdef("const envd_plugin_t *envd_plugin(void);\n"
          "int envd_ocean_ckwargs(const double *params, const char **names, double *values,"
          " int32_t cap);")
_LIBS: dict[str, object] = {}


class Plugin:
    """A loaded Ocean plugin: its one definition."""

    def __init__(self, library: Path):
        lib = _LIBS.get(str(library))
        if lib is None:
            lib = _LIBS[str(library)] = _FFI.dlopen(str(library))
        self.lib = lib
        table = lib.envd_plugin()
        assert table != _FFI.NULL, f"{library}: envd_plugin() returned NULL"
        self.table = table
        self.d = table.envs[0]

    @property
    def env_id(self) -> str:
        return _FFI.string(self.d.id).decode()

    @property
    def params(self) -> dict[str, tuple[int, float, float, float]]:
        return {_FFI.string(p.name).decode(): (p.type, p.default_value, p.min_value, p.max_value)
                for p in (self.d.params[i] for i in range(self.d.num_params))}

    def param_values(self, **kwargs) -> list[float]:
        names = list(self.params)
        unknown = set(kwargs) - set(names)
        assert not unknown, f"unknown kwargs {unknown}"
        return [float(kwargs.get(n, self.params[n][1])) for n in names]

    def ckwargs(self, **kwargs) -> dict[str, float]:
        names = _FFI.new("const char *[64]")
        values = _FFI.new("double[64]")
        n = self.lib.envd_ocean_ckwargs(_FFI.new("double[]", self.param_values(**kwargs)),
                                        names, values, 64)
        assert n >= 0, n
        return {_FFI.string(names[i]).decode(): values[i] for i in range(n)}

    @property
    def episode_fields(self) -> list[str]:
        return [_FFI.string(self.d.episode_fields[i]).decode()
                for i in range(self.d.num_episode_fields)]

    def describe(self, **kwargs) -> dict:
        keep = []

        @_FFI.callback("void *(void *, size_t)")
        def alloc(host, size):
            block = _FFI.new("char[]", max(size, 1))
            keep.append(block)
            return block

        out = _FFI.new("envd_description_t *")
        out.observation_space = self.d.observation_space
        out.action_space = self.d.action_space
        out.num_agents = self.d.num_agents
        out.state_size = self.d.state_size
        out.alloc = alloc
        rc = self.d.describe(_FFI.new("double[]", self.param_values(**kwargs)), out)
        assert rc == 0, rc
        return {"obs": _space(out.observation_space), "act": _space(out.action_space),
                "agents": out.num_agents, "state_size": out.state_size}


def _space(s) -> dict:
    shape = tuple(s.shape[i] for i in range(s.ndim))
    out = {"kind": s.kind, "dtype": np.dtype(_DTYPES[s.dtype]), "shape": shape}
    n = int(np.prod(shape)) if shape else 1
    if s.kind == 0:  # BOX
        out["low"] = np.array([s.low[i] for i in range(n)]) if s.low != _FFI.NULL else None
        out["high"] = np.array([s.high[i] for i in range(n)]) if s.high != _FFI.NULL else None
    elif s.kind == 1:
        out["n"] = s.n
    elif s.kind == 2:
        out["nvec"] = [s.nvec[i] for i in range(n)]
    return out


def _flag(name: str) -> int:
    """An ENVD_ENV_* flag's value, from the header the plugins are built against."""
    text = (ocean_build.envd_include() / "envd.h").read_text()
    return 1 << int(re.search(rf"#define {name} \(1u << (\d+)\)", text)[1])


OBS_ROWS = _flag("ENVD_ENV_OBS_ROWS")
OBS_ROWS_PRIVATE = _flag("ENVD_ENV_OBS_ROWS_PRIVATE")


class Instance:
    """One env instance of a plugin, stepped by hand (the host's role).
    bind: bind the env to its obs buffer after init (bind_obs, as the host
    does for an env with ENVD_ENV_OBS_ROWS); scribble: then fill that buffer
    with junk before every step, as a daemon's client can write its rows."""

    def __init__(self, plugin: Plugin, seed: int, bind: bool = False, scribble: bool = False,
                 **kwargs):
        self.p = plugin
        desc = plugin.describe(**kwargs)
        self.desc = desc
        self.agents = desc["agents"]
        self.state = _FFI.new("char[]", desc["state_size"])
        self.rng = _FFI.new("envd_rng_t *")
        obs_shape = (self.agents, *desc["obs"]["shape"])
        self.obs = np.zeros(obs_shape, dtype=desc["obs"]["dtype"])
        self.rewards = np.zeros(self.agents, dtype=np.float64)
        self.terminated = np.zeros(self.agents, dtype=np.bool_)
        self.truncated = np.zeros(self.agents, dtype=np.bool_)
        self.fields = np.zeros(16, dtype=np.float64)
        d = plugin.d
        assert d.seed(self.state, seed) == 0
        assert d.init(self.state, _FFI.new("double[]", plugin.param_values(**kwargs))) == 0
        self.closed = False
        if bind:
            assert d.flags & OBS_ROWS, f"{plugin.env_id} does not write its rows directly"
            assert d.bind_obs(self.state, self._ptr(self.obs, "void *")) == 0
        self.scribble = scribble

    def _ptr(self, array: np.ndarray, ctype: str):
        return _FFI.cast(ctype, array.ctypes.data)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            assert self.p.d.seed(self.state, seed) == 0
        assert self.p.d.reset(self.state, self.rng, self._ptr(self.obs, "void *")) == 0
        return self.obs.copy()

    def step(self, action: np.ndarray) -> tuple:
        action = np.ascontiguousarray(action)
        if self.scribble:
            self.obs.view(np.uint8)[...] = 0x5A
        rc = self.p.d.step(self.state, self.rng, self._ptr(action, "void *"),
                           self._ptr(self.obs, "void *"), self._ptr(self.rewards, "double *"),
                           self._ptr(self.terminated, "bool *"), self._ptr(self.truncated, "bool *"))
        assert rc == 0, rc
        ended = self.p.d.episode_end(self.state, self._ptr(self.fields, "double *"))
        assert ended >= 0
        log = dict(zip(self.p.episode_fields, self.fields.tolist())) if ended else None
        return (self.obs.copy(), self.rewards.copy(), self.terminated.copy(),
                self.truncated.copy(), ended, log)

    def close(self) -> None:
        if not self.closed:
            self.p.d.close(self.state)
            self.closed = True
