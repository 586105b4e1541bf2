"""The env registry: ids -> EnvSpec, built from the C definitions.

An EnvSpec mirrors one ``envd_env_def_t`` in Python terms (gymnasium spaces,
typed parameters, info fields) and validates the kwargs of ``make`` against
it, so a bad call fails in Python with a message that lists what is accepted.
The registry holds the built-ins and the envs of every plugin loaded with
``load_plugin``; it is per process, and a plugin's envs stay for its life.
"""
from __future__ import annotations

import difflib
import math
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from gymnasium import spaces

from envd.errors import InvalidArgumentError, PluginError, UnknownEnvError
from envd.native._envd_native import ffi, lib

DTYPES: dict[int, np.dtype[Any]] = {
    lib.ENVD_DTYPE_FLOAT32: np.dtype(np.float32),
    lib.ENVD_DTYPE_FLOAT64: np.dtype(np.float64),
    lib.ENVD_DTYPE_INT64: np.dtype(np.int64),
    lib.ENVD_DTYPE_INT32: np.dtype(np.int32),
    lib.ENVD_DTYPE_UINT8: np.dtype(np.uint8),
    lib.ENVD_DTYPE_BOOL: np.dtype(np.bool_),
    lib.ENVD_DTYPE_INT8: np.dtype(np.int8),
}
PARAM_TYPES = {lib.ENVD_PARAM_FLOAT: "float", lib.ENVD_PARAM_INT: "int", lib.ENVD_PARAM_BOOL: "bool"}


@dataclass(frozen=True)
class ParamSpec:
    """One construction parameter (kwarg of make) of an env."""

    name: str
    type: str  # "float", "int" or "bool"
    default: float | int | bool
    min_value: float
    max_value: float
    doc: str

    def describe(self) -> str:
        bounds = "" if self.type == "bool" else \
            f" in [{self._bound(self.min_value)}, {self._bound(self.max_value)}]"
        return f"{self.name} ({self.type}{bounds}, default {self.default!r})"

    def _bound(self, value: float) -> str:
        """A bound as written: an int parameter's in full (2147483647, not
        2.14748e+09), a float's in %g."""
        if self.type == "int" and math.isfinite(value):
            return str(int(value))
        return f"{value:g}"

    def coerce(self, env_id: str, value: Any) -> float:
        """The value as the double the C init receives, or InvalidArgumentError."""
        is_bool = isinstance(value, (bool, np.bool_))
        is_int = isinstance(value, (int, np.integer)) and not is_bool
        is_float = isinstance(value, (float, np.floating))
        ok = {"bool": is_bool, "int": is_int, "float": is_int or is_float}[self.type]
        if not ok:
            raise InvalidArgumentError(
                f"{env_id}: parameter {self.name!r} must be a {self.type}, got "
                f"{type(value).__name__} {value!r}; expected {self.describe()}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond double range
            number = math.inf
        if math.isnan(number) or not self.min_value <= number <= self.max_value:
            raise InvalidArgumentError(
                f"{env_id}: parameter {self.name!r}={value!r} is out of range; "
                f"expected {self.describe()}")
        return number


@dataclass(frozen=True)
class InfoFieldSpec:
    """An array the env publishes in info[name] after every reset and step."""

    name: str
    shape: tuple[int, ...]  # per env
    dtype: np.dtype
    doc: str


@dataclass(frozen=True)
class EnvSpec:
    """A registered env: its spaces, default time limit and parameters."""

    id: str
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    max_episode_steps: int | None
    num_agents: int
    params: tuple[ParamSpec, ...]
    info_fields: tuple[InfoFieldSpec, ...]
    definition: Any  # cdata 'const envd_env_def_t *'; kept alive by its library
    origin: str  # "builtin" or the path of the plugin that defined it
    #: (height, width, 3) of its rgb_array frames, None when it does not render
    render_shape: tuple[int, int, int] | None = None
    render_fps: int | None = None
    #: ABI 5: the env starts its next episode inside step (ENVD_ENV_RESETS_ITSELF):
    #: no autoreset, no time limit, episodes from its own log
    resets_itself: bool = False
    #: ABI 5: the names of its episode log (info["envd_log"]), in order
    episode_fields: tuple[str, ...] = ()
    #: ABI 5: the definition with a describe callback, whose spaces depend on
    #: the params (``definition`` is then its description at the defaults, or
    #: at a make's params: see described); None for a static definition
    describing: Any = None
    #: keeps the described definition's memory alive (cdata of envd_described_t)
    keep: Any = field(default=None, repr=False, compare=False)

    @property
    def render_modes(self) -> list[str]:
        """The render modes it supports (gymnasium's metadata["render_modes"])."""
        return ["rgb_array"] if self.render_shape else []

    def check_render_mode(self, render_mode: Any) -> str | None:
        """render_mode as make accepts it: None or "rgb_array" for an env that renders."""
        if render_mode is None or (render_mode == "rgb_array" and self.render_shape):
            return None if render_mode is None else "rgb_array"
        if render_mode == "rgb_array":
            raise InvalidArgumentError(
                f"{self.id} does not render (its definition has no render callback): "
                "make it with render_mode=None")
        raise InvalidArgumentError(
            f"{self.id}: render_mode must be None or {' or '.join(map(repr, self.render_modes))}, "
            f"got {render_mode!r:.100}")

    @property
    def described_bytes(self) -> int:
        """Bytes of the arrays its description holds (0 for a static definition)."""
        return int(lib.envd_described_bytes(self.keep)) if self.keep is not None else 0

    @property
    def heap_bytes(self) -> int:
        """The most bytes one env allocates itself outside its state block
        (describe's heap_bytes; 0 for a static definition)."""
        return int(lib.envd_described_heap_bytes(self.keep)) if self.keep is not None else 0

    @property
    def describes(self) -> bool:
        """Its spaces, agents and state size depend on the params (ABI 5 describe)."""
        return self.describing is not None

    def described(self, params: list[float], num_envs: int) -> EnvSpec:
        """The spec of a make with these params (param_values' result: one
        row of values for every env, or num_envs rows): itself for a static
        definition; else its definition described by C for them, whose
        memory lives as long as the returned spec (keep it while a vec uses
        its definition).  InvalidArgumentError when describe fails, gives an
        invalid description or describes two envs of the make differently."""
        if self.describing is None:
            return self
        width = len(self.params)
        rows = num_envs if width and len(params) == num_envs * width else 1
        return _describe(self.describing, params, rows, self.origin)

    def param_values(self, kwargs: dict[str, Any], arguments: Iterable[str] = (),
                     num_envs: int = 1) -> list[float]:
        """Validate make's env kwargs; return every env's parameters: num_envs
        rows of every parameter in declaration order, flattened (env i's values
        at [i * len(params), (i + 1) * len(params))), as the C vec takes them.

        A kwarg is a scalar (every env) or a list/tuple/1-d array of num_envs
        values (one per env), each checked.  arguments: the names of make's own
        keyword arguments (seed...), which a mistyped one lands among the env
        kwargs as: an unknown name close to a parameter or to one of these gets
        a "did you mean" in the error."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(kwargs) - set(known), key=str)  # names may be str and bytes
        if unknown:
            accepted = ", ".join(p.describe() for p in self.params) or "none"
            named = ", ".join(repr(name) + (self._hint(name, arguments) if i < _SUGGESTED_NAMES
                                             else "") for i, name in enumerate(unknown))
            raise InvalidArgumentError(
                f"{self.id} has no parameter {named}; its parameters are: {accepted}")
        columns = [self._per_env(p, kwargs[p.name], num_envs) if p.name in kwargs
                   else [float(p.default)] * num_envs for p in self.params]
        return [column[i] for i in range(num_envs) for column in columns]

    def _per_env(self, param: ParamSpec, value: Any, num_envs: int) -> list[float]:
        """num_envs checked doubles of one kwarg: a scalar repeated, or a list
        of exactly num_envs values (EnvPool issue #309)."""
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if not isinstance(value, (list, tuple, np.ndarray)):
            return [param.coerce(self.id, value)] * num_envs
        if isinstance(value, np.ndarray) and value.ndim != 1:
            raise InvalidArgumentError(
                f"{self.id}: parameter {param.name!r} must be a scalar or a 1-d list of "
                f"num_envs={num_envs} values, got an array of shape {value.shape}")
        if len(value) != num_envs:
            raise InvalidArgumentError(
                f"{self.id}: parameter {param.name!r} has {len(value)} values but "
                f"num_envs={num_envs}; give one value per env, or a scalar for all")
        values = value.tolist() if isinstance(value, np.ndarray) else value
        checked = []
        for i, item in enumerate(values):
            try:
                checked.append(param.coerce(self.id, item))
            except InvalidArgumentError as error:
                raise InvalidArgumentError(f"{error} (env {i} of the list)") from None
        return checked

    def _hint(self, name: Any, arguments: Iterable[str]) -> str:
        """' (did you mean ...?)' for a mistyped kwarg name, else ''."""
        params = [p.name for p in self.params]
        choices = params + [a for a in arguments if a not in params]
        close = did_you_mean(name, choices) if isinstance(name, str) else []
        if not close:
            return ""
        spelled = [repr(c) if c in params else f"make's argument {c!r}" for c in close]
        return f" (did you mean {' or '.join(spelled)}?)"


#: Names longer than this get no suggestion, and only the first few unknown
#: kwargs get one: a mistyped name is short and comes alone, and the daemon
#: must not spend time matching whatever a client sends.
_SUGGEST_MAX_CHARS = 100
_SUGGESTED_NAMES = 8


def did_you_mean(word: str, choices: Iterable[str]) -> list[str]:
    """The choices close to a mistyped word, best first (at most three;
    difflib's similarity, ignoring case, so "cartpole-v1" finds "CartPole-v1")."""
    if len(word) > _SUGGEST_MAX_CHARS:
        return []
    folded: dict[str, str] = {}
    for choice in choices:
        folded.setdefault(choice.lower(), choice)
    return [folded[match] for match in difflib.get_close_matches(word.lower(), folded, n=3)]


def _unbounded(dtype: np.dtype[Any]) -> tuple[float, float]:
    """The bounds of a Box without bounds (NULL low/high): its dtype's range."""
    if dtype.kind == "f":
        return -np.inf, np.inf
    if dtype.kind == "b":
        return 0, 1
    return np.iinfo(dtype).min, np.iinfo(dtype).max


def _space(c_space: Any) -> spaces.Space[Any]:
    dtype = DTYPES[c_space.dtype]
    if c_space.kind == lib.ENVD_SPACE_DISCRETE:
        return spaces.Discrete(int(c_space.n), start=int(c_space.start))
    shape = tuple(int(c_space.shape[i]) for i in range(c_space.ndim))
    numel = int(np.prod(shape, dtype=np.int64))
    if c_space.kind == lib.ENVD_SPACE_MULTI_BINARY:
        return spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
    if c_space.kind == lib.ENVD_SPACE_MULTI_DISCRETE:
        # nvec and nvec_start share low's and high's storage (envd.h): int64 arrays
        nvec = _int64s(c_space.low, numel).reshape(shape)
        start = (np.zeros(shape, np.int64) if c_space.high == ffi.NULL
                 else _int64s(c_space.high, numel).reshape(shape))
        return spaces.MultiDiscrete(nvec, dtype=np.int64, start=start)
    if c_space.low == ffi.NULL or c_space.high == ffi.NULL:
        low, high = (np.full(shape, bound, dtype) for bound in _unbounded(dtype))
    else:  # C checked that integer bounds fit their dtype: the casts are exact
        low = np.frombuffer(ffi.buffer(c_space.low, 8 * numel), np.float64).reshape(shape)
        high = np.frombuffer(ffi.buffer(c_space.high, 8 * numel), np.float64).reshape(shape)
    return spaces.Box(low.astype(dtype), high.astype(dtype), shape=shape, dtype=dtype)


def _int64s(pointer: Any, count: int) -> np.ndarray:
    """A copy of count int64 values at a C pointer typed const double *."""
    values: np.ndarray = np.frombuffer(ffi.buffer(ffi.cast("const int64_t *", pointer), 8 * count),
                                       np.int64).copy()
    return values


def _param(c_param: Any) -> ParamSpec:
    kind = PARAM_TYPES[c_param.type]
    default = {"float": float, "int": int, "bool": bool}[kind](c_param.default_value)
    doc = ffi.string(c_param.doc).decode() if c_param.doc != ffi.NULL else ""
    return ParamSpec(ffi.string(c_param.name).decode(), kind, default,
                     float(c_param.min_value), float(c_param.max_value), doc)


def _info_field(c_field: Any) -> InfoFieldSpec:
    doc = ffi.string(c_field.doc).decode() if c_field.doc != ffi.NULL else ""
    return InfoFieldSpec(ffi.string(c_field.name).decode(),
                         tuple(int(c_field.shape[i]) for i in range(c_field.ndim)),
                         DTYPES[c_field.dtype], doc)


def _render_info(definition: Any) -> tuple[tuple[int, int, int] | None, int | None]:
    """(frame shape, fps) of a definition that renders, else (None, None).  Asked
    of C, which reads the ABI 3 fields only from ABI 3 definitions."""
    size = ffi.new("int32_t[3]")
    if not lib.envd_env_def_render_info(definition, size, size + 1, size + 2):
        return None, None
    return (int(size[1]), int(size[0]), 3), int(size[2])


def _describe(definition: Any, params: list[float], rows: int, origin: str) -> EnvSpec:
    """The spec of a describing definition described for rows rows of params."""
    out = ffi.new("envd_described_t **")
    error = ffi.new("char[]", _ERROR_BYTES)
    values = ffi.new("double[]", list(params) or [0.0])
    rc = lib.envd_describe(out, definition, values, rows, error, _ERROR_BYTES)
    if rc != lib.ENVD_OK:
        # (ENVD_ENOMEM too: describe's allocations are bounded, and the
        # params that asked for more are the caller's)
        raise InvalidArgumentError(ffi.string(error).decode(errors="replace")
                                   or f"describe: {ffi.string(lib.envd_strerror(rc)).decode()}")
    described = ffi.gc(out[0], lib.envd_described_free)
    spec = _static_spec(lib.envd_described_def(described), origin)
    return replace(spec, describing=definition, keep=described)


def spec_from_definition(definition: Any, origin: str = "builtin") -> EnvSpec:
    """Build the EnvSpec of a validated C env definition: for one whose
    spaces depend on its params (ABI 5 describe), the spec of its description
    at the params' defaults (ValueError when that fails)."""
    if lib.envd_env_def_describes(definition):
        defaults = [float(definition.params[i].default_value)
                    for i in range(definition.num_params)]
        try:
            return _describe(definition, defaults, 1, origin)
        except InvalidArgumentError as e:
            raise ValueError(f"describe fails at the default params: {e}") from None
    return _static_spec(definition, origin)


def _static_spec(definition: Any, origin: str) -> EnvSpec:
    render_shape, render_fps = _render_info(definition)
    v5 = lib.envd_env_def_v5(definition)  # NULL before ABI 5: no flags, no log
    resets_itself = v5 != ffi.NULL and bool(v5.flags & lib.ENVD_ENV_RESETS_ITSELF)
    episode_fields = () if v5 == ffi.NULL else tuple(
        ffi.string(v5.episode_fields[k]).decode() for k in range(v5.num_episode_fields))
    return EnvSpec(
        id=ffi.string(definition.id).decode(),
        observation_space=_space(definition.observation_space),
        action_space=_space(definition.action_space),
        max_episode_steps=int(definition.max_episode_steps) or None,
        num_agents=int(definition.num_agents),
        params=tuple(_param(definition.params[i]) for i in range(definition.num_params)),
        info_fields=tuple(_info_field(definition.info_fields[i])
                          for i in range(definition.num_info_fields)),
        definition=definition,
        origin=origin,
        render_shape=render_shape,
        render_fps=render_fps,
        resets_itself=resets_itself,
        episode_fields=episode_fields,
    )


def _builtin_specs() -> dict[str, EnvSpec]:
    specs = {}
    for i in range(lib.envd_builtin_count()):
        definition = lib.envd_builtin_get(i)
        rc = lib.envd_env_def_validate(definition)
        if rc != lib.ENVD_OK:  # a broken build, not a user error
            raise RuntimeError(f"built-in env #{i} is invalid: {ffi.string(lib.envd_strerror(rc))}")
        spec = spec_from_definition(definition)
        specs[spec.id] = spec
    return specs


_REGISTRY: dict[str, EnvSpec] = _builtin_specs()
# Plugins loaded so far, by file identity (st_dev, st_ino) -> their env ids:
# loading the same file again (any path to it) is a no-op.
_PLUGINS: dict[tuple[int, int], list[str]] = {}
_PLUGIN_LOCK = threading.Lock()
_ERROR_BYTES = 512


def _plugin_specs(path: str, table: Any) -> list[EnvSpec]:
    """The specs of a plugin's table, or PluginError: its ids must be new and
    distinct, and its strings must be text."""
    try:
        specs = [spec_from_definition(table.envs[i], origin=path) for i in range(table.num_envs)]
    except (UnicodeDecodeError, ValueError) as e:  # bytes that are not UTF-8, a bad space
        raise PluginError(f"plugin {path}: an env definition cannot be read: {e}") from None
    ids = [spec.id for spec in specs]
    for env_id in ids:
        if ids.count(env_id) > 1:
            raise PluginError(f"plugin {path}: it defines env id {env_id!r} twice")
        if env_id in _REGISTRY:
            origin = _REGISTRY[env_id].origin
            why = ("an earlier build of this file is loaded; loaded plugins are never "
                   "unloaded, so load a rebuilt plugin in a new process"
                   if origin == path else "ids must be unique")
            raise PluginError(f"plugin {path}: env id {env_id!r} is already registered "
                              f"(by {origin}); {why}")
    return specs


def load_plugin(path: str | os.PathLike[str]) -> list[str]:
    """Load the envs of a plugin library (see "plugins" in envd.h) into this
    process's registry and return their ids.  All or nothing: a missing file,
    a missing entry symbol, another ABI version, an invalid definition or an
    id already registered raises PluginError naming the problem and registers
    nothing.  Loading a plugin again returns its ids without reloading it.
    The ids are also registered with gymnasium as ``envd/<id>``
    (envd.gymnasium_registry.register_env_ids)."""
    if not isinstance(path, (str, os.PathLike)):
        raise PluginError(f"a plugin path must be a str or path, got {type(path).__name__}")
    path = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(path)
    except OSError as e:
        raise PluginError(f"plugin {path}: {e.strerror}") from None
    with _PLUGIN_LOCK:
        key = (st.st_dev, st.st_ino)
        if key in _PLUGINS:
            return list(_PLUGINS[key])
        out = ffi.new("const envd_plugin_t **")
        handle = ffi.new("void **")
        error = ffi.new("char[]", _ERROR_BYTES)
        rc = lib.envd_plugin_open(path.encode(), out, handle, error, _ERROR_BYTES)
        if rc != lib.ENVD_OK:
            raise PluginError(f"plugin {path}: {ffi.string(error).decode(errors='replace')}")
        try:
            specs = _plugin_specs(path, out[0])
        except BaseException:
            lib.envd_plugin_unload(handle[0])  # nothing uses it yet: a rebuild can load
            raise
        ids = [spec.id for spec in specs]
        _REGISTRY.update(zip(ids, specs))
        _PLUGINS[key] = ids
    # gymnasium.make_vec("envd/<id>") for the plugin's envs too
    from envd.gymnasium_registry import register_env_ids
    register_env_ids(ids)
    return list(ids)


def list_envs() -> list[str]:
    """Ids of every env make() accepts, sorted."""
    return sorted(_REGISTRY)


def get_spec(env_id: str) -> EnvSpec:
    """The EnvSpec registered under env_id, or UnknownEnvError listing the known
    ids (and the closest ones first, when env_id looks like a typo of them)."""
    if not isinstance(env_id, str):
        raise InvalidArgumentError(f"env_id must be a str, got {type(env_id).__name__}")
    try:
        return _REGISTRY[env_id]
    except KeyError:
        close = did_you_mean(env_id, _REGISTRY)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise UnknownEnvError(
            f"unknown env id {env_id!r}{hint}; known ids: {', '.join(list_envs())}") from None
