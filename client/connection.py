"""The trainer's connection to a daemon: ``envd.connect()`` returns a Client.

A Client speaks the control messages (hello, list_envs, status, make, fast,
close, bye), one short method each, over one Channel (channel.py), which
owns the socket and the encoding: request ids, acks, posted requests and
late replies.  The envs it makes step through the same channel
(remote_vector_env.py).  What is checked before connecting lives apart:
the endpoint (endpoints.py) and the CURVE keys (security.py).  What the
daemon serves is read once from its hello (capabilities.py).
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import __version__, protocol
from envd import make_options as options
from envd.autoreset import autoreset_mode_name
from envd.client import endpoints, security
from envd.client.capabilities import Capabilities
from envd.client.channel import Channel
from envd.client.remote_vector_env import RemoteVecEnv
from envd.errors import (
    ConnectionLostError,
    EnvdError,
    EnvdTimeoutError,
    EnvStateError,
    InvalidArgumentError,
    NoDaemonError,
    UnknownSessionError,
)
from envd.int_args import is_int, seed_list
from envd.make_options import DAEMON


def _wire(name: str, value: Any) -> Any:
    """value in msgpack's types (numpy scalars and arrays become Python ones)."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_wire(name, v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(name, v) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
        raise InvalidArgumentError(f"{name}: the int {value} is beyond what the daemon accepts "
                                   "(-2**63 <= value < 2**64)")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidArgumentError(f"{name}: a {type(value).__name__} cannot be sent to the daemon")


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e7:
        raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


#: envd.make's arguments a daemon-served env has no use for (an env kwarg of
#: that name would reach the daemon and come back as "has no parameter",
#: which does not say where to look): refused with make_options' reason
_IN_PROCESS_ONLY = {name for name, option in options.OPTIONS.items()
                    if options.DAEMON not in option.places}


class Client:
    """A connection to one envd daemon (see envd.connect).

    ``channel`` is the connection itself (request, post, late replies);
    ``server_info`` the daemon's hello reply and ``capabilities`` what it
    serves."""

    def __init__(self, endpoint: str | None = None, *, timeout: float = 30.0,
                 name: str | None = None, server_key: str | bytes | os.PathLike[str] | None = None,
                 client_key: str | os.PathLike[str] | None = None):
        self.endpoint = endpoint or protocol.default_endpoint()
        timeout = _check_timeout(timeout)
        self.closed = False
        #: close() is closing the envs: they need not tell the daemon
        self.closing = False
        self._envs: weakref.WeakSet[RemoteVecEnv] = weakref.WeakSet()
        self.server_info: dict[str, Any] = {}
        endpoints.check_endpoint(self.endpoint, timeout)
        curve = security.curve_options(self.endpoint, server_key, client_key)
        self.channel = Channel(self.endpoint, timeout, curve)
        try:
            self.server_info = self._hello(name or f"envd {__version__} pid {os.getpid()}")
            self.capabilities = Capabilities.from_hello(self.server_info)
        except EnvdTimeoutError:
            self._teardown()
            raise NoDaemonError(
                f"no envd daemon answered at {self.endpoint}"
                f"{endpoints.where_from(self.endpoint)} within {self.timeout:g} s; "
                "start one with `envd --threads N`", self.endpoint) from None
        except BaseException:
            self._teardown()
            raise
        self.channel.max_message_bytes = self.capabilities.limits.get("max_message_bytes")
        self.channel.start_heartbeat(float(self.server_info["heartbeat_interval"]))

    @property
    def timeout(self) -> float:
        """Seconds every call waits for the daemon before EnvdTimeoutError (settable)."""
        return self.channel.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.channel.timeout = _check_timeout(value)

    @property
    def client_id(self) -> bytes:
        """The routing id the daemon leases this client's sessions to."""
        return self.channel.identity

    # ---- one method per control message ---------------------------------------------
    def _hello(self, name: str) -> dict[str, Any]:
        return self.channel.request({"type": "hello", "version": protocol.PROTOCOL_VERSION,
                                     "client_name": name})

    def make(self, env_id: str, num_envs: int, *, seed: int | Sequence[int] | np.ndarray | None = None,
             autoreset_mode: str | AutoresetMode | None = None,
             max_episode_steps: int | None = None, copy: bool = False,
             episode_statistics: bool | str = True, batch_size: int | None = None,
             transport: str | None = None, fast_path: bool | None = None,
             render_mode: str | None = None, max_threads: int | None = None,
             num_workers: int | None = None, info_bytes: int | None = None,
             **env_kwargs: Any) -> RemoteVecEnv:
        """Make num_envs instances of env_id in the daemon.  Arguments and the
        returned VecEnv are those of the in-process envd.make (without
        num_threads and pin_cpus: the daemon's one pool steps every session).

        max_threads caps how many of the daemon's pool threads step this
        session's envs at once, as num_threads sizes an in-process env's
        pool: None (default) lets every thread help; K >= 1 at most K (for
        envs that run best on a few threads, or to leave the rest to other
        sessions); 0 steps inline on the daemon thread serving each call, no
        pool wake-up: the right choice for a cheap env (CartPole) whose
        batches cost less than waking a thread.  An int from 0 to the
        daemon's --threads (InvalidArgumentError otherwise, also from a
        daemon too old to serve it).  Results are the same for any cap.

        transport (default: ENVD_TRANSPORT, else "auto") says how the arrays
        travel: "shm" maps the session's shared memory (the daemon on this
        host, same IPC namespace and user; the arrays the env returns are
        views of it), "inline" sends them over the socket as data frames, and
        "auto" tries shm and falls back to inline when this process cannot
        map the segment.  ``env.transport`` says which one was taken.

        fast_path: steps, sends and recvs bypass the socket (a doorbell in
        shared memory served by a native thread of the daemon; sessions over
        shm on x86-64 Linux).  None (default): taken when the daemon offers it, unless
        ENVD_FAST_PATH=0; True: required (InvalidArgumentError or the daemon's
        refusal otherwise); False: never.  ``env.fast_path`` says which.

        render_mode: None, or "rgb_array" for an env that renders: render()
        then asks the daemon for every env's frame (drawn in its native core;
        they come back in the reply, so their bytes must fit the daemon's
        --max-message-bytes).

        A "pz:<module>:<factory>" id the operator allowed is a PettingZoo
        ParallelEnv, its agents as rows (docs/python-envs.md), as a C
        multi-agent env's (no max_episode_steps: the env's own limit).

        num_workers: for a hosted Python env ("py:<id>", one the daemon's
        operator allowed with --python-env), the worker processes its envs are
        spread over (at least 1; None: the daemon picks, as envd.make does but
        never 0); refused for the daemon's native envs.

        info_bytes: for a hosted Python env, the bytes of each env's info slot
        (its msgpack-encoded info must fit; None: the daemon's default, 1024;
        0: infos are not carried); refused for native envs."""
        # Every option is checked here as the daemon checks it
        # (envd.make_options), before it makes anything: the daemon cannot see
        # what msgpack changes or cannot carry, and a refusal costs no round trip.
        if not isinstance(env_id, str):
            raise InvalidArgumentError(f"env_id must be a str, got {type(env_id).__name__}")
        kind = options.env_kind(env_id)
        kind.refuse_place(DAEMON, env_id)
        options.refuse_unsupported(kind.name, DAEMON, {
            **{name: env_kwargs[name]  # (envd.make's, which land in env_kwargs)
               for name in _IN_PROCESS_ONLY & env_kwargs.keys()},
            "max_episode_steps": max_episode_steps, "max_threads": max_threads,
            "num_workers": num_workers, "info_bytes": info_bytes}, env_id)
        mode = options.check_autoreset_mode(autoreset_mode)
        transport = options.check_transport(transport)
        fast_path = options.check_fast_path(fast_path)
        num_envs = options.check_num_envs(num_envs)
        options.check_episode_statistics(episode_statistics)
        options.check_seed(seed, num_envs)
        fields = {"autoreset_mode": None if mode is None else autoreset_mode_name(mode),
                  "max_episode_steps": options.check_max_episode_steps(kind.name,
                                                                       max_episode_steps),
                  "batch_size": options.check_batch_size(batch_size, num_envs),
                  "render_mode": render_mode,  # (the daemon knows which envs render)
                  "max_threads": options.check_max_threads(max_threads),  # (the daemon: the top)
                  "num_workers": options.check_num_workers(num_workers, num_envs, DAEMON),
                  "info_bytes": (None if info_bytes is None
                                 else options.check_info_bytes(kind.name, info_bytes))}
        self._check_served(batch_size is not None and batch_size != num_envs,
                           render_mode is not None, transport == "inline",
                           max_threads is not None)
        # absent unless asked (as the protocol allows): the daemon's defaults
        header = {"type": "make", "env_id": env_id, "num_envs": num_envs,
                  "env_kwargs": _wire("env_kwargs", env_kwargs),
                  **{name: _wire(name, value) for name, value in fields.items()
                     if value is not None}}
        # Per-env lists (seeds, kwargs) go in data frames: the daemon caps
        # header frames at --max-header-bytes (64 KiB by default).
        blobs: list[bytes] = []
        if seed is not None:
            header["seed"] = (_wire("seed", seed) if is_int(seed)
                              else protocol.list_to_blob(seed_list(seed, num_envs), blobs))
        header["env_kwargs"] = {name: protocol.list_to_blob(value, blobs)
                                for name, value in header["env_kwargs"].items()}
        reply = self.channel.request(header, blobs, late=self._late_make)
        try:
            env = RemoteVecEnv(self, reply, num_envs, mode or AutoresetMode.NEXT_STEP, copy,
                               episode_statistics, transport, fast_path)
        except BaseException:
            self.close_session(reply["session"])
            raise
        self._envs.add(env)
        return env

    def _check_served(self, async_mode: bool, render: bool, inline: bool,
                      max_threads: bool = False) -> None:
        """Refuse, before the daemon makes anything, what its capabilities
        say it does not serve."""
        caps, where = self.capabilities, f"the daemon at {self.endpoint}"
        for wanted, served, what in ((async_mode, caps.async_mode, "async mode (batch_size)"),
                                     (render, caps.render, "rendering (render_mode)"),
                                     (inline, caps.inline, "the inline transport"),
                                     (max_threads, caps.max_threads,
                                      "per-session thread caps (max_threads)")):
            if wanted and not served:
                raise InvalidArgumentError(
                    f"{where} does not serve {what}: its hello says so (capabilities); "
                    "upgrade the daemon or make without it")

    def _late_make(self, reply: dict[str, Any]) -> None:
        """The reply of a make that timed out: the session it made is
        nobody's, so close it (at the next request)."""
        if reply.get("ok") and isinstance(reply.get("session"), str):
            self.close_session_later(reply["session"])

    def fast(self, session: str, enable: bool = True) -> dict[str, Any]:
        """Ask the daemon to serve session's steps, sends and recvs from its
        doorbell (enable=False: stop); the reply names the doorbell's offset."""
        header: dict[str, Any] = {"type": "fast", "session": session}
        if not enable:
            header["enable"] = False
        return self.channel.request(header)

    def list_envs(self) -> list[str]:
        """Ids of every env the daemon can make, sorted."""
        return [env["id"] for env in self.describe_envs()]

    def describe_envs(self) -> list[dict[str, Any]]:
        """Every env the daemon can make, with its spaces, time limit and parameters."""
        envs: list[dict[str, Any]] = self.channel.request({"type": "list_envs"})["envs"]
        return envs

    def status(self) -> dict[str, Any]:
        """The daemon's state: version, pid, threads, clients, sessions, envs, limits."""
        reply = self.channel.request({"type": "status"})
        return {k: v for k, v in reply.items() if k not in ("id", "ok")}

    def close_session(self, session: str) -> None:
        """Free a session in the daemon; a daemon that is gone has freed it
        already, and a closing client frees them all with its bye."""
        if self.closed or self.closing:
            return
        try:
            self.channel.request({"type": "close", "session": session})
        except (ConnectionLostError, EnvdTimeoutError, EnvStateError, UnknownSessionError):
            pass

    def close_session_later(self, session: str) -> None:
        """Free a session at the next request (for envs garbage-collected
        unclosed: a finalizer may run in any thread, even one inside a request)."""
        if not self.closed:
            self.channel.post_later({"type": "close", "session": session})

    def close(self) -> None:
        """Close every env made through this client, then the connection (one
        ``bye`` frees all its sessions in the daemon).  Idempotent, and a
        no-op while it runs (an env that owns this client closes it back)."""
        if self.closed or self.closing:
            return
        self.closing = True
        try:
            for env in list(self._envs):
                env.close()
            if not self.channel.lost:
                self.channel.request({"type": "bye"}, timeout=min(self.timeout, 5.0))
        except EnvdError:
            pass  # the daemon is gone, stuck or confused: the lease frees the sessions
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"connected to {self.server_info.get('server')}"
        return f"envd.Client({self.endpoint!r}, {state})"


def connect(endpoint: str | None = None, *, timeout: float = 30.0,
            server_key: str | bytes | os.PathLike[str] | None = None,
            client_key: str | os.PathLike[str] | None = None) -> Client:
    """Connect to the envd daemon at endpoint ("ipc:///path" or "tcp://host:port";
    default: ENVD_ENDPOINT, else the default ipc socket).  Every call on the
    client and its envs raises envd.EnvdTimeoutError after timeout seconds
    without a reply, and envd.ConnectionLostError at once if the daemon goes away.

    A daemon with CURVE keys (SECURITY.md) admits tcp clients that give both
    server_key, the daemon's public ``.key`` file or its 40-character Z85
    text, and client_key, this client's ``.key_secret`` file whose ``.key``
    is in the daemon's --curve-allowed-clients directory (defaults:
    ENVD_SERVER_KEY, ENVD_CLIENT_KEY).  Keys are ignored for ipc endpoints.
    A rejected handshake raises envd.AuthenticationError at once."""
    return Client(endpoint, timeout=timeout, server_key=server_key, client_key=client_key)

