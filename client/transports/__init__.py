"""How a daemon-served env's calls reach its session: one stepper per env
(envd.stepping.Stepper), picked once at make.

  - shm (over_socket.SocketStepper): the batch buffers are views of the
    session's shared-memory segment; each call is one small message;
  - inline (inline.InlineStepper), where this process cannot map the segment
    (another host, IPC namespace or user): the messages carry the arrays;
  - the doorbell (doorbell_stepper.DoorbellStepper): shm whose steps, sends
    and recvs bypass the socket (the same-host fast path).

All three leave the same bytes in the same buffers, so RemoteVecEnv and
everything above it is shared and results are bit-identical.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gymnasium import spaces

from envd import _native_facts
from envd.client import doorbell
from envd.client.transports.doorbell_stepper import DoorbellStepper
from envd.client.transports.inline import InlineStepper
from envd.client.transports.over_socket import SocketStepper
from envd.errors import InvalidArgumentError, LimitExceededError, SharedMemoryError
from envd.shm import Segment

if TYPE_CHECKING:
    from envd.client.connection import Client

__all__ = ["open_stepper", "SocketStepper", "InlineStepper", "DoorbellStepper"]


def open_stepper(client: Client, reply: dict[str, Any], transport: str,
                 fast_path: bool | None, env_id: str, action_space: spaces.Space,
                 num_envs: int, num_agents: int = 1) -> tuple[Segment, SocketStepper]:
    """The buffers of the session a make reply describes and the stepper
    that drives it: transport "shm", "inline" or "auto" (shm where this
    process can map the segment, else inline); fast_path None (the doorbell
    where the daemon's capabilities offer it), True (required:
    InvalidArgumentError otherwise) or False.  num_envs counts envs; each is
    num_agents rows of the arrays (a multi-agent env's agents)."""
    segment, name = _buffers_for(client, reply, transport)
    args = (client.channel, reply["session"], env_id, action_space, num_envs, segment.arrays,
            num_agents)
    reason = doorbell.unavailable()
    if not client.capabilities.fast_path:
        reason = (f"the daemon at {client.endpoint} does not offer the fast path (its hello's "
                  "capabilities; --fast-path-sessions 0, or an older daemon)")
    elif client.capabilities.doorbell_layout != _native_facts.DOORBELL_LAYOUT:
        reason = (f"the daemon at {client.endpoint} has doorbells of layout "
                  f"{client.capabilities.doorbell_layout}, this client rings layout "
                  f"{_native_facts.DOORBELL_LAYOUT} (another envd version): steps go over the socket")
    if name != "shm":
        reason = "the fast path needs the session's shared memory (transport 'shm')"
    if fast_path is not False and reason is None:
        try:
            offset = int(client.fast(reply["session"])["doorbell"]["offset"])
        except (InvalidArgumentError, LimitExceededError) as exc:
            reason = str(exc)  # e.g. the daemon serves its --fast-path-sessions already
        else:
            return segment, DoorbellStepper(*args, memory=segment.memory, offset=offset)
    if fast_path is True:
        raise InvalidArgumentError(f"fast_path=True: {reason}")
    return segment, (InlineStepper if name == "inline" else SocketStepper)(*args)


def _buffers_for(client: Client, reply: dict[str, Any], transport: str) -> tuple[Segment, str]:
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
