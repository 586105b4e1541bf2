"""The daemon-served vector env: what ``Client.make`` returns.

The same gymnasium VectorEnv as the in-process ``envd.make`` (both are an
envd.vector_base.BatchedVecEnv), over one of two transports, picked at make:
  - shm: the batch buffers are views of the session's shared-memory segment;
    a step writes the actions there, sends one small message and reads the
    results in place when the reply comes.  Nothing but the message header
    crosses the socket.
  - inline, where this process cannot map the segment (another host, IPC
    namespace or user): the buffers are private memory with the segment's
    layout; requests carry the inputs (actions, reset seeds and mask) and
    replies the outputs as extra frames (envd.protocol, "Inline transport").
Both leave the same bytes in the same buffers, so everything above the
transport (BatchedVecEnv) is shared and results are bit-identical.
"""
from __future__ import annotations

import collections
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd import protocol
from envd.client import doorbell
from envd.client.doorbell import RECV, SEND, SHUTTING_DOWN, STEP, Doorbell
from envd.errors import (EnvdTimeoutError, EnvStateError, InvalidArgumentError,
                         LimitExceededError, ProtocolError, SharedMemoryError, ShuttingDownError)
from envd.shm import Segment
from envd.vector_base import (NATIVE_CODES, BatchedVecEnv, action_out_of_range,
                              in_flight_error, not_idle_error, ready_error, recv_short_error,
                              send_error, step_error)

if TYPE_CHECKING:
    from envd.client.connection import Client

_IDLE, _IN_FLIGHT, _READY = 0, 1, 2


class _HookStepper:
    """The async books of a RemoteVecEnv over its transport hooks
    (_run_reset, _run_step, _submit_batch, _collect_batches, _settle_sends):
    a stepper (envd.stepping) until the transports become steppers of their
    own.  Each env is IDLE, IN_FLIGHT or READY; ready ids queue in the order
    their batches were found finished; batch_error is an env's failure in a
    finished send, or a refused send, waiting for the next recv."""

    def __init__(self, env: "RemoteVecEnv"):
        self.env = env
        self.state = np.zeros(env.num_envs, np.int8)
        self.ready: collections.deque[np.ndarray] = collections.deque()
        self.num_ready = self.num_in_flight = 0
        self.batch_error: Exception | None = None

    def _check_idle(self, call: str) -> None:
        """reset and step act on every env: not while some are in flight or
        stepped and not received; a reset then forgets the ready ones (and a
        failure of theirs not reported yet)."""
        self.env._settle_sends()
        if self.num_in_flight:
            raise in_flight_error(self.env.env_id, call, self.num_in_flight)
        if self.num_ready and call == "step":
            raise ready_error(self.env.env_id, self.num_ready)
        self.ready.clear()
        self.num_ready = 0
        self.state[:] = _IDLE
        self.batch_error = None

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._check_idle("reset")
        self.env._run_reset(with_seeds, with_mask)

    def step(self) -> int:
        if self.num_in_flight or self.num_ready:
            self._check_idle("step")
        return self.env._run_step()

    def async_reset(self, with_seeds: bool) -> None:
        self.env._settle_sends()
        while self.num_in_flight:
            self._take_finished(wait=True, report=False)
        self.batch_error = None  # dropped with the results it belongs to
        self.env._run_reset(with_seeds, False)
        self.ready.clear()
        self.ready.append(np.arange(self.env.num_envs, dtype=np.int64))
        self.state[:] = _READY
        self.num_ready = self.env.num_envs

    def send(self, env_ids: np.ndarray) -> None:
        busy = env_ids[self.state[env_ids] != _IDLE]
        if len(busy):
            raise not_idle_error(self.env.env_id, int(busy[0]),
                                 self.state[busy[0]] == _IN_FLIGHT)
        self.env._submit_batch(env_ids)
        self.state[env_ids] = _IN_FLIGHT
        self.num_in_flight += len(env_ids)
        # notice early finishers (ready order); an env that failed in a
        # send is reported by recv, in-process as through the daemon
        self._take_finished(wait=False, report=False)

    def recv(self, count: int) -> np.ndarray:
        if self.num_ready + self.num_in_flight < count:
            self.env._settle_sends()  # a refused send explains it better
            if self.batch_error is not None:
                error, self.batch_error = self.batch_error, None
                raise error
            raise recv_short_error(self.env.env_id, count, self.num_ready + self.num_in_flight)
        self._take_finished(wait=False)
        while self.num_ready < count:
            self._take_finished(wait=True)
        ids = self._pop_ready(count)
        self.state[ids] = _IDLE
        return ids

    def render(self, out: np.ndarray) -> None:
        if self.num_in_flight:
            raise in_flight_error(self.env.env_id, "render", self.num_in_flight)
        out[...] = self.env._render_reply()

    def close(self) -> None:
        pass  # the env's _release closes the session

    def _take_finished(self, wait: bool, report: bool = True) -> None:
        finished = self.env._collect_batches(wait)
        if wait and not finished and self.batch_error is None:
            # cannot happen unless the bookkeeping is broken: never spin on it
            raise EnvStateError(f"{self.env.env_id}: {self.num_in_flight} envs counted in "
                                "flight but no send is running; close the env")
        for ids in finished:
            self.state[ids] = _READY
            self.ready.append(ids)
            self.num_ready += len(ids)
            self.num_in_flight -= len(ids)
        if report and self.batch_error is not None:
            # the envs are ready; their failed results are in the rows
            error, self.batch_error = self.batch_error, None
            raise error

    def _pop_ready(self, count: int) -> np.ndarray:
        parts = []
        while count:
            head = self.ready[0]
            if len(head) <= count:
                parts.append(self.ready.popleft())
            else:
                parts.append(head[:count])
                self.ready[0] = head[count:]
            count -= len(parts[-1])
        self.num_ready -= sum(map(len, parts))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]


class RemoteVecEnv(BatchedVecEnv):
    """num_envs envs stepped by a daemon's pool (see Client.make)."""

    def __init__(self, client: "Client", reply: dict[str, Any], num_envs: int,
                 mode: AutoresetMode, copy: bool, episode_statistics: bool | str,
                 transport: str = "auto", fast_path: bool | None = None):
        self._client = None
        self.session = reply["session"]
        segment, self.transport = self._buffers_for(client, reply, transport)
        super().__init__(reply["env_id"], protocol.space_from_wire(reply["observation_space"]),
                         protocol.space_from_wire(reply["action_space"]), num_envs, mode,
                         reply["max_episode_steps"], copy, episode_statistics,
                         reply.get("batch_size"), reply.get("render_mode"),
                         reply.get("render_fps"))
        self._client = client
        self._segment = segment
        self._bind_buffers(segment.arrays)
        self._stepper = _HookStepper(self)
        self._step_header = {"type": "step", "session": self.session}
        self._async_lost = False     # a recv timed out: async bookkeeping is lost
        self._refused_sends: list[tuple[np.ndarray, dict[str, Any]]] = []  # (ids, error reply)
        self._sends_unanswered = 0  # posted sends whose reply was not read yet
        space = self.single_action_space
        self._discrete = ((space.start, space.start + space.n)
                          if isinstance(space, spaces.Discrete) else None)
        self._inline = self.transport == "inline"
        self.fast_path = False  # steps, sends and recvs through the doorbell
        self._doorbell: Doorbell | None = None  # (Client.make's fast_path)
        self._outputs = protocol.output_arrays(segment.arrays)
        if self._inline:
            actions = segment.arrays["actions"]
            self._step_header.update(
                inline=True, actions={"dtype": actions.dtype.str, "shape": list(actions.shape)})
        if fast_path is not False:
            try:
                self._start_fast_path(required=fast_path is True)
            except BaseException:
                self._client = None  # Client.make closes the session
                raise

    @staticmethod
    def _buffers_for(client: "Client", reply: dict[str, Any],
                     transport: str) -> tuple[Segment, str]:
        """The session's buffers and the transport they need: the daemon's
        segment if this process can map it (asked for or auto), else private
        memory with its layout (inline asked for, or auto and mapping failed)."""
        shm = reply["shm"]
        if transport != "inline":
            info = client.server_info
            try:
                return Segment.attach(
                    shm["name"], reply["session"], shm["arrays"], shm["size"],
                    where=f"the daemon at {client.endpoint} (host {info['hostname']}, "
                          f"pid {info['pid']})"), "shm"
            except SharedMemoryError as exc:
                if transport == "shm":
                    raise SharedMemoryError(f"{exc}; make with transport='auto' (or "
                                            "'inline') to send the arrays over the socket "
                                            "instead") from None
                if not client.capabilities.inline:
                    raise SharedMemoryError(f"{exc}; and the daemon does not serve the inline "
                                            "transport (its hello's capabilities)") from None
        return Segment.private(shm["name"], shm["arrays"], shm["size"]), "inline"

    # ---- the inline transport --------------------------------------------------------
    @staticmethod
    def _frame(array: np.ndarray) -> memoryview:
        """An array as one data frame (its bytes, C order, not copied)."""
        return memoryview(np.ascontiguousarray(array)).cast("B")

    def _read_outputs(self, reply: dict[str, Any], blobs: list, rows: np.ndarray | None) -> None:
        """Copy an inline reply's output arrays into the buffers: whole, or
        the given rows (a recv's envs, in the order of the blobs' rows)."""
        if reply.get("arrays") != self._outputs or len(blobs) != len(self._outputs):
            raise ProtocolError(
                f"the daemon's inline reply carries arrays {reply.get('arrays')!r} in "
                f"{len(blobs)} frame(s); expected {self._outputs}")
        for name, blob in zip(self._outputs, blobs):
            target = self._buffers[name]
            count = len(target) if rows is None else len(rows)
            if len(blob) != count * target[0].nbytes:
                raise ProtocolError(f"the daemon's inline {name!r} frame holds {len(blob)} "
                                    f"bytes, expected {count * target[0].nbytes}")
            values = np.frombuffer(blob, target.dtype).reshape(count, *target.shape[1:])
            if rows is None:
                target[...] = values
            else:
                target[rows] = values

    # ---- BatchedVecEnv hooks --------------------------------------------------------
    def _run_reset(self, with_seeds: bool, with_mask: bool) -> None:
        header = {"type": "reset", "session": self.session, "seeds": with_seeds,
                  "mask": with_mask}
        if not self._inline:
            self._call(header)
            return
        inputs = [self._frame(self._buffers[name]) for name, given in
                  (("reset_seeds", with_seeds), ("reset_mask", with_mask)) if given]
        reply = self._call({**header, "inline": True}, inputs)
        self._read_outputs(reply, reply.get("_blobs", []), None)

    def _render_frames(self) -> np.ndarray:
        # (the frame shape comes with the reply: no buffer to hand the stepper)
        if self._stepper.num_in_flight:
            raise in_flight_error(self.env_id, "render", self._stepper.num_in_flight)
        return self._render_reply()

    def _render_reply(self) -> np.ndarray:
        reply = self._call({"type": "render", "session": self.session})
        blobs = reply.get("_blobs", [])
        shape = tuple(reply.get("frames", {}).get("shape", ()))
        if (len(shape) != 4 or shape[0] != self.num_envs or shape[3] != 3 or len(blobs) != 1
                or len(blobs[0]) != math.prod(shape)):
            raise ProtocolError(f"the daemon's render reply holds frames of shape {shape!r} in "
                                f"{len(blobs)} frame(s); expected {self.num_envs} RGB frames")
        return np.frombuffer(blobs[0], np.uint8).reshape(shape).copy()

    def _start_fast_path(self, required: bool) -> None:
        """Ask the daemon to serve this session's steps, sends and recvs from
        its doorbell, if its capabilities say it can; without it (and not
        required) they go over the socket."""
        reason = doorbell.unavailable()
        if not self._client.capabilities.fast_path:
            reason = (f"the daemon at {self._client.endpoint} does not offer the fast path "
                      "(its hello's capabilities; --fast-path-sessions 0, or an older daemon)")
        if self.transport != "shm":
            reason = "the fast path needs the session's shared memory (transport 'shm')"
        if reason is None:
            try:
                reply = self._client.fast(self.session)
            except (InvalidArgumentError, LimitExceededError) as exc:
                reason = str(exc)  # e.g. the daemon serves its --fast-path-sessions already
            else:
                self._doorbell = Doorbell(self._segment.memory, int(reply["doorbell"]["offset"]))
                self._doorbell_ids = self._buffers["doorbell_ids"]
                self.fast_path = True
                return
        if required:
            raise InvalidArgumentError(f"fast_path=True: {reason}")

    def _ring(self, kind: int, count: int, what: str) -> tuple[int, int, int] | None:
        """A request through the doorbell (its inputs are in shared memory):
        no message, the daemon's native thread answers there.  Its (status,
        result, error index), raising ShuttingDownError for the daemon's
        refusal; None once the daemon stopped serving the doorbell (the
        session was closed or expired, or the daemon stops): the caller then
        asks over the socket, which says which."""
        bell = self._doorbell
        if bell.closed:
            self._doorbell, self.fast_path = None, False
            return None
        bell.ring(kind, count)
        try:
            answer = bell.wait(time.monotonic() + self._client.timeout, self._client.channel.check_alive)
        except TimeoutError:
            self._maybe_running = True  # until the answer comes: see _check_buffers_free
            self._async_lost = kind != STEP  # the envs of a late send or recv are lost to us
            raise EnvdTimeoutError(
                f"no answer to a fast-path {what} from the daemon at {self._client.endpoint} "
                f"within {self._client.timeout:g} s (Client timeout)") from None
        if answer is None:
            return self._ring(kind, count, what)  # closed meanwhile: drops the doorbell
        status, result, index = answer
        if status == SHUTTING_DOWN:
            raise ShuttingDownError("the daemon is shutting down and takes no new work")
        return status, result, index

    def _fast_step(self) -> int | None:
        """A step through the doorbell: the number of episodes that ended;
        None when the doorbell is closed."""
        answer = self._ring(STEP, 0, "step")
        if answer is None:
            return None
        status, num_done, index = answer
        if status != 0:
            raise step_error(self.env_id, self.single_action_space, status, index, self._buffers)
        return num_done

    def _fast_send(self, env_ids: np.ndarray) -> bool:
        """A send through the doorbell, answered once the daemon started it
        (its refusal is raised here, as in-process); False when the doorbell
        is closed."""
        self._doorbell_ids[:len(env_ids)] = env_ids
        answer = self._ring(SEND, len(env_ids), "send")
        if answer is None:
            return False
        status, _, index = answer
        if status != 0:
            raise send_error(self.env_id, self.single_action_space, self.num_envs, status, index,
                             self._buffers)
        return True

    def _fast_recv(self, count: int) -> list[np.ndarray] | None:
        """Every env found finished once count are (their ids), through the
        doorbell; None when the doorbell is closed.  An env that failed in a
        batch goes to the books' batch_error (raised as in-process); the daemon keeps
        that batch's envs ready for the next recv."""
        answer = self._ring(RECV, count, "recv")
        if answer is None:
            return None
        status, num_ready, index = answer
        if status == NATIVE_CODES["EENV"]:
            books = self._stepper
            books.batch_error = books.batch_error or step_error(
                self.env_id, self.single_action_space, status, index, self._buffers)
            return []
        if status != 0:
            raise EnvStateError(f"recv of {count} envs, but fewer were sent and not reported "
                                f"yet; send more first (status {status})")
        return [self._doorbell_ids[:num_ready].copy()]

    def _run_step(self) -> int:
        if self._doorbell is not None:
            num_done = self._fast_step()
            if num_done is not None:
                return num_done
        if not self._inline:
            return self._call(dict(self._step_header))["num_done"]
        reply = self._call(dict(self._step_header), [self._frame(self._actions)])
        self._read_outputs(reply, reply.get("_blobs", []), None)
        return reply["num_done"]

    def _check_send_rows(self, rows: np.ndarray, env_ids: np.ndarray) -> None:
        # The daemon would refuse an out-of-range action only after send has
        # returned (sends are posted): check here, with the in-process message.
        if self._discrete is not None and len(rows):
            start, stop = self._discrete
            if rows.min() < start or rows.max() >= stop:
                k = int(np.flatnonzero((rows < start) | (rows >= stop))[0])
                raise action_out_of_range(self.env_id, self.single_action_space,
                                          int(rows[k]), int(env_ids[k]))

    def _submit_batch(self, env_ids: np.ndarray) -> None:
        # Through the doorbell: answered as soon as the daemon started the
        # batch (microseconds), so a refusal is raised here, as in-process.
        self._check_async_state()
        if self._doorbell is not None:
            if not self._fast_send(env_ids):  # closed: the socket says why, at once
                self._call({"type": "send", "session": self.session}, [env_ids.tobytes()])
            return
        # Over the socket, posted: send returns without a round trip (the
        # trainer goes on while the daemon steps).  The daemon refuses a send
        # only before stepping any of it (an env failing later is reported by
        # recv), and answers a send at once, so its reply is in before the
        # reply of the next recv.

        def on_reply(reply: dict[str, Any]) -> None:
            self._sends_unanswered -= 1
            if not reply.get("ok"):
                self._refused_sends.append((env_ids, reply))

        header, blobs = {"type": "send", "session": self.session}, [env_ids.tobytes()]
        if self._inline:
            header["inline"] = True
            blobs.append(self._frame(self._actions[env_ids]))
        try:
            self._client.channel.post(header, blobs, on_reply)  # waits while the window is full
        except EnvdTimeoutError:
            self._async_lost = True  # earlier sends' replies never came: their fate is unknown
            raise
        self._sends_unanswered += 1

    def _collect_batches(self, wait: bool) -> list[np.ndarray]:
        # The daemon knows what finished; asking costs a round trip, so only
        # when recv needs more envs, and then take every finished one.
        if not wait:
            return []
        self._check_async_state()
        self._settle_sends(poll=False)  # (this recv's wait reads the replies in order)
        books = self._stepper
        if not books.num_in_flight:  # every env in flight was refused
            return []
        count = max(1, min(self.batch_size - books.num_ready, books.num_in_flight))
        if self._doorbell is not None:
            finished = self._fast_recv(count)
            if finished is not None:
                return finished
        try:
            header = {"type": "recv", "session": self.session, "count": count}
            reply = self._call({**header, "inline": True} if self._inline else header)
        except EnvdTimeoutError:
            self._async_lost = True  # the late reply's ids would be lost to us
            raise
        except EnvStateError:
            if not self._refused_sends:
                raise
            # the daemon missed envs whose send it refused (their replies came
            # first): take them back; the refusal is raised instead
            self._settle_sends(poll=False)
            return []
        self._settle_sends(poll=False)
        ids = np.frombuffer(reply["_blobs"][0], np.int64).copy()
        if self._inline:
            self._read_outputs(reply, reply["_blobs"][1:], ids)
        return [ids]

    def _settle_sends(self, poll: bool = True) -> None:
        # poll: first read the replies of the sends posted so far (the daemon
        # answers a send at once; a daemon that stopped answering is waited
        # for no longer than the client's timeout, then its refusals are unknown)
        deadline = time.monotonic() + self._client.timeout
        while poll and self._sends_unanswered and time.monotonic() < deadline:
            self._client.channel.read_late_replies(wait=0.05)
        if not self._refused_sends:
            return
        refused, self._refused_sends = self._refused_sends, []
        books = self._stepper
        for env_ids, _ in refused:  # never stepped: idle again
            books.state[env_ids] = _IDLE
            books.num_in_flight -= len(env_ids)
        books.batch_error = books.batch_error or protocol.error_from_reply(refused[0][1])

    def _check_async_state(self) -> None:
        if self._async_lost:
            raise EnvStateError(
                f"a send or recv on this {self.env_id} env timed out, so which envs are in "
                "flight is unknown; close it and make a new env")

    def _call(self, header: dict[str, Any], blobs: list[bytes] = ()) -> dict[str, Any]:
        try:
            # A request that times out may still run in the daemon (or not
            # have been read yet): the buffers stay off limits until its late
            # reply says it ended.
            return self._client.channel.request(header, blobs, late=self._late_reply_came)
        except EnvdTimeoutError:
            self._maybe_running = True
            raise

    def _late_reply_came(self, reply: dict[str, Any]) -> None:
        self._maybe_running = False

    def _check_buffers_free(self) -> None:
        self._client.channel.read_late_replies()
        if self._maybe_running and self._doorbell is not None and self._doorbell.answered:
            self._maybe_running = False  # the late fast-path step has ended
        if self._maybe_running:
            raise EnvStateError(
                f"a call on this {self.env_id} env timed out and the daemon has not "
                "answered it yet: it may still use the env's buffers; retry later (or "
                "make a new env)")

    def _release(self) -> None:
        client = self._client
        # Client.close frees every session at once with its bye.
        if client is not None and not self.closed:
            client.close_session(self.session)
        self._client = None

    def __del__(self) -> None:
        # Garbage collection may run in any thread, even one inside a request
        # on this client's socket: hand the session to the client to close at
        # its next request instead of talking to the socket here.
        client = getattr(self, "_client", None)
        if client is not None and not self.closed:
            client.close_session_later(self.session)
        self.closed = True

    def __repr__(self) -> str:
        return (f"envd.RemoteVecEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"session={self.session[:8]}, endpoint={self._client.endpoint if self._client else None!r}, "
                f"transport={self.transport!r}, fast_path={self.fast_path}, "
                f"autoreset_mode={self.metadata['autoreset_mode']})")
