"""The errors of a refused step, send, recv, reset or render: one message
for a VecEnv wherever its envs run (in-process, in the daemon, through the
fast path) and whichever stepper drives them (envd.stepping)."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from envd import leaves
from envd.errors import (
    NATIVE_CODES,
    EnvdError,
    EnvStateError,
    InvalidActionError,
    InvalidArgumentError,
    NativeError,
    native_strerror,
)


def action_out_of_range(env_id: str, space: spaces.Discrete, action: int,
                        index: int) -> InvalidActionError:
    """The error of a discrete action outside its space (one message for the
    in-process env and the client, which checks before it posts a send)."""
    return InvalidActionError(
        f"{env_id}: action {action} of env {index} is out of range; "
        f"{space} accepts {space.start}..{space.start + space.n - 1}")


# NATIVE_CODES (envd.errors; generated from envd.h's table, so the client,
# which never loads native code, has them) maps the fast path's statuses too.


def step_error(env_id: str, action_space: spaces.Space, code: int, index: int,
               buffers: dict[str, np.ndarray], *, never_reset: bool | None = None) -> EnvdError:
    """The error of a step the native vec refused (code, a negative envd.h
    code, naming row index of buffers: an env's first row, or the row of its
    refused action), with the in-process env's message wherever it ran:
    in-process, in the daemon, or through the fast path.

    never_reset: for ESTATE, whether the env was never reset (else it is done
    with autoreset disabled), from the native session's own books; None reads
    it from the row's flags (a client's own buffers: the daemon, whose flags
    live in client-writable shared memory, always passes it).  A MultiVecEnv
    renumbers a shard's row into its own (client/multi.py _naming)."""
    if code == NATIVE_CODES["ERANGE"] and isinstance(action_space, spaces.Discrete):
        return action_out_of_range(env_id, action_space, int(buffers["actions"][index]), index)
    if code == NATIVE_CODES["ERANGE"]:
        return InvalidActionError(leaves.action_range_message(
            env_id, action_space, buffers["actions"][index], index))
    # (a refused env is done, or never reset: its flags tell which; a
    # multi-agent env's row, not its dones, which flag only the step an agent
    # ended in: a dead row repeats its final flags)
    if code == NATIVE_CODES["ESTATE"] and never_reset is None:
        never_reset = not (buffers["terminations"][index] or buffers["truncations"][index])
    if code == NATIVE_CODES["ESTATE"] and never_reset:
        return EnvStateError(f"{env_id}: env {index} was never reset; call reset() before step()")
    if code == NATIVE_CODES["ESTATE"]:
        return EnvStateError(
            f"{env_id}: env {index} is done and autoreset_mode is 'disabled'; reset it with "
            f"reset(options={{'reset_mask': mask}}) before stepping it again")
    if code == NATIVE_CODES["EBUSY"]:
        return EnvStateError(f"{env_id}: a step is already in progress on these envs")
    if code == NATIVE_CODES["EENV"]:
        return NativeError(f"{env_id}: env {index} failed in its reset, step or write_info "
                           "callback", code)
    return NativeError(f"{env_id}: step failed: {native_strerror(code)}", code)


def send_error(env_id: str, action_space: spaces.Space, num_envs: int, code: int, index: int,
               buffers: dict[str, np.ndarray], *, never_reset: bool | None = None) -> EnvdError:
    """The error of a send (an async batch) the native vec refused: as
    step_error, plus the env-id checks of the batch (one message in-process
    and through the fast path)."""
    if code == NATIVE_CODES["EBUSY"] and 0 <= index < num_envs:
        return EnvStateError(f"{env_id}: env {index} is already in flight (or twice in this "
                             "send); recv it before sending it again")
    if code == NATIVE_CODES["EINVAL"] and index >= 0:
        return InvalidArgumentError(f"{env_id}: env id {index} is out of range [0, {num_envs})")
    if code == NATIVE_CODES["EINVAL"]:
        return InvalidArgumentError(f"{env_id}: a send takes 1 to {num_envs} env ids")
    return step_error(env_id, action_space, code, index, buffers, never_reset=never_reset)


def in_flight_error(env_id: str, call: str, num_in_flight: int) -> EnvStateError:
    """The refusal of reset(), step() or render() while envs sent are in flight
    (render: or ready, not received yet; see NativeSession.render)."""
    if call == "render":
        return EnvStateError(f"{env_id}: render() while envs are in flight or not received yet "
                             "(send/async_reset); recv() them first (or reset() once none is in "
                             "flight)")
    return EnvStateError(f"{env_id}: {call}() while {num_in_flight} envs are in flight "
                         "(send/recv); recv them first")


def claimed_error(env_id: str, call: str, request: str) -> EnvStateError:
    """The refusal of a whole-vec call (reset, async_reset, render, seed)
    beside the request another front door holds on the same envs (request:
    "step", "recv", ...; the daemon's loop, or the doorbell thread): nothing
    changed."""
    return EnvStateError(
        f"{env_id}: {call}() while a {request} is still being served on these envs "
        "(the daemon's loop's, or one sent through the fast path, yours included after "
        f"a timeout); nothing was changed: call {call}() once that {request} is answered")


def ready_error(env_id: str, num_ready: int) -> EnvStateError:
    """The refusal of step() while envs wait for recv."""
    return EnvStateError(
        f"{env_id}: step() while {num_ready} envs wait for recv "
        "(after async_reset or send); use recv/send, or reset() to go back to step()")


def not_idle_error(env_id: str, index: int, in_flight: bool) -> EnvStateError:
    """The refusal of a send naming an env that is in flight or ready."""
    where = "in flight" if in_flight else "ready"
    return EnvStateError(
        f"{env_id}: env {index} is {where}, not received yet; send an env "
        "only after recv returned it (or async_reset)")


def recv_short_error(env_id: str, count: int, pending: int) -> EnvStateError:
    """The refusal of a recv of count envs when only pending are in flight or ready."""
    return EnvStateError(
        f"{env_id}: recv returns {count} envs but only {pending} are in flight or ready; "
        "send more first (or async_reset)")
