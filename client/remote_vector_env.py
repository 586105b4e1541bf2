"""The daemon-served vector env: what ``Client.make`` returns.

The same gymnasium VectorEnv as the in-process ``envd.make`` (both are an
envd.vector_base.BatchedVecEnv): BatchedVecEnv checks the arguments, writes
a call's inputs into the batch buffers and gathers the outputs; a stepper
(envd.stepping.Stepper) runs the call.  In-process that is the native
session; here one of the client's transports (client/transports/: shm over
the socket, inline, the doorbell), picked once at make.  RemoteVecEnv only
ties the three together: the session, its buffers, its stepper.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import info_codec, protocol
from envd.autoreset import mark_resets_itself
from envd.client.transports import SocketStepper, open_stepper
from envd.errors import InvalidArgumentError, ProtocolError
from envd.send_row_checks import SendRowChecks
from envd.vector_base import BatchedVecEnv

if TYPE_CHECKING:
    from envd.client.connection import Client

#: The errors of a hosted env's call that gymnasium's vector envs raise as
#: they are: the daemon's invalid_argument reply names them.
_CALL_ERRORS = {"AttributeError": AttributeError, "TypeError": TypeError,
                "ValueError": ValueError}
_CALL_ERROR = re.compile(r"envs failed: (AttributeError|TypeError|ValueError): ")


class RemoteVecEnv(SendRowChecks, BatchedVecEnv):
    """num_envs envs stepped by a daemon's pool (see Client.make)."""

    #: set in __init__ (open_stepper), never unset
    _stepper: SocketStepper

    def __init__(self, client: Client, reply: dict[str, Any], num_envs: int,
                 mode: AutoresetMode, copy: bool, episode_statistics: bool | str,
                 transport: str = "auto", fast_path: bool | None = None):
        self._client = None
        self.session = reply["session"]
        # a multi-agent env's agents are rows (as envd.make's): num_envs counts
        # rows, num_env_instances envs; absent from an older daemon's reply
        agents = reply.get("num_agents", 1)
        if not isinstance(agents, int) or isinstance(agents, bool) or agents < 1:
            raise ProtocolError(f"the daemon's make reply has num_agents={agents!r}")
        super().__init__(reply["env_id"], protocol.space_from_wire(reply["observation_space"]),
                         protocol.space_from_wire(reply["action_space"]), num_envs * agents,
                         mode, reply["max_episode_steps"], copy, episode_statistics,
                         reply.get("batch_size"), reply.get("render_mode"),
                         reply.get("render_fps"))
        self.num_agents = agents
        fields = reply.get("episode_fields") or []
        if not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise ProtocolError(f"the daemon's make reply has episode_fields={fields!r:.200}")
        self.episode_fields = tuple(fields)  # (ABI 5: the env's own episode log)
        if reply.get("resets_itself"):
            mark_resets_itself(self)
        names = reply.get("possible_agents") or []  # (a "pz:" env's; absent from older daemons)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ProtocolError(f"the daemon's make reply has possible_agents={names!r}")
        self.agent_names = tuple(names)
        self.batch_size = reply.get("batch_size") or num_envs  # envs, not rows
        # (if this raises, Client.make closes the session; checked before the
        # segment is mapped, so that a refusal leaves no mapping behind)
        self._check_episode_statistics_key(reply["shm"]["arrays"])
        self._segment, stepper = open_stepper(client, reply, transport, fast_path,
                                              self.env_id, self.single_action_space,
                                              num_envs, agents)
        self._use_stepper(stepper)
        #: how the arrays travel: "shm" or "inline" (see Client.make)
        self.transport = self._stepper.transport
        #: the daemon's cap on the pool threads stepping these envs (None: none; Client.make)
        self.max_threads: int | None = reply.get("max_threads")
        self._bind_buffers(self._segment.arrays)
        self._client = client
        self._init_send_row_checks()

    @property
    def fast_path(self) -> bool:
        """Steps, sends and recvs go through the doorbell (see Client.make)."""
        # (False once closed: the stepper is then envd.stepping.NO_STEPPER)
        return bool(getattr(self._stepper, "fast_path", False))

    @property
    def stepper(self) -> SocketStepper:
        """The transport stepper that drives the session (client/transports:
        its non-blocking half is what several daemons' async mode drives)."""
        return self._stepper

    @property
    def buffers(self) -> dict[str, np.ndarray]:
        """The session's batch buffers, name -> array (envd.buffer_layout)."""
        return self._buffers

    # ---- BatchedVecEnv hooks --------------------------------------------------------
    @property
    def _maybe_running(self) -> bool:
        # a call timed out: the stepper knows until when the daemon may use the buffers
        return bool(getattr(self._stepper, "maybe_running", False))

    @_maybe_running.setter
    def _maybe_running(self, value: bool) -> None:
        pass  # (BatchedVecEnv's initial False: the stepper keeps it)

    def _check_buffers_free(self) -> None:
        self._stepper.check_buffers_free()

    def _render_frames(self) -> np.ndarray:
        return self._stepper.frames()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each env's attribute name, called with args and kwargs if it is
        callable (gymnasium's AsyncVectorEnv.call), run in the daemon's
        workers of a hosted session: one result per env (num_env_instances,
        not per row: a PettingZoo env's are its ParallelEnv's); arguments
        and results travel as
        envd.info_codec carries them (msgpack, numpy-aware, never pickle;
        another type is a TypeError).  A built-in env's session refuses it
        (its VecEnv has spec, metadata and the spaces)."""
        return self._env_call({"op": "call", "name": name, "args": list(args),
                               "kwargs": kwargs})

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's attribute name (call(name): a method is called)."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute name of each env: a list or tuple of
        num_env_instances values (one per env, not per row), or one value for
        every env (gymnasium's set_attr)."""
        envs = self.num_env_instances
        if not isinstance(values, (list, tuple)):
            values = [values] * envs
        if len(values) != envs:
            raise ValueError("Values must be a list or tuple with length equal to the number "
                             f"of environments. Got `{len(values)}` values for "
                             f"{envs} environments.")
        self._env_call({"op": "set_attr", "name": name, "values": list(values)})

    def _env_call(self, request: dict[str, Any]) -> tuple[Any, ...]:
        try:
            data = info_codec.encode(request)
        except TypeError as exc:
            raise TypeError(f"{self.env_id}: the {request['op']} arguments hold {exc}, which "
                            "msgpack cannot carry to the daemon (never pickled)") from None
        self._acquire()
        try:
            results = info_codec.decode(self._stepper.env_call(data))
        except InvalidArgumentError as exc:
            # the daemon names the type of the envs' error (HostedSession.env_call)
            found = _CALL_ERROR.search(str(exc))
            if found is None:
                raise
            raise _CALL_ERRORS[found.group(1)](str(exc)) from None
        finally:
            self._claim.append(True)
        if not isinstance(results, list) or len(results) != self.num_env_instances:
            raise ProtocolError(f"the daemon's env_call reply holds {type(results).__name__}, "
                                f"not {self.num_env_instances} results")
        return tuple(results)

    def _release(self) -> None:
        client, self._client = self._client, None
        if client is not None and not self.closed:
            client.close_session(self.session)  # (a no-op while the client closes: bye frees all)
            self._stepper.close()

    def __del__(self) -> None:
        # Garbage collection may run in any thread, even one inside a request
        # on this client's socket: hand the session to the client to close at
        # its next request instead of talking to the socket here.
        client = getattr(self, "_client", None)
        if client is not None and not self.closed:
            client.close_session_later(self.session)
        self.closed = True

    def __repr__(self) -> str:
        endpoint = self._client.endpoint if self._client else None
        return (f"envd.RemoteVecEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"session={self.session[:8]}, endpoint={endpoint!r}, "
                f"transport={self.transport!r}, fast_path={self.fast_path}, "
                f"autoreset_mode={self.metadata['autoreset_mode']})")
