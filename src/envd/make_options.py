"""make's options, each defined once: its default, its bound and where the
bound comes from, its field in the make message, the env kinds that take it
and the refusal when one does not; and the registry of env kinds (KINDS: C,
``puffer:``, ``py:``, ``pz:``), each with the entry points that make it and
what builds its session in this process and in a daemon.

Every entry point checks its arguments here: envd.make in this process
(native/vector_env.py, which gymnasium.make_vec and envd.single_env reach
through envd.vector_make), Client.make (client/connection.py),
MultiClient.make (client/multi.py), and the daemon's make handler
(server/control.py), which checks every field it receives again with the
same definitions (it trusts no client).  So each refusal is written once, and
a client's check and the daemon's say the same thing.

No entry point compares an id's prefix: each asks ``env_kind(env_id)`` for
its kind's record and calls what the record names.

What depends on the env itself (its parameters, agents, render support, its
own time limit, whether it resets itself) is checked where the env is known:
``check_rows`` and ``check_episode`` take those facts as arguments.

This module is pure Python (no native core): the client imports it.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import _native_facts
from envd.autoreset import parse_autoreset_mode
from envd.errors import InvalidArgumentError
from envd.hosted_pettingzoo import PETTINGZOO_PREFIX
from envd.int_args import check_int, is_int, seed_list
from envd.vec_info import episode_statistics_key

#: The most envs one make may ask for, rows of a multi-agent env's agents
#: included (the native vec's limit, ENVD_VEC_MAX_ENVS).
MAX_NUM_ENVS = _native_facts.VEC_MAX_ENVS
#: The most worker threads an in-process pool takes (ENVD_POOL_MAX_THREADS).
MAX_THREADS = _native_facts.POOL_MAX_THREADS
#: The longest time limit (a step count the native vec counts in an int64).
MAX_EPISODE_STEPS = 2**62
#: Bytes of each hosted env's info slot (make's info_bytes; docs/python-envs.md,
#: "Infos"): an env's msgpack-encoded info must fit it.
DEFAULT_INFO_BYTES = 1024
#: The largest info_bytes a make takes (the segment's size is bounded by the
#: daemon's --max-shm-bytes and --max-state-bytes too).
MAX_INFO_BYTES = 1 << 20
#: Values of Client.make's transport option: auto tries shared memory and
#: falls back to inline.
TRANSPORTS = ("auto", "shm", "inline")

# ---- env kinds ------------------------------------------------------------------------------
#: A C env: built in or a plugin's.
NATIVE = "native"
#: A PufferLib Ocean env built by envd ("puffer:<env>", docs/ocean.md): a C env too.
PUFFER = "puffer"
#: A hosted gymnasium env: "py:<gymnasium id>", or a creator callable in this process.
PYTHON = "py"
#: A hosted PettingZoo ParallelEnv, its agents as rows: "pz:<module>:<factory>".
PETTINGZOO = "pz"
#: The prefix of a hosted Python env's id ("py:CartPole-v1", gymnasium's
#: Python env), never confused with the built-in C env of the same id.
PYTHON_PREFIX = "py:"
#: The prefix of an Ocean env's id (DESIGN.md section 14: gymnasium's id
#: parser takes "envd/puffer:go", not "envd/puffer/go").
PUFFER_PREFIX = "puffer:"
#: The kinds stepped in C: they take the same options (their spec says the rest).
_C_ENVS = frozenset((NATIVE, PUFFER))
_HOSTED = frozenset((PYTHON, PETTINGZOO))
_ALL_KINDS = _C_ENVS | _HOSTED

# ---- where an option is given ----------------------------------------------------------------
#: envd.make: the env is stepped in this process.
IN_PROCESS = "envd.make"
#: Client.make and the daemon's make message (and, for an option,
#: MultiClient.make, which hands its options to each daemon's Client.make).
DAEMON = "Client.make"
#: MultiClient.make: one env over several daemons (client/multi.py).  It
#: hands its options to each daemon's Client.make, so it takes the options
#: DAEMON does: an option's places name DAEMON for both (_option_place).
MULTI_DAEMON = "MultiClient.make"


def _option_place(place: str) -> str:
    """The place whose options ``place`` takes (OPTIONS' places name DAEMON
    for MULTI_DAEMON too)."""
    return DAEMON if place == MULTI_DAEMON else place


def kind_of(env_id: Any) -> str:
    """The kind of env an id (KINDS' prefixes) or a creator callable (a
    gymnasium env's: envd.make_pettingzoo takes a ParallelEnv's) makes."""
    if isinstance(env_id, str):
        return next((kind.name for kind in KINDS.values()
                     if kind.prefix is not None and env_id.startswith(kind.prefix)), NATIVE)
    return PYTHON if callable(env_id) else NATIVE


@dataclass(frozen=True)
class Option:
    """One make option.  ``kinds`` and ``places`` say who takes it; a kind
    or place that does not is refused with ``instead`` (what to write
    there)."""

    name: str
    #: what None (or leaving the option out) means
    default: str
    #: its type and range, and where the bound comes from
    bound: str
    #: its field in the make message (None: the caller's own, never sent;
    #: docs/protocol.md gives the fields' wire types)
    wire: str | None
    kinds: frozenset[str] = _ALL_KINDS
    #: IN_PROCESS and DAEMON (which stands for MULTI_DAEMON too)
    places: frozenset[str] = frozenset((IN_PROCESS, DAEMON))
    #: why the kinds that do not take it do not, and what they take instead
    instead: str = ""
    #: why a daemon-served env does not take it (places without DAEMON)
    instead_in_daemon: str = ""


#: Why a hosted PettingZoo env takes no time limit.
_PETTINGZOO_EPISODES = "a hosted PettingZoo env takes its own time limit (max_cycles)"
#: Every make option (docs/configuration.md lists them in this order: tests/test_docs.py).
OPTIONS: dict[str, Option] = {option.name: option for option in (
    Option("num_envs", "(required)", f"1 <= num_envs <= {MAX_NUM_ENVS} (ENVD_VEC_MAX_ENVS), "
           "agents' rows included", "num_envs"),
    Option("seed", "a random base seed", "an int with seed + num_envs <= 2**64, or a list of "
           "num_envs ints in [0, 2**64) (sent as a data frame: list_to_blob)", "seed"),
    Option("autoreset_mode", "next_step", "'next_step', 'same_step', 'disabled' (or "
           "gymnasium's AutoresetMode)", "autoreset_mode"),
    Option("max_episode_steps", "the env's own time limit",
           "C envs 0 <= n <= 2**62 (0: none); hosted Python envs 1 <= n <= 2**62",
           "max_episode_steps", kinds=_C_ENVS | {PYTHON},
           instead=_PETTINGZOO_EPISODES),
    Option("copy", "False (envd.make, Client.make); True (gymnasium.make_vec)", "a bool", None),
    Option("episode_statistics", "True (info['envd_episode'])",
           "True, False or an info key", None),
    Option("batch_size", "num_envs (sync)", "1 <= batch_size <= num_envs (envs, not rows)",
           "batch_size"),
    Option("render_mode", "None (no frames)", "None or 'rgb_array' (C envs: those that "
           "render)", "render_mode"),
    Option("num_threads", "one per usable CPU but one",
           f"0 <= num_threads <= {MAX_THREADS} (ENVD_POOL_MAX_THREADS)", None,
           kinds=_C_ENVS, places=frozenset((IN_PROCESS,)),
           instead="a hosted Python env takes num_workers",
           instead_in_daemon="the daemon's one pool (its --threads) steps every session; pass "
                             "max_threads=K to cap how many of its threads step this "
                             "session's envs"),
    Option("pin_cpus", "no pinning", "one CPU per worker thread, each one this process may "
           "use", None, kinds=_C_ENVS, places=frozenset((IN_PROCESS,)),
           instead="a hosted Python env takes num_workers",
           instead_in_daemon="the daemon's pool threads are pinned by its operator "
                             "(envd --pin-cpus)"),
    Option("plugin", "none", "a plugin library's path", None, kinds=_C_ENVS,
           places=frozenset((IN_PROCESS,)), instead="a hosted Python env takes num_workers",
           instead_in_daemon="the daemon loads the plugins its operator names "
                             "(envd --plugin)"),
    Option("max_threads", "no cap", "0 <= max_threads <= the daemon's --threads "
           "(0: inline on the thread serving the call)", "max_threads",
           kinds=_C_ENVS, places=frozenset((DAEMON,)),
           instead="max_threads caps the daemon's pool threads, which do not step hosted "
                   "Python envs: their worker processes do (num_workers)"),
    Option("num_workers", "picked from a measured step cost (a daemon: at least 1)",
           "envd.make 0 <= num_workers <= num_envs (0: the caller steps them); a daemon "
           "1 <= num_workers <= num_envs", "num_workers", kinds=_HOSTED,
           instead="a C env is stepped by a thread pool: num_threads in this process, the "
                   "daemon's --threads (and max_threads) in a daemon"),
    Option("info_bytes", f"{DEFAULT_INFO_BYTES} (hosted PettingZoo envs: 0)",
           f"0 <= info_bytes <= {MAX_INFO_BYTES} (0: infos are not carried); hosted "
           "PettingZoo envs: 0 only", "info_bytes", kinds=_HOSTED,
           instead="a C env reports its infos in fixed fields (info columns)"),
    Option("transport", "ENVD_TRANSPORT, else 'auto'",
           f"{', '.join(map(repr, TRANSPORTS[:-1]))} or {TRANSPORTS[-1]!r}", None,
           places=frozenset((DAEMON,))),
    Option("fast_path", "taken when the daemon offers it, unless ENVD_FAST_PATH=0",
           "None, True or False", None, places=frozenset((DAEMON,))),
)}

#: The entry points that make an env (an env kind's places).
_EVERYWHERE = frozenset((IN_PROCESS, DAEMON, MULTI_DAEMON))


@dataclass(frozen=True)
class EnvKind:
    """One kind of env: the ids it makes, the options it takes (those of
    OPTIONS whose ``kinds`` name it), the entry points that make it, and
    what builds its session at each: in this process (``builder``) and in a
    daemon (``daemon_builder``).  The entry points ask this record, never
    an id's prefix."""

    name: str
    #: the prefix of its ids (None: any other id)
    prefix: str | None
    #: how a refusal names the kind (plain literals: docs/troubleshooting.md
    #: quotes them; the C kinds share theirs)
    title: str
    #: envd.make's builder, "module:function" (imported on first use: a
    #: client never loads the native core); called as
    #: ``builder(env_id, num_envs, **taken(kind, IN_PROCESS, given), **env_kwargs)``
    builder: str
    #: the daemon's builder of its session, "module:function" in
    #: envd.server.make_builders (the pool session, or hosted workers);
    #: called as ``builder(service, client, header, kind)`` from the make
    #: handler once refuse_unsupported passed the message's fields
    daemon_builder: str
    #: the daemon flag that names the envs of this kind a daemon serves
    #: (None: built in, or a --plugin's, which list_envs shows)
    daemon_flag: str | None = None
    #: a list-valued env kwarg holds one value per env (a C env's
    #: parameters), which a multi-daemon env splits over its shards;
    #: otherwise env kwargs are whole values
    per_env_kwargs: bool = False
    #: the entry points that make it
    places: frozenset[str] = _EVERYWHERE
    #: why the entry points not in places do not, and where to make it
    instead: str = ""

    @property
    def hosted(self) -> bool:
        """Whether its envs are Python objects (gymnasium or PettingZoo envs)
        in worker processes, not C envs."""
        return self.name in _HOSTED

    def options(self, place: str) -> list[str]:
        """The options it takes at place."""
        return [name for name, option in OPTIONS.items()
                if self.name in option.kinds and _option_place(place) in option.places]

    def refuse_place(self, place: str, env_id: str) -> None:
        """InvalidArgumentError when the entry point ``place`` does not make it."""
        if place not in self.places:
            raise InvalidArgumentError(f"{env_id:.200}: {self.instead}")


def load(name: str) -> Any:
    """The object a registry entry names, "module:attribute" (imported now)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


_C_TITLE = "C envs (built-in, a plugin's or 'puffer:<env>')"
_POOL_SESSION = "envd.server.make_builders:pool_session"
_HOSTED_SESSION = "envd.server.make_builders:hosted_session"
#: The env kinds, by name (kind_of tries the prefixes in this order).
KINDS = {kind.name: kind for kind in (
    EnvKind(NATIVE, None, _C_TITLE, "envd.native.vector_env:make_native", _POOL_SESSION,
            per_env_kwargs=True),
    EnvKind(PUFFER, PUFFER_PREFIX, _C_TITLE, "envd.native.ocean_ids:make_puffer",
            _POOL_SESSION, daemon_flag="--ocean", per_env_kwargs=True),
    EnvKind(PYTHON, PYTHON_PREFIX, "hosted Python envs ('py:<gymnasium id>' or an env creator)",
            "envd.native.hosted_env:make_python", _HOSTED_SESSION, daemon_flag="--python-env"),
    EnvKind(PETTINGZOO, PETTINGZOO_PREFIX,
            "hosted PettingZoo envs ('pz:<module>:<factory>')",
            "envd.native.hosted_pettingzoo:make_pettingzoo", _HOSTED_SESSION,
            daemon_flag="--python-env", places=frozenset((IN_PROCESS, DAEMON)),
            instead="a hosted PettingZoo env is served by one daemon: make it with that "
                    "daemon's client (envd.connect(...).make)"),
)}


def env_kind(env_id: Any) -> EnvKind:
    """The registry's record of the kind of env_id (see kind_of)."""
    return KINDS[kind_of(env_id)]


def taken(kind: str, place: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``given`` an env of kind takes at place (after
    refuse_unsupported has refused the others that were given)."""
    names = KINDS[kind].options(place)
    return {name: value for name, value in given.items() if name in names}


def wire_options(header: Mapping[str, Any]) -> dict[str, Any]:
    """A make message's options, by option name (None: absent)."""
    return {name: header.get(option.wire) for name, option in OPTIONS.items() if option.wire}


def refuse_unsupported(kind: str, place: str, given: Mapping[str, Any],
                       env_id: str = "") -> None:
    """Refuse the first option of ``given`` (None: not given) that an env of
    kind, made at place, does not take: one InvalidArgumentError, written
    once per option.  (Values are checked apart: check_autoreset_mode
    refuses a hosted PettingZoo env's modes but next_step.)"""
    for name, value in given.items():
        if value is None:
            continue
        option = OPTIONS[name]
        if _option_place(place) not in option.places:
            raise InvalidArgumentError(f"{place} takes no {name}: {option.instead_in_daemon}")
        if kind not in option.kinds:
            # (one title per kind the option names: the C kinds share theirs)
            takers = " and ".join(dict.fromkeys(KINDS[k].title for k in sorted(option.kinds)))
            about = f"{env_id:.100}: " if env_id else ""
            raise InvalidArgumentError(f"{about}{name} is for {takers} only; {option.instead}")


def check_num_envs(num_envs: Any) -> int:
    return check_int("num_envs", num_envs, 1, MAX_NUM_ENVS)


def check_rows(env_id: str, num_envs: int, agents: int) -> None:
    """A multi-agent env's agents are rows: num_envs * agents must fit a vec."""
    if num_envs * agents > MAX_NUM_ENVS:
        raise InvalidArgumentError(
            f"{env_id} has {agents} agents per env: {num_envs} envs are "
            f"{num_envs * agents} rows, more than the {MAX_NUM_ENVS} a vec takes; make "
            f"at most {MAX_NUM_ENVS // agents} envs")


def check_seed(seed: Any, num_envs: int) -> None:
    """Refuse a bad seed before anything is made (seed_list draws the seeds)."""
    if seed is not None:
        seed_list(seed, num_envs)


def check_batch_size(batch_size: Any, num_envs: int) -> int | None:
    """None (sync: num_envs) or the envs of each async recv."""
    return None if batch_size is None else check_int("batch_size", batch_size, 1, num_envs)


def check_autoreset_mode(mode: Any) -> AutoresetMode | None:
    """The mode asked for (None: not given, the default next_step); every
    kind takes each (a hosted PettingZoo env's rows follow a C multi-agent
    env's rules in each)."""
    if mode is None:
        return None
    return parse_autoreset_mode(mode)


def check_max_episode_steps(kind: str, max_episode_steps: Any) -> int | None:
    """None (the env's own limit) or a time limit: 0 (none) or more for a C
    env, at least 1 for a hosted Python env."""
    if max_episode_steps is None:
        return None
    low = 0 if kind in _C_ENVS else 1
    return check_int("max_episode_steps", max_episode_steps, low, MAX_EPISODE_STEPS)


def check_episode(env_id: str, resets_itself: bool, mode: AutoresetMode | None,
                  max_episode_steps: int | None, default_steps: int | None
                  ) -> tuple[AutoresetMode, int]:
    """A C env's autoreset mode and time limit (0: none) from the checked
    options: None means next_step and the env's own limit; an env that
    resets itself (ABI 5) takes neither."""
    if resets_itself:
        given = [name for name, value in (("autoreset_mode", mode),
                                          ("max_episode_steps", max_episode_steps))
                 if value is not None]
        if given:
            raise InvalidArgumentError(
                f"{env_id} resets itself (it starts its next episode inside step, and has no "
                f"time limit of envd's): make it without {' and '.join(given)}")
        return AutoresetMode.NEXT_STEP, 0  # (what the native vec takes for it; see vec.h)
    steps = (default_steps or 0) if max_episode_steps is None else max_episode_steps
    return mode or AutoresetMode.NEXT_STEP, steps


def check_render_mode(render_mode: Any, env_id: str = "") -> str | None:
    """None or "rgb_array", the one frame kind every env kind draws (whether
    a C env renders at all is its spec's check_render_mode)."""
    if render_mode is None or render_mode == "rgb_array":
        return render_mode
    about = f"{env_id:.100}: " if env_id else ""
    raise InvalidArgumentError(f"{about}render_mode={render_mode!r:.100}: hosted envs render "
                               "'rgb_array' frames (or pass None)")


def check_num_threads(num_threads: Any, default: int) -> int:
    """An in-process pool's worker threads (None: ``default``)."""
    return check_int("num_threads", default if num_threads is None else num_threads, 0,
                     MAX_THREADS)


def check_max_threads(max_threads: Any, threads: int | None = None,
                      whose: str = "this daemon's") -> int | None:
    """A daemon-served session's cap on its pool threads: None (no cap) or
    an int from 0 to the pool's threads (its --threads; None: not known
    here, the daemon checks the top).  ``whose`` names the pool in the
    refusal ("the daemon at E: its" over several daemons)."""
    if max_threads is None:
        return None
    if not is_int(max_threads):
        raise InvalidArgumentError(f"max_threads must be an int or None, got "
                                   f"{type(max_threads).__name__} {max_threads!r}")
    if threads is None:  # (any int the wire carries; the daemon checks its pool)
        if not 0 <= max_threads <= 2**31 - 1:
            raise InvalidArgumentError(
                f"max_threads={max_threads} is out of range; expected 0 <= max_threads "
                "(0: inline on the thread serving the call; None: no cap)")
    elif not 0 <= max_threads <= threads:
        raise InvalidArgumentError(
            f"max_threads={max_threads} is out of range: {whose} pool has {threads} threads "
            f"(--threads), so 0 <= max_threads <= {threads} (0: inline on the thread serving "
            "the call; None: no cap)")
    return int(max_threads)


def check_num_workers(num_workers: Any, num_envs: int, place: str) -> int | None:
    """A hosted env's worker processes: None (picked), or 1 to num_envs; 0
    (the caller steps them) in this process only: a daemon never steps envs
    on its event loop thread."""
    if num_workers is None:
        return None
    return check_int("num_workers", num_workers, 0 if place == IN_PROCESS else 1, num_envs)


def check_info_bytes(kind: str, info_bytes: Any) -> int:
    """A hosted env's info slot (None: DEFAULT_INFO_BYTES); 0 for a hosted
    PettingZoo env, whose env infos are not carried (its rows' info is
    envd's own: agent_mask, episodes)."""
    if kind == PETTINGZOO:
        if info_bytes is not None and info_bytes != 0:
            raise InvalidArgumentError(f"info_bytes={info_bytes!r:.40}: a hosted PettingZoo "
                                       "env's infos are not carried (info_bytes=0 or None)")
        return 0
    return check_int("info_bytes", DEFAULT_INFO_BYTES if info_bytes is None else info_bytes,
                     0, MAX_INFO_BYTES)


def check_episode_statistics(value: Any) -> None:
    """A bad episode_statistics fails before anything is made."""
    episode_statistics_key(value)


def check_transport(transport: Any) -> str:
    """How a daemon-served env's arrays travel: "auto", "shm" or "inline"
    (None: ENVD_TRANSPORT, else "auto")."""
    if transport is None:
        transport = os.environ.get("ENVD_TRANSPORT") or "auto"
    if not isinstance(transport, str) or transport not in TRANSPORTS:
        raise InvalidArgumentError(
            f"transport must be one of {', '.join(TRANSPORTS)} (or ENVD_TRANSPORT unset), "
            f"got {transport!r:.100}")
    return transport


def check_fast_path(fast_path: Any) -> bool | None:
    """Whether a daemon-served env steps through the doorbell: True
    (required), False (never) or None (taken when the daemon offers it);
    None becomes False when ENVD_FAST_PATH is "0"."""
    if fast_path is None:
        return False if os.environ.get("ENVD_FAST_PATH", "1") == "0" else None
    if not isinstance(fast_path, (bool, np.bool_)):  # (numpy's from a config array)
        raise InvalidArgumentError(f"fast_path must be None, True or False, got "
                                   f"{type(fast_path).__name__} {fast_path!r:.100}")
    return bool(fast_path)
