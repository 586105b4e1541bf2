"""Python envs hosted in-process: ``envd.make("py:<gymnasium id>", ...)`` or
``envd.make(creator, ...)`` (a callable returning a gymnasium.Env).

A ``HostedVecEnv`` is the same VectorEnv as a built-in env's
(envd.vector_base), stepped through a HostedSession: num_envs instances
spread over num_workers worker processes (contiguous slices), its buffers in
one shared-memory segment the workers write in place (native/hosted_*.py,
native/src/backend_workers.h).  Results equal
``gymnasium.make_vec(id, num_envs, vectorization_mode="sync")`` for any
worker count.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd import leaves
from envd import make_options as options
from envd.buffer_layout import buffer_layout
from envd.cpus import usable_cpus
from envd.errors import NATIVE_CODES, EnvError, InvalidArgumentError, UnknownEnvError
from envd.int_args import seed_list
from envd.make_options import DEFAULT_INFO_BYTES, IN_PROCESS, PYTHON, PYTHON_PREFIX
from envd.native.hosted_segment import Segment, segment_layout
from envd.native.hosted_session import HostedSession, HostedSpec
from envd.native.hosted_template import _describe, template
from envd.stepping import NO_STEPPER
from envd.vector_base import BatchedVecEnv

#: num_workers=None picks workers when a step of all envs costs at least
#: this long on one CPU (native/step_cost.py measures one env's step, the
#: env's own work only).  With 2 workers a step of cost C takes about C/2
#: plus the round trip to the workers, about 20 us on a busy 2-CPU machine
#: (docs/python-envs.md), so workers pay from about 40 us on; a loaded
#: machine delays a worker's wake-up more than the caller's own loop
#: (num_workers=0, like SyncVectorEnv), hence a margin of 5x.  Measured here
#: (gymnasium 1.x), CartPole-v1 costs about 5 us a step and Acrobot-v1 about
#: 25 us: 16 CartPoles (80 us) step in the caller, 16 Acrobots (400 us) get
#: workers, each 2.5x or more away from the limit (docs/benchmarks.md,
#: envd bench --python).
PARALLEL_MIN_STEP_SECONDS = 200e-6


def default_num_workers(num_envs: int, step_seconds: float, cpus: int | None = None) -> int:
    """The worker count num_workers=None picks for num_envs envs whose step
    costs step_seconds (native/step_cost.py measures one env when it is
    described): 0 (step in the caller) when a step of all of them costs
    under PARALLEL_MIN_STEP_SECONDS, or with one usable CPU (`cpus`, default
    envd.cpus.usable_cpus: the affinity within the cgroup quota); else one
    worker per usable CPU, at most num_envs."""
    if cpus is None:
        cpus = usable_cpus()
    if cpus < 2 or num_envs < 2 or num_envs * step_seconds < PARALLEL_MIN_STEP_SECONDS:
        return 0
    return min(cpus, num_envs)


def check_space(space: spaces.Space, what: str, env_name: str) -> None:
    """Box (any dtype), Discrete (any start), MultiDiscrete, MultiBinary and
    Dict/Tuple of them (nested) are hosted; others are refused, naming the
    space and its path (envd.leaves.check_space)."""
    leaves.check_space(space, what, env_name)


def hosted_buffer_layout(observation_space: spaces.Space, action_space: spaces.Space,
                         num_envs: int, mode: AutoresetMode, info_bytes: int,
                         info_columns: Sequence[tuple[str, str, tuple[int, ...]]] = (),
                         num_agents: int = 1, agent_rows: bool = False
                         ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """A hosted session's batch buffers: buffer_layout with float64 rewards
    (as gymnasium's vector envs), info slots of info_bytes per env and,
    with info slots, the info columns ((key, dtype str, shape)); a
    PettingZoo env's (agent_rows) num_agents rows per env (num_envs envs:
    num_envs * num_agents rows, with "agent_mask" whatever num_agents)."""
    return buffer_layout(observation_space, action_space, num_envs * num_agents, mode,
                         reward_dtype=np.float64, info_bytes=info_bytes, num_agents=num_agents,
                         info_columns=info_columns if info_bytes else (),
                         agent_rows=agent_rows)


class HostedVecEnv(BatchedVecEnv):
    """num_envs instances of a Python env, in worker processes or stepped in
    the caller (see make_python)."""

    def __init__(self, spec: HostedSpec, num_envs: int, *, maker: tuple, num_workers: int,
                 seed: int | Sequence[int] | None, autoreset_mode: AutoresetMode,
                 copy: bool, episode_statistics: bool | str, batch_size: int | None,
                 info_bytes: int = DEFAULT_INFO_BYTES, render_mode: str | None = None,
                 render_fps: int | None = None):
        self._session = None
        agents = spec.num_agents
        # (a PettingZoo env's agents are rows, as a C multi-agent env's)
        super().__init__(spec.id, spec.observation_space, spec.action_space, num_envs * agents,
                         autoreset_mode, spec.max_episode_steps, copy, episode_statistics,
                         batch_size, render_mode=render_mode, render_fps=render_fps)
        self.num_agents = agents
        self.batch_size = num_envs if batch_size is None else batch_size  # envs, not rows
        self.envd_spec = spec
        self.num_workers = num_workers
        buffers = hosted_buffer_layout(spec.observation_space, spec.action_space, num_envs,
                                       autoreset_mode, info_bytes, spec.info_columns, agents,
                                       agent_rows=bool(spec.agent_names))
        layout, size = segment_layout(num_envs, num_workers, buffers)
        segment, fd = Segment.create(layout, size)
        try:
            self._bind_buffers({name: segment.arrays[name] for name in buffers})
            self._session = HostedSession(
                spec, num_envs, num_workers=num_workers, autoreset_mode=autoreset_mode,
                maker=maker, segment=segment, fd=fd,
                template=template() if num_workers else None)
        except BaseException:
            segment.close()
            raise
        finally:
            os.close(fd)  # the workers have theirs
        self._use_stepper(self._session)
        if self._session._slice is not None:
            self._infos.inline_infos = self._session._slice.inline_infos
        if seed is None:
            entropy = np.random.SeedSequence().entropy
            assert isinstance(entropy, int)  # (a SeedSequence made without entropy draws an int)
            seed = entropy % 2**63
        seeds = seed_list(seed, num_envs)
        self._buffers["reset_seeds"][:num_envs] = seeds
        self._session.seed()

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' pids (empty with num_workers=0 or once closed)."""
        return list(self._session.pids) if self._session is not None else []

    def _render_frames(self) -> list[Any]:
        # (each env's env.render(), drawn where the env lives: SyncVectorEnv's tuple)
        assert self._session is not None  # render() acquired the env: _acquire() refuses a closed env
        return self._session.env_call({"op": "render"})

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each env's attribute name, called with args and kwargs if it is
        callable (gymnasium's AsyncVectorEnv.call): a tuple of
        num_env_instances results (one per env, not per row: a PettingZoo
        env's attributes are its ParallelEnv's).  With workers, the
        arguments and the results travel as envd.info_codec carries them
        (msgpack, numpy-aware, never pickle): another type is a TypeError;
        "reset", "step" and "close" are refused (ValueError), a missing
        attribute is an AttributeError."""
        return self._env_call({"op": "call", "name": name, "args": list(args),
                               "kwargs": kwargs})

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's attribute name (call(name): a method is called)."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute name of each env (gymnasium's set_attr): values is a
        list or tuple of num_env_instances values (one per env, not per
        row), or one value for every env."""
        envs = self.num_env_instances
        if not isinstance(values, (list, tuple)):
            values = [values] * envs
        if len(values) != envs:
            raise ValueError("Values must be a list or tuple with length equal to the number "
                             f"of environments. Got `{len(values)}` values for "
                             f"{envs} environments.")
        self._env_call({"op": "set_attr", "name": name, "values": list(values)})

    def _env_call(self, request: dict[str, Any]) -> Any:
        self._acquire()
        try:
            assert self._session is not None  # _acquire() refuses a closed env
            return tuple(self._session.env_call(request))
        finally:
            self._claim.append(True)

    def _release(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session, self._stepper = None, NO_STEPPER

    def __repr__(self) -> str:
        return (f"envd.HostedVecEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"num_workers={self.num_workers}, "
                f"autoreset_mode={self.metadata['autoreset_mode']})")


def make_python(env: str | Callable[[], gymnasium.Env], num_envs: int, *,
                num_workers: int | None = None, seed: int | Sequence[int] | None = None,
                autoreset_mode: str | AutoresetMode | None = None,
                max_episode_steps: int | None = None, copy: bool = False,
                episode_statistics: bool | str = True, batch_size: int | None = None,
                info_bytes: int = DEFAULT_INFO_BYTES, name: str | None = None,
                render_mode: str | None = None, **env_kwargs: Any) -> HostedVecEnv:
    """num_envs instances of a Python env stepped for this process (see
    docs/python-envs.md).

    env:   a gymnasium id ("CartPole-v1", or "py:CartPole-v1" as envd.make
           takes it), made with gymnasium.make(id, **env_kwargs); or a
           callable returning a gymnasium.Env (sent to the workers with
           cloudpickle, so a lambda works).
    num_workers: worker processes (contiguous slices of the envs); 0 steps
           them in the caller like SyncVectorEnv; None picks 0 when a step
           of every env is cheap (default_num_workers), else one per CPU.
    info_bytes: the bytes of each env's info slot (its msgpack-encoded
           info must fit; 0: the envs' infos are not carried).
    render_mode: None or "rgb_array": an id is made with it; a creator's
           env must have it already.  render() then returns each env's
           frame, drawn in its worker.
    The other arguments are envd.make's; max_episode_steps overrides the
    id's time limit (a creator's env gets a TimeLimit when it is given).
    """
    options.check_episode_statistics(episode_statistics)
    num_envs = options.check_num_envs(num_envs)
    batch_size = options.check_batch_size(batch_size, num_envs)
    mode = options.check_autoreset_mode(autoreset_mode) or AutoresetMode.NEXT_STEP
    info_bytes = options.check_info_bytes(PYTHON, info_bytes)
    max_episode_steps = options.check_max_episode_steps(PYTHON, max_episode_steps)
    num_workers = options.check_num_workers(num_workers, num_envs, IN_PROCESS)
    options.check_render_mode(render_mode)
    if isinstance(env, str):
        env_id = env.removeprefix(PYTHON_PREFIX)
        try:
            # ("module:Id" ids import their module where the env is made: the
            # template, or this process with num_workers=0, as gymnasium.make does)
            if ":" not in env_id:
                gymnasium.spec(env_id)
        except gymnasium.error.Error as exc:
            raise UnknownEnvError(f"{PYTHON_PREFIX}{env_id}: gymnasium knows no such env "
                                  f"({exc})") from None
        default_name = PYTHON_PREFIX + env_id
        if render_mode is not None:
            env_kwargs = {**env_kwargs, "render_mode": render_mode}
        if ":" in env_id:
            maker = ("id", env_id, max_episode_steps, env_kwargs)
        else:
            # This process's registration travels with the make: the template
            # (forked from an earlier process state) may not have an id
            # registered since (gymnasium.make takes an EnvSpec as an id).
            try:
                maker = ("spec", cloudpickle.dumps(gymnasium.spec(env_id)), max_episode_steps,
                         env_kwargs)
            except Exception:  # noqa: BLE001 -- (a registration cloudpickle cannot carry: by id, as before)
                maker = ("id", env_id, max_episode_steps, env_kwargs)
    elif callable(env):
        if env_kwargs:
            raise InvalidArgumentError(f"env kwargs {sorted(env_kwargs)} are for env ids; "
                                       "an env creator takes its own arguments")
        default_name = PYTHON_PREFIX + getattr(env, "__qualname__", type(env).__name__)
        maker = ("creator", cloudpickle.dumps(env), max_episode_steps, {})
    else:
        raise InvalidArgumentError(f"env must be a gymnasium id or a callable returning a "
                                   f"gymnasium.Env, got {type(env).__name__}")
    return make_hosted(maker, name or default_name, num_envs, num_workers=num_workers,
                       seed=seed, autoreset_mode=mode, max_episode_steps=max_episode_steps,
                       copy=copy, episode_statistics=episode_statistics, batch_size=batch_size,
                       info_bytes=info_bytes, render_mode=render_mode)


def make_hosted(maker: tuple, name: str, num_envs: int, *, num_workers: int | None,
                seed: int | Sequence[int] | None, autoreset_mode: AutoresetMode,
                max_episode_steps: int | None, copy: bool, episode_statistics: bool | str,
                batch_size: int | None, info_bytes: int,
                render_mode: str | None) -> HostedVecEnv:
    """The HostedVecEnv of num_envs envs of maker (native/hosted_template.py's
    description: a gymnasium env's, or a PettingZoo env's, "parallel", whose
    agents are rows), the arguments checked by the caller: the env
    described (in the template unless it runs here), its spaces checked."""
    # The template describes the env (importing its module there, once) unless
    # it is to run in the caller anyway; always when it is to render: the
    # description draws a frame, which may abort a process (MuJoCo without
    # an OpenGL, twice), so never in the caller's.
    in_template = num_workers != 0 or render_mode is not None
    try:
        described = template().request({"op": "describe", "spec": maker}) \
            if in_template else _describe(maker)
    except Exception as exc:  # noqa: BLE001 -- the env's own code (the template says "Type: message")
        text = str(exc) if isinstance(exc, RuntimeError) and in_template \
            else f"{type(exc).__name__}: {exc}"
        raise EnvError(f"{name}: making the env failed: {text}", NATIVE_CODES["EENV"]) from None
    for what in ("observation", "action"):
        check_space(described[f"{what}_space"], what, name)
    options.check_rows(name, num_envs, described["num_agents"])  # (a PettingZoo env's agents)
    if render_mode is not None and described["render_mode"] != render_mode:
        raise InvalidArgumentError(
            f"{name}: render_mode={render_mode!r}, but its env's render_mode is "
            f"{described['render_mode']!r} (an env creator makes its env with the render "
            "mode itself)")
    if render_mode is not None and described["render_error"]:
        raise InvalidArgumentError(
            f"{name}: render_mode={render_mode!r}: its env cannot draw a frame here "
            f"({described['render_error']:.300}); a MuJoCo env needs an offscreen OpenGL in "
            "its workers: MUJOCO_GL=egl or MUJOCO_GL=osmesa, with that library installed")
    if num_workers is None:
        num_workers = default_num_workers(num_envs, described["step_seconds"])
    elif num_workers > (cpus := usable_cpus()):
        warnings.warn(f"{name}: num_workers={num_workers} is more than the {cpus} CPUs this "
                      "process may use; the workers will take turns", stacklevel=4)
    spec = HostedSpec(name, described["observation_space"], described["action_space"],
                      max_episode_steps or described["max_episode_steps"],
                      info_columns=described["info_columns"],
                      num_agents=described["num_agents"],
                      agent_names=tuple(described["possible_agents"]))
    vec = HostedVecEnv(spec, num_envs, maker=maker, num_workers=num_workers, seed=seed,
                       autoreset_mode=autoreset_mode, copy=copy,
                       episode_statistics=episode_statistics, batch_size=batch_size,
                       info_bytes=info_bytes,
                       render_mode=render_mode, render_fps=described["render_fps"])
    vec.agent_names = tuple(described.get("possible_agents", ()))
    return vec
