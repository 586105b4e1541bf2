"""One VecEnv over many daemons: ``envd.connect([endpoint, ...]).make(...)``.

A MultiClient holds one Client per daemon.  Its ``make`` spreads num_envs
over the daemons in proportion to their worker threads and returns a
MultiVecEnv: one gymnasium VectorEnv whose env i lives on some daemon as a
shard (a RemoteVecEnv of consecutive envs) but behaves exactly as env i of
``envd.make(env_id, num_envs, seed=seed)``: it gets seed + i, and its
observations, rewards, terminations, truncations and info are bit-identical
however many daemons serve the envs.

How that holds by construction: a MultiVecEnv is itself a BatchedVecEnv over
batch buffers of num_envs rows in this process.  A step checks the actions
(with global env indices, so errors read as the single env's), posts every
shard a step with its slice of the actions and waits for all of them, on the
calling thread (client/multi_async.py's ShardsStepper, over each shard's
transport's non-blocking half: the daemons step at once), and copies each
shard's batch buffers into its rows.  Calls without a non-blocking half
(connect, make, reset, close) go to every daemon at once from a small
persistent thread pool (one worker per daemon but one; pyzmq releases the
GIL while it waits).  The info dict
is then built from the merged buffers by the same code as for one env, so it
is the single env's info (arrays along axis 0 in env order, the episode
statistics, ``final_obs``/``final_info`` and their masks, the env's own
info fields) without a merge of dicts that could drift from it.

Async mode (``make(..., batch_size=B)`` with B < num_envs) steps through
the same ShardsStepper, over each shard's
transport (the sockets, or the doorbells where every shard has the fast
path): send gives each daemon its part, the trainer waits on every daemon
with envs in flight at once, and recv returns exactly B envs in the order
they were found finished across the daemons (multi_async.py's docstring has
the rules).  Each daemon must serve it (its hello's ``recv_min`` capability).
"""
from __future__ import annotations

import re
import secrets
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd import leaves, protocol
from envd import make_options as options
from envd.autoreset import RESETS_ITSELF, autoreset_mode_name, mark_resets_itself
from envd.client import connection
from envd.client.channel import Channel
from envd.client.discovery import is_dns_url, resolve
from envd.client.multi_async import LostDaemon, ShardPart, ShardsHost, ShardsStepper
from envd.client.remote_vector_env import RemoteVecEnv
from envd.client.transports import DoorbellStepper
from envd.errors import (
    ConnectionLostError,
    EnvdError,
    EnvError,
    EnvStateError,
    InvalidActionError,
    InvalidArgumentError,
    NativeError,
)
from envd.int_args import seed_list
from envd.send_row_checks import SendRowChecks
from envd.vec_errors import action_out_of_range
from envd.vector_base import BatchedVecEnv


def split_envs(weights: Sequence[int], num_envs: int) -> list[int]:
    """How many of num_envs envs each daemon gets, in proportion to weights
    (their worker threads; a weight below 1 counts as 1).

    Largest-remainder rounding (ties: the heavier daemon, then the earlier
    one); every daemon gets at least one env when num_envs >= len(weights)
    (taken from the daemon with the most, the earlier among equals), else
    one env each goes to the num_envs heaviest daemons (earlier among equals).
    Deterministic: the same weights always give the same split."""
    weights = [max(1, int(w)) for w in weights]
    n = len(weights)
    if n == 0:
        raise InvalidArgumentError("no daemon to spread envs over")
    if num_envs < n:
        chosen = set(sorted(range(n), key=lambda i: (-weights[i], i))[:num_envs])
        return [1 if i in chosen else 0 for i in range(n)]
    total = sum(weights)
    counts = [num_envs * w // total for w in weights]
    remainders = [num_envs * w % total for w in weights]
    left = num_envs - sum(counts)
    for i in sorted(range(n), key=lambda i: (-remainders[i], -weights[i], i))[:left]:
        counts[i] += 1
    for i in range(n):
        if counts[i] == 0:  # a light daemon among heavy ones: it still gets one
            donor = max(range(n), key=lambda j: (counts[j], -j))
            counts[donor] -= 1
            counts[i] = 1
    return counts


def _run_all(call: Callable[[int], Any], indices: Sequence[int],
             executor: ThreadPoolExecutor | None) -> list[tuple[int, Any, BaseException | None]]:
    """call(i) for every i at once: the first on this thread, the others on
    the executor; waits for all of them (so none runs on after this returns)
    and returns (i, result, error) in the order of indices."""
    indices = list(indices)
    here = indices[:1] if executor is not None else indices
    futures = [(i, executor.submit(call, i)) for i in indices[1:]] if executor is not None else []
    outcomes: list[tuple[int, Any, BaseException | None]] = []
    for i in here:
        try:
            outcomes.append((i, call(i), None))
        except BaseException as exc:  # noqa: BLE001 -- reported after the others finish
            outcomes.append((i, None, exc))
    for i, future in futures:
        try:
            outcomes.append((i, future.result(), None))
        except BaseException as exc:  # noqa: BLE001
            outcomes.append((i, None, exc))
    return outcomes


#: the row a shard's env failure names ("env 4 failed ...", "env 4 raised ...":
#: step_error's and the hosted workers' words; "env id N" is an id, never a row)
_ROW_NAMED = re.compile(r"\benv (\d+)\b(?! id)")


def _naming(exc: BaseException, endpoint: str, where: str = "",
            first_row: int = 0) -> BaseException:
    """exc, or the same envd error with a message that names the daemon's
    endpoint (a trainer driving many daemons must know which one failed).
    A refused argument is refused alike by every daemon and by envd.make: it
    keeps envd.make's message.  first_row: the shard's first row in this
    env's numbering; the row the daemon's message names (its own numbering,
    from 0) is translated to this env's (the one place a MultiVecEnv maps
    them; errors name rows, a multi-agent env's first row for its failure,
    docs/writing-envs.md)."""
    if (not isinstance(exc, EnvdError) or endpoint in str(exc)
            or isinstance(exc, (InvalidArgumentError, InvalidActionError))):
        return exc
    text = str(exc)
    if first_row:
        text = _ROW_NAMED.sub(lambda m: f"env {int(m.group(1)) + first_row}", text, count=1)
    message = f"{text} (the daemon at {endpoint}{where})"
    named: EnvdError
    try:
        if isinstance(exc, EnvError):
            index = exc.env_index + first_row if exc.env_index >= 0 else exc.env_index
            named = EnvError(message, exc.code, index)
        elif isinstance(exc, NativeError):
            named = NativeError(message, exc.code)
        else:
            named = type(exc)(message)
    except Exception:  # noqa: BLE001 -- a subclass with another signature: keep it as it is
        return exc
    named.error_code = exc.error_code
    return named


def _raise_first(outcomes: list[tuple[int, Any, BaseException | None]],
                 endpoints: Sequence[str], where: Callable[[int], str] = lambda i: "",
                 first_row: Callable[[int], int] = lambda i: 0) -> None:
    for i, _, error in outcomes:
        if error is not None:
            named = _naming(error, endpoints[i], where(i), first_row(i))
            if named is error:
                raise error
            raise named from error


def _check_max_threads(max_threads: Any, statuses: list[dict[str, Any]],
                       endpoints: Sequence[str]) -> None:
    """make's max_threads (None: no cap) against every daemon's pool, before
    any daemon makes anything: the daemons' --threads may differ, so the
    refusal names the daemon whose pool is smallest (the cap applies on each)."""
    threads, endpoint = min((int(status["threads"]), endpoint)
                            for status, endpoint in zip(statuses, endpoints))
    options.check_max_threads(max_threads, threads, f"the daemon at {endpoint}: its")


def _shard_kwargs(env_id: str, kwargs: dict[str, Any], num_envs: int,
                  rows: slice) -> dict[str, Any]:
    """A shard's make kwargs: a C env's per-env kwarg (a list, tuple or
    1-d array of num_envs values, one per env: native/registry.py) gives the
    shard the values of its envs, so env i keeps its own value wherever it
    runs; anything else goes to every shard as it is (a kind without
    per_env_kwargs, e.g. a hosted "py:" env, takes whole values, never split)."""
    if not options.env_kind(env_id).per_env_kwargs:
        return kwargs
    split = {}
    for name, value in kwargs.items():
        if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray)
                                                and value.ndim == 1):
            if len(value) != num_envs:  # (each shard would name its own num_envs)
                raise InvalidArgumentError(
                    f"{env_id}: parameter {name!r} has {len(value)} values but "
                    f"num_envs={num_envs}; give one value per env, or a scalar for all")
            value = value[rows]
        split[name] = value
    return split


class MultiClient:
    """Connections to several envd daemons used as one (see envd.connect).

    ``clients`` and ``endpoints`` list them in connection order; ``make``
    returns a MultiVecEnv spread over all of them."""

    def __init__(self, endpoints: Sequence[str], **connect_kwargs: Any):
        """Connect to every endpoint (``dns+tcp://NAME:PORT`` entries stand
        for every address NAME resolves to); connect_kwargs (timeout, ...)
        go to each envd.connect."""
        self.closed = False
        self.clients: tuple[connection.Client, ...] = ()
        self._envs: weakref.WeakSet[MultiVecEnv] = weakref.WeakSet()
        if isinstance(endpoints, str) or not isinstance(endpoints, (list, tuple)):
            raise InvalidArgumentError(
                f"endpoints must be a list of endpoint strings, got {type(endpoints).__name__}")
        expanded: list[str] = []
        for endpoint in endpoints:
            if not isinstance(endpoint, str):
                raise InvalidArgumentError(
                    f"every endpoint must be a str ('ipc:///path', 'tcp://host:port' or "
                    f"'dns+tcp://name:port'), got {endpoint!r}")
            expanded.extend(resolve(endpoint) if is_dns_url(endpoint) else [endpoint])
        if not expanded:
            raise InvalidArgumentError(
                "envd.connect needs at least one endpoint, got an empty list")
        self.endpoints = tuple(expanded)
        # One worker per daemon but one (the calling thread serves the first):
        # connects, status and makes wait on every daemon at once.
        self._executor = (ThreadPoolExecutor(len(expanded) - 1, "envd-multiclient")
                          if len(expanded) > 1 else None)
        outcomes = self._run(lambda i: connection.connect(self.endpoints[i], **connect_kwargs))
        clients = [client for _, client, error in outcomes if error is None]
        if len(clients) < len(outcomes):
            for client in clients:
                client.close()
            self._shutdown()
            self.closed = True
            _raise_first(outcomes, self.endpoints)
        self.clients = tuple(clients)

    def _run(self, call: Callable[[int], Any]) -> list[tuple[int, Any, BaseException | None]]:
        return _run_all(call, range(len(self.endpoints)), self._executor)

    def _check_open(self) -> None:
        if self.closed:
            raise EnvStateError(f"this MultiClient of {len(self.endpoints)} daemons is closed")

    def status(self) -> list[dict[str, Any]]:
        """Every daemon's status (see Client.status), in the order of ``endpoints``."""
        self._check_open()
        outcomes = self._run(lambda i: self.clients[i].status())
        _raise_first(outcomes, self.endpoints)
        return [status for _, status, _ in outcomes]

    def make(self, env_id: str, num_envs: int, *, seed: int | Sequence[int] | None = None,
             autoreset_mode: str | AutoresetMode | None = None,
             max_episode_steps: int | None = None, copy: bool = False,
             episode_statistics: bool | str = True, batch_size: int | None = None,
             **env_kwargs: Any) -> MultiVecEnv:
        """num_envs envs of env_id spread over the daemons in proportion to
        their threads (see split_envs); arguments as Client.make (env_kwargs
        and other keywords go to every daemon's make, a per-env list split:
        each daemon gets its own envs' values).  Env i gets seed + i
        (or the i-th seed of a list) wherever it runs, so the env behaves as
        ``envd.make(env_id, num_envs, seed=seed, ...)`` bit for bit.

        batch_size < num_envs: async mode across the daemons (see
        client/multi_async.py); every daemon must serve it (recv_min)."""
        self._check_open()
        if not isinstance(env_id, str):
            raise InvalidArgumentError(f"env_id must be a str, got {type(env_id).__name__}")
        num_envs = options.check_num_envs(num_envs)
        options.check_episode_statistics(episode_statistics)  # before any daemon makes anything
        kind = options.env_kind(env_id)
        kind.refuse_place(options.MULTI_DAEMON, env_id)
        if env_kwargs.get("render_mode") is not None:
            raise InvalidArgumentError(
                "render_mode is not served across several daemons: make the env to record "
                f"on one daemon, e.g. envd.connect({self.endpoints[0]!r}).make(..., "
                "render_mode='rgb_array')")
        # seed=None: one random base seed for all daemons, env i then gets
        # base + i as in envd.make (each daemon drawing its own would not).
        seeds = seed_list(secrets.randbelow(2**63) if seed is None else seed, num_envs)
        mode = options.check_autoreset_mode(autoreset_mode) or AutoresetMode.NEXT_STEP
        batch_size = options.check_batch_size(batch_size, num_envs)
        if batch_size is not None and batch_size < num_envs:
            for client in self.clients:
                caps = client.capabilities
                if not (caps.async_mode and caps.recv_min):
                    raise InvalidArgumentError(
                        f"batch_size={batch_size} < num_envs={num_envs} asks for async mode "
                        f"across {len(self.clients)} daemons, which the daemon at "
                        f"{client.endpoint} does not serve (its hello's capabilities lack "
                        "'recv_min': an older envd); upgrade it, or make the env on one "
                        "daemon")
        statuses = self.status()
        _check_max_threads(env_kwargs.get("max_threads"), statuses, self.endpoints)
        weights = [max(1, int(status["threads"])) for status in statuses]
        counts = split_envs(weights, num_envs)
        env = MultiVecEnv(self, counts, env_id, seeds, mode, copy, episode_statistics,
                          batch_size,
                          {"autoreset_mode": (None if autoreset_mode is None
                                              else autoreset_mode_name(mode)),
                           "max_episode_steps": max_episode_steps,
                           "episode_statistics": episode_statistics, **env_kwargs})
        self._envs.add(env)
        return env

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def close(self) -> None:
        """Close every env made through this client, then every connection.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            for env in list(self._envs):
                env.close()
            self._run(lambda i: self.clients[i].close())  # each swallows a dead daemon's errors
        finally:
            self._shutdown()

    def __enter__(self) -> MultiClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected"
        return f"envd.MultiClient({list(self.endpoints)!r}, {state})"


def _timeout_of(channel: Channel) -> Callable[[], float]:
    """The channel's timeout when called: its Client's, which may change
    after make."""
    return lambda: channel.timeout


def _weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """method (bound), called through a weak reference to its object (a
    stepper holding it keeps no cycle with its env; the env, once dropped,
    is never called: its stepper is dropped with it)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        if bound is None:
            raise EnvStateError("this MultiVecEnv is gone")
        return bound(*args)

    return call


class MultiVecEnv(SendRowChecks, BatchedVecEnv):
    """num_envs envs spread over several daemons, used as one gymnasium
    VectorEnv (see MultiClient.make and the module docstring).

    ``shards`` are the per-daemon RemoteVecEnvs (do not step them yourself),
    ``shard_slices[k]`` the envs shard k holds and ``shard_endpoints[k]`` its
    daemon.  Results are views of this env's own buffers, valid until the next
    step or reset (copies with copy=True), as for any envd VecEnv."""

    def __init__(self, multi: MultiClient, counts: Sequence[int], env_id: str,
                 seeds: np.ndarray, mode: AutoresetMode, copy: bool, episode_statistics: bool | str,
                 batch_size: int | None, make_kwargs: dict[str, Any]):
        self._shards: tuple[RemoteVecEnv, ...] = ()
        self._executor: ThreadPoolExecutor | None = None
        plan = []  # (client, endpoint, slice) of every daemon with envs, in env order
        start = 0
        for client, endpoint, count in zip(multi.clients, multi.endpoints, counts):
            if count:
                plan.append((client, endpoint, slice(start, start + count)))
                start += count
        num_envs = start
        endpoints = [endpoint for _, endpoint, _ in plan]
        executor = (ThreadPoolExecutor(len(plan) - 1, "envd-multivecenv")
                    if len(plan) > 1 else None)

        is_async = batch_size is not None and batch_size < num_envs

        def make_shard(k: int) -> RemoteVecEnv:
            client, _, rows = plan[k]
            shard = client.make(env_id, rows.stop - rows.start, seed=seeds[rows], copy=False,
                                **_shard_kwargs(env_id, make_kwargs, num_envs, rows))
            assert isinstance(shard, RemoteVecEnv)  # (a kind with a client view: one daemon)
            return shard

        outcomes = _run_all(make_shard, range(len(plan)), executor)
        shards = [shard for _, shard, error in outcomes if error is None]
        try:
            _raise_first(outcomes, endpoints)
            self._check_alike(shards, endpoints)
        except BaseException:
            for shard in shards:
                shard.close()
            if executor is not None:
                executor.shutdown(wait=True)
            raise
        first = shards[0]
        # a multi-agent env's agents are rows (as envd.make's): num_envs counts
        # rows; shards split by env, never inside one
        agents = first.num_agents
        super().__init__(first.env_id, first.single_observation_space, first.single_action_space,
                         num_envs * agents, mode, first.max_episode_steps, copy,
                         episode_statistics, batch_size if is_async else None)
        self.num_agents = agents
        self.episode_fields = first.episode_fields  # (ABI 5: its episode log)
        if first.metadata.get("envd_autoreset") == RESETS_ITSELF:
            mark_resets_itself(self)
        self.agent_names = first.agent_names
        if is_async and batch_size is not None:
            self.batch_size = batch_size  # envs, not rows
        self._shards = tuple(shards)
        self._executor = executor
        self.shard_slices = tuple(rows for _, _, rows in plan)
        #: the rows of shard k's envs in this env's buffers (agents x envs)
        self._row_slices = tuple(slice(envs.start * agents, envs.stop * agents)
                                 for envs in self.shard_slices)
        self.shard_endpoints = tuple(endpoints)
        self._bind_buffers({name: np.zeros((num_envs * agents, *array.shape[1:]), array.dtype)
                            for name, array in first.buffers.items()})
        # what the envs write; the inputs (written by the trainer) are never copied back
        self._outputs = protocol.output_arrays(first.buffers)
        # What the native vec checks per env before it steps any (see
        # validate_step in vec.c), checked here over all envs so that a
        # refused step names the global env index and steps no shard.
        self._started = np.zeros(num_envs, np.bool_)  # per env
        self._all_started = False
        self._init_send_row_checks()  # (_validate_step checks steps alike)
        self._lost = LostDaemon()  # (shared with the async stepper, which reads it per call)
        self._use_stepper(self._shards_stepper(is_async))

    def _shards_stepper(self, is_async: bool) -> ShardsStepper:
        """Over the shards' transports.  Async mode: through the doorbells
        where every shard has the fast path, else over the sockets (a
        shard's doorbell then stops: socket sends and recvs are refused for
        a session the doorbell serves; a sync step waits on each shard's
        own transport, whichever it is).  The stepper holds this env
        weakly, so a dropped env is freed without a cycle."""
        if is_async and not all(shard.fast_path for shard in self._shards):
            for shard in self._shards:
                if shard.fast_path:
                    stepper = shard.stepper
                    assert isinstance(stepper, DoorbellStepper)  # (fast_path)
                    stepper.stop_fast_path()
        host = ShardsHost(
            self.env_id, self.num_agents, self._buffers, tuple(self._outputs),
            run_reset=_weakly(self._run_reset), check_step=_weakly(self._check_step),
            count_done=_weakly(self._count_done),
            copy_results=_weakly(self._copy_results), dispatch=_weakly(self._dispatch),
            mark_all_started=_weakly(self._mark_all_started),
            lost=self._lost, check_not_lost=_weakly(self._check_not_lost),
            mark_lost=_weakly(self._mark_lost), named=_weakly(self._named),
            no_async=_weakly(self._no_async))
        return ShardsStepper(host, [
            ShardPart(shard.stepper, shard.buffers, rows, endpoint,
                      _timeout_of(shard.stepper.channel))
            for shard, rows, endpoint in zip(self._shards, self.shard_slices,
                                             self.shard_endpoints)], is_async)

    def _mark_all_started(self) -> None:
        self._started[:] = True
        self._all_started = True

    def _named(self, error: BaseException, k: int) -> BaseException:
        """error naming shard k's daemon and envs, its row in this env's numbering."""
        return _naming(error, self.shard_endpoints[k], self._rows_text(k),
                       self._row_slices[k].start)

    @staticmethod
    def _check_alike(shards: list[RemoteVecEnv], endpoints: list[str]) -> None:
        """Every daemon must have made the same env (same envd version and plugins)."""
        first = shards[0]
        layout = {name: (a.dtype, a.shape[1:]) for name, a in first.buffers.items()}
        for shard, endpoint in zip(shards[1:], endpoints[1:]):
            theirs = {name: (a.dtype, a.shape[1:]) for name, a in shard.buffers.items()}
            if (shard.single_observation_space != first.single_observation_space
                    or shard.single_action_space != first.single_action_space
                    or shard.max_episode_steps != first.max_episode_steps or theirs != layout):
                raise InvalidArgumentError(
                    f"{first.env_id} differs between the daemons at {endpoints[0]} and "
                    f"{endpoint} (spaces {first.single_observation_space}, "
                    f"{first.single_action_space} vs {shard.single_observation_space}, "
                    f"{shard.single_action_space}; time limit {first.max_episode_steps} vs "
                    f"{shard.max_episode_steps}); every daemon must run the same envd "
                    "version and plugins")

    @property
    def shards(self) -> tuple[RemoteVecEnv, ...]:
        return self._shards

    # ---- BatchedVecEnv hooks --------------------------------------------------------
    def _run_reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._check_not_lost()
        mask = self._buffers["reset_mask"] if with_mask else None
        seeds = self._buffers["reset_seeds"] if with_seeds else None

        def reset_shard(k: int) -> None:
            rows = self.shard_slices[k]
            # (mask holds one entry per env; a shard takes one per row)
            options = None if mask is None else {
                "reset_mask": np.repeat(mask[rows], self.num_agents)}
            self._shards[k].reset(seed=None if seeds is None else seeds[rows], options=options)
            self._copy_results(k)
            if mask is None:
                self._started[rows] = True
            else:
                self._started[rows] |= mask[rows]

        # a masked reset leaves shards without a masked env alone (a shard's
        # reset needs at least one True in its mask)
        todo = [k for k, rows in enumerate(self.shard_slices) if mask is None or mask[rows].any()]
        self._dispatch(reset_shard, todo)
        self._all_started = bool(self._started.all())

    def _check_step(self) -> None:
        """Refuse a step before any shard steps (see _validate_step)."""
        self._check_not_lost()
        self._validate_step()

    def _count_done(self) -> int:
        return int(np.count_nonzero(self._dones))

    def _copy_results(self, k: int) -> None:
        """Shard k's results (every buffer the envs write) into its rows.
        Read through the shard's buffer dict each time: that dict, not the
        arrays it held at make, is the shard's contract."""
        rows = self._row_slices[k]
        theirs = self._shards[k].buffers
        for name in self._outputs:
            np.copyto(self._buffers[name][rows], theirs[name])

    def _gather_sources(self) -> list[dict[str, np.ndarray]]:
        # (shard k is source k + 1: ShardsStepper.batch_source)
        return [self._buffers, *(shard.buffers for shard in self._shards)]

    def _gather(self, ids: np.ndarray, source: int = 0,
                source_rows: np.ndarray | None = None) -> tuple[Any, ...]:
        """An async recv's batch: straight from its shard's buffers when it
        is one shard's envs (EnvPool's loop with a batch per daemon: one
        copy, not two), else from this env's (ShardsStepper.recv copied
        the rows there)."""
        stepper = self._stepper
        assert isinstance(stepper, ShardsStepper)  # (an async recv's batch)
        batch_source = stepper.batch_source
        if batch_source is None:
            return super()._gather(ids)
        k, rows = batch_source
        return super()._gather(ids, k + 1, rows)

    def _dispatch(self, call: Callable[[int], None], shards: Sequence[int]) -> None:
        """call(k) for every shard k at once; the first error (in env order)
        is raised, naming its daemon, once every shard's call has returned."""
        outcomes = _run_all(call, list(shards), self._executor)
        for k, _, error in outcomes:
            if isinstance(error, ConnectionLostError):
                self._lost.record(k, error)
        _raise_first(outcomes, self.shard_endpoints, self._rows_text,
                     lambda k: self._row_slices[k].start)

    def _mark_lost(self, k: int, error: BaseException) -> None:
        """Shard k's daemon is gone: refuse every later call (the first loss
        counts; kept without its traceback, whose frames would hold the shards)."""
        self._lost.record(k, ConnectionLostError(str(error)))

    def _rows_text(self, k: int) -> str:
        rows = self.shard_slices[k]
        return f", serving envs {rows.start}..{rows.stop - 1}"

    def _check_not_lost(self) -> None:
        if self._lost.error is not None:
            k, error = self._lost.shard, self._lost.error
            raise ConnectionLostError(
                f"{self.env_id}: the daemon at {self.shard_endpoints[k]}{self._rows_text(k)} "
                f"of this MultiVecEnv is gone ({error}); close this env and make a new one")

    def _needs_reset(self) -> np.ndarray:
        """Per row: its env ended and was not reset since (what the native
        vec refuses to step in disabled mode).  A multi-agent env ends when
        every agent is done: a dead row repeats its final flags, a live one
        is not flagged, so all its rows flagged means the env ended (one
        agent done while the others go on is no reason to refuse)."""
        if self.num_agents == 1:
            return self._dones
        flagged = (self._terminations | self._truncations).reshape(-1, self.num_agents)
        return np.repeat(flagged.all(axis=1), self.num_agents)

    def _validate_step(self) -> None:
        """Refuse the step as the single env would, before any shard steps:
        the first env (in global order) never reset, done in disabled mode,
        or given a discrete action out of range."""
        disabled = self.metadata["autoreset_mode"] is AutoresetMode.DISABLED
        if (self._all_started and not disabled and self._discrete is None
                and not self._range_checked):
            return
        started = (self._started if self.num_agents == 1
                   else np.repeat(self._started, self.num_agents))  # per row
        bad = ~started
        needs_reset = self._needs_reset() if disabled else None
        if needs_reset is not None:  # (disabled)
            bad |= needs_reset
        if self._discrete is not None:
            start, stop = self._discrete
            bad |= (self._actions < start) | (self._actions >= stop)
        elif self._range_checked:
            # (the first row out of range is enough: only the first bad env is raised)
            k = leaves.first_row_out_of_range(self.single_action_space, self._actions)
            if k >= 0:
                bad[k] = True
        if not bad.any():
            return
        i = int(np.argmax(bad))  # (a row: env i // num_agents)
        if started[i] and not (needs_reset is not None and needs_reset[i]):
            if self._range_checked:
                raise InvalidActionError(leaves.action_range_message(
                    self.env_id, self.single_action_space, self._actions[i], i))
            space = self.single_action_space
            assert isinstance(space, spaces.Discrete)  # (neither range-checked: _discrete)
            raise action_out_of_range(self.env_id, space, int(self._actions[i]), i)
        if not started[i]:
            raise EnvStateError(
                f"{self.env_id}: env {i} was never reset; call reset() "
                "before step()")
        raise EnvStateError(
            f"{self.env_id}: env {i} is done and autoreset_mode is 'disabled'; reset it with "
            f"reset(options={{'reset_mask': mask}}) before stepping it again")

    # ---- async calls of a sync MultiVecEnv --------------------------------------------------
    def _no_async(self, call: str) -> EnvStateError:
        return EnvStateError(
            f"{self.env_id}: {call}() is async mode; this MultiVecEnv (envs on "
            f"{len(self._shards)} daemons) was made without it: make it with "
            "batch_size < num_envs, or use reset()/step()")

    # ---- lifetime ------------------------------------------------------------------------
    def _release(self) -> None:
        if self._stepper is not None:
            self._stepper.close()
        self._plans = None  # (recv's copies hold views of the shards' buffers)
        shards, self._shards = self._shards, ()
        executor, self._executor = self._executor, None
        try:
            # at once: a daemon that stopped answering costs one timeout, not one per shard
            _run_all(lambda k: shards[k].close(), range(len(shards)), executor)
        finally:
            if executor is not None:
                executor.shutdown(wait=True)

    def __del__(self) -> None:
        # Garbage collection may run in any thread, even a worker of this
        # env's executor: do not talk to sockets or join threads here.  Each
        # shard hands its session to its client when it is collected.
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False)
        self.closed = True

    def __repr__(self) -> str:
        shards = ", ".join(f"{endpoint}: {rows.stop - rows.start}"
                           for endpoint, rows in zip(getattr(self, "shard_endpoints", ()),
                                                     getattr(self, "shard_slices", ())))
        return (f"envd.MultiVecEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"autoreset_mode={self.metadata['autoreset_mode']}, shards={{{shards}}})")
