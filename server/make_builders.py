"""The daemon's session builders, one per way an env kind is served
(envd.make_options.KINDS names each kind's ``daemon_builder``): the pool
session of a C env (built in, a plugin's, an Ocean build) and the hosted
session of a Python env (``py:``, ``pz:``; worker processes forked from the
daemon's template, server/hosted.py).

A builder checks the make message's fields the kind takes (the options it
does not take were refused already: make_options.refuse_unsupported),
reserves what the session will hold (server/reservation.py), and returns
the reservation with the function that builds the session on the Service's
executor.  The make handler (server/control.py) submits it and replies.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import make_options as options
from envd import protocol
from envd.errors import InvalidArgumentError, LimitExceededError, UnknownEnvError
from envd.int_args import seed_list
from envd.make_options import DAEMON, EnvKind
from envd.native.registry import get_spec, list_envs
from envd.native.vector_env import check_episode
from envd.server.hosted import HostedServerSession
from envd.server.sessions import ClientRecord, Session

if TYPE_CHECKING:
    from envd.server.reservation import Reservation
    from envd.server.service import Service

#: What a builder returns: the reservation, and the build run on the executor.
Planned = tuple["Reservation", Callable[[], Session]]
#: A builder: (service, client, make message, the env's kind) -> Planned.
DaemonBuilder = Callable[["Service", ClientRecord, dict[str, Any], EnvKind], Planned]

#: Longest env id echoed back in an error message.
_ECHO_LIMIT = 100
#: A make request's fields besides the env kwargs: a kwarg close to one of
#: them (sed=0) is suggested as that argument in the error.
_MAKE_ARGUMENTS = tuple(f for f in protocol.MESSAGE_FIELDS["make"] if f != "env_kwargs")


def _seeds(seed: Any, num_envs: int) -> np.ndarray:
    """Env i's seed (seed=None: a random base seed, env i then gets base + i)."""
    return seed_list(secrets.randbelow(2**63) if seed is None else seed, num_envs)


def pool_session(service: Service, client: ClientRecord, header: dict[str, Any],
                 kind: EnvKind) -> Planned:
    """A C env's session, stepped by the daemon's pool: an id list_envs
    names (built in, a --plugin's, or one of the kind's daemon_flag)."""
    env_id = header["env_id"]
    if len(env_id) > _ECHO_LIMIT:
        raise UnknownEnvError(
            f"unknown env id of {len(env_id)} characters; known ids: {', '.join(list_envs())}")
    served = list_envs()
    if kind.daemon_flag is not None and not any(i.startswith(str(kind.prefix)) for i in served):
        # none of the kind at all: name the flag (with some, get_spec's
        # "did you mean" serves a typo better)
        raise UnknownEnvError(
            f"unknown env id {env_id!r}: this daemon serves no {kind.prefix}<env> ids; its "
            f"operator names them with {kind.daemon_flag}; its ids: {', '.join(served)}")
    spec = get_spec(env_id)
    num_envs = options.check_num_envs(header["num_envs"])
    env_kwargs = header.get("env_kwargs", {})
    params = None
    if spec.describes:
        # ABI 5: the spaces, which the reservation sizes, come from the
        # params.  Scalars: one row describes every env (the envs' rows
        # are built on the executor, as for any env); a list of num_envs
        # values came in this message, and each env is described.
        per_env = any(isinstance(value, (list, tuple)) for value in env_kwargs.values())
        rows = num_envs if per_env else 1
        values = spec.param_values(env_kwargs, _MAKE_ARGUMENTS, rows)
        spec = spec.described(values, rows)
        params = values if per_env else None
    options.check_rows(spec.id, num_envs, spec.num_agents)
    batch_size = options.check_batch_size(header.get("batch_size"), num_envs)
    mode, max_steps = check_episode(spec, header.get("autoreset_mode"),
                                    header.get("max_episode_steps"))
    render_mode = spec.check_render_mode(header.get("render_mode"))
    max_threads = options.check_max_threads(header.get("max_threads"),
                                            service.pool.num_threads)
    seed = header.get("seed")
    options.check_seed(seed, num_envs)
    service.check_op_room(client)  # before anything is reserved
    reservation = service.books.reserve(client, spec, num_envs, mode, len(service.sessions),
                                        service.fd_check)

    def build() -> Session:  # on the executor: seeds and envs of big makes take time
        values = (params if params is not None
                  else spec.param_values(env_kwargs, _MAKE_ARGUMENTS, num_envs))
        try:
            session = Session(client.identity, spec, num_envs, mode, max_steps, values,
                              _seeds(seed, num_envs), service.pool, service.segment_prefix,
                              on_free=service.on_session_freed, max_threads=max_threads)
        except (OSError, MemoryError) as exc:  # /dev/shm or the heap is full
            raise LimitExceededError(
                f"cannot allocate {num_envs} {spec.id} envs: {exc}; the host's shared "
                "memory (/dev/shm; in a container see --shm-size) or memory is exhausted"
            ) from None
        session.batch_size = batch_size or num_envs
        session.render_mode = render_mode
        service.made(session)  # (from this thread: shutdown frees it if need be)
        return session

    return reservation, build


def hosted_session(service: Service, client: ClientRecord, header: dict[str, Any],
                   kind: EnvKind) -> Planned:
    """A Python env the operator allowed (server/hosted.py): num_workers
    worker processes forked from the daemon's template."""
    spec = service.hosted.get(header["env_id"])
    num_envs = options.check_num_envs(header["num_envs"])
    batch_size = options.check_batch_size(header.get("batch_size"), num_envs)
    mode = (options.check_autoreset_mode(header.get("autoreset_mode"))
            or AutoresetMode.NEXT_STEP)
    max_steps = options.check_max_episode_steps(kind.name, header.get("max_episode_steps"))
    render_mode = options.check_render_mode(header.get("render_mode"), spec.id)
    if header.get("env_kwargs"):
        raise InvalidArgumentError(
            f"{spec.id}: a daemon-hosted Python env takes no env kwargs (the operator's "
            "--python-env id fixes the env; register a variant with gymnasium.register "
            "in an --import module)")
    options.check_rows(spec.id, num_envs, spec.num_agents)
    num_workers = options.check_num_workers(header.get("num_workers"), num_envs, DAEMON)
    if num_workers is None:
        num_workers = spec.default_workers(num_envs)
    info_bytes = options.check_info_bytes(kind.name, header.get("info_bytes"))
    seed = header.get("seed")
    options.check_seed(seed, num_envs)  # refused before anything is reserved
    service.check_op_room(client)
    reservation = service.books.reserve(client, spec, num_envs, mode, len(service.sessions),
                                        service.fd_check, num_workers=num_workers,
                                        info_bytes=info_bytes)

    def build() -> Session:  # on the executor: forking and making the envs takes time
        try:
            session = HostedServerSession(
                client.identity, spec, num_envs, mode, max_steps, _seeds(seed, num_envs),
                num_workers, service.segment_prefix, service.hosted.template,
                service.pool.eventfd(), on_free=service.on_session_freed,
                info_bytes=info_bytes, timeout=service.config.hosted_timeout,
                render_mode=render_mode)
        except (OSError, MemoryError) as exc:
            raise LimitExceededError(
                f"cannot make {num_envs} {spec.id} envs in {num_workers} workers: {exc}"
            ) from None
        session.batch_size = batch_size or num_envs
        service.made(session)
        return session

    return reservation, build
