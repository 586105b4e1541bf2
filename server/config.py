"""The daemon's one Config, built from the command line, ``ENVD_*`` variables
and an optional TOML file (``--config``, server/config_file.py).

Every flag has an environment variable (the flag's name upper-cased, dashes to
underscores, prefixed with ENVD_); a flag on the command line wins over the
variable, which wins over the file, which wins over the default.  ``--bind``
defaults to ENVD_ENDPOINT, the variable clients read, so one setting serves
both sides.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envd import _native_facts, keys
from envd.protocol import default_endpoint
from envd.server import config_file
from envd.server.stale_segments import check_namespace

#: The native pool's limit (ENVD_POOL_MAX_THREADS).
MAX_THREADS = _native_facts.POOL_MAX_THREADS


def _default_threads() -> int:
    # One worker per usable CPU: while a step runs, the event loop thread and
    # libzmq's I/O thread sleep (nothing to do until the pool's eventfd fires),
    # and unlike envd.make's caller the loop thread never runs chunks itself.
    # The pool never lets more threads spin than there are CPUs.
    return len(os.sched_getaffinity(0))


#: --max-shm-bytes when /dev/shm cannot be measured.
FALLBACK_SHM_BYTES = 8 << 30


def _default_shm_bytes() -> int:
    # Half of /dev/shm's size.  Segments are allocated up front (fallocate), so
    # this bounds the memory the daemon's sessions commit; the other half stays
    # for the rest of the host (DataLoader workers, NCCL, other daemons), which
    # would otherwise be the first to fail when clients fill /dev/shm.  It
    # follows the machine: a container's 64 MiB /dev/shm gets 32 MiB, a host's
    # default tmpfs (half the RAM) a quarter of the RAM.
    try:
        info = os.statvfs("/dev/shm")
    except OSError:
        return FALLBACK_SHM_BYTES
    return max(1, info.f_blocks * info.f_frsize // 2)


#: --max-state-bytes when the machine's memory cannot be measured.
FALLBACK_STATE_BYTES = 8 << 30


def _memory_bytes() -> int | None:
    """The memory this process may use: physical RAM, or the cgroup's limit
    (a container's) when that is lower; None when neither can be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def _default_state_bytes() -> int:
    # A quarter of the memory the daemon may use (RAM, or a container's
    # cgroup limit): with --max-shm-bytes' default (half of /dev/shm, itself
    # half the RAM on a default host) the sessions' memory stays under half
    # of the machine's, leaving the rest to the trainers beside the daemon.
    memory = _memory_bytes()
    return FALLBACK_STATE_BYTES if memory is None else max(1, memory // 4)


def tcp_host(endpoint: str) -> str | None:
    """The host part of a tcp:// endpoint ("*", an address, an interface or a
    host name, without IPv6 brackets); None for other transports."""
    if not endpoint.startswith("tcp://"):
        return None
    host = endpoint[len("tcp://"):].rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback_host(host: str) -> bool:
    """Whether a daemon bound to host can only be reached from this machine:
    127.0.0.0/8, ::1, localhost, the loopback interface, or a name all of whose
    addresses are loopback.  Anything else ("*", 0.0.0.0, an unknown or
    unresolvable name) counts as reachable from the network."""
    if host in ("localhost", "lo"):  # "lo": ZeroMQ binds interface names too
        return True
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        pass  # not an address: a host name, an interface name or "*"
    if host == "*" or not host:
        return False
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(
        ipaddress.ip_address(a.partition("%")[0]).is_loopback for a in addresses)


@dataclass(frozen=True)
class Config:
    """Everything the daemon needs to start; see ``envd --help``."""

    threads: int = field(default_factory=_default_threads)
    bind: tuple[str, ...] = field(default_factory=lambda: (default_endpoint(),))
    log_level: str = "info"
    log_format: str = "text"  # or "json": one object per line, for machines
    lease_timeout: float = 30.0
    max_sessions: int = 1024
    max_envs_per_client: int = 1 << 20
    max_message_bytes: int = 64 << 20
    # A request's header frame (msgpack), refused over this before anything
    # is decoded; bulk data (arrays, make's per-env lists) travels in blob
    # frames under max_message_bytes (SECURITY.md: decoding stays bounded).
    max_header_bytes: int = 64 << 10
    # Resource limits, each refused with LimitExceededError naming the flag:
    #   max_sessions_per_client: sessions one client connection holds at once;
    #   max_shm_bytes: all sessions' shared-memory segments together, checked
    #     before a make creates its segment (default: half of /dev/shm, above);
    #   max_state_bytes: all sessions' heap -- env states (num_envs *
    #     state_size, with their slots), the vec's private input copies and
    #     the bound of the async books -- checked before a make allocates
    #     anything (default: a quarter of the memory, above);
    #   max_requests_per_second: per client connection, a token bucket with a
    #     burst of max(rate, 100); 0 = unlimited.  heartbeat, close and bye are
    #     never throttled, so a throttled client can always leave.
    max_sessions_per_client: int = 256
    max_shm_bytes: int = field(default_factory=_default_shm_bytes)
    max_state_bytes: int = field(default_factory=_default_state_bytes)
    max_requests_per_second: int = 100_000
    # Replies a client has not read (SECURITY.md, docs/protocol.md): bytes of
    # large replies not acknowledged, per connection and over all of them
    # (None: derived from max_message_bytes, see reply_bytes_per_client).
    max_reply_bytes_per_client: int | None = None
    max_reply_bytes: int | None = None
    # File descriptors (SECURITY.md, server/connections.py): peer connections
    # held at once (None: derived from the open-file limit at startup), and
    # how long a new connection has to complete its handshake and say hello
    # before the daemon drops it.
    max_connections: int | None = None
    hello_timeout: float = 10.0
    pin_cpus: tuple[int, ...] | None = None
    # The daemon's shared-memory namespace (server/stale_segments.py): its
    # segments' names carry it, and its startup sweep removes only the dead
    # daemons' segments of the same namespace (None or "": none).
    shm_namespace: str | None = None
    plugins: tuple[str, ...] = ()
    # PufferLib's Ocean envs (docs/ocean.md): the envs served as puffer:<env>
    # ("all": every build recorded), loaded at startup from the operator's
    # own Ocean cache (None: ENVD_OCEAN_CACHE, else $XDG_CACHE_HOME/envd/ocean).
    ocean_envs: tuple[str, ...] = ()
    ocean_cache: str | None = None
    # Hosted Python envs (docs/python-envs.md): the gymnasium ids clients may
    # make as "py:<id>" (nothing else: a client never makes the daemon import
    # anything), the modules imported at startup to register them, and the
    # worker processes all hosted sessions may hold at once, and the longest
    # a hosted make or reset may run (it holds one of the daemon's two
    # operation threads): past it the session's workers are killed.
    python_envs: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    max_workers: int = 64
    hosted_timeout: float = 60.0
    # The operation threads (makes, resets, renders) shared fairly
    # (server/fair_ops.py): how many one client connection runs at once, and
    # how many more wait in its queue before it is refused limit_exceeded.
    max_ops_per_client: int = 1
    max_queued_ops: int = 64
    # SIGTERM's drain: how long running work may take before what still runs
    # in hosted envs (a make, reset or step that hangs) is killed, whatever
    # hosted_timeout says; the daemon then exits within SHUTDOWN_SECONDS
    # (server/daemon.py).  Deploy files give it more (tests/deploy).
    drain_grace: float = 5.0
    # Prometheus metrics over HTTP (docs/metrics.md): off unless a port is
    # given (None or 0 = off); on loopback unless metrics_bind says otherwise.
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"
    # The same-host fast path (docs/architecture.md): sessions whose steps a
    # native thread serves from a doorbell in shared memory, at most this
    # many at once (0 = off; each holds one thread), and how long such a
    # thread spins for the next request before it sleeps.
    fast_path_sessions: int = 64
    fast_path_spin_us: int = 200
    # CURVE authentication of the tcp endpoints (SECURITY.md): the daemon's
    # .key_secret file and the directory of the public .key files of the
    # clients it admits; both or neither.  ipc endpoints never use CURVE (their
    # socket folder is mode 0700).  A tcp endpoint on anything but loopback
    # needs them, unless insecure says to serve it unauthenticated.
    curve_secret_key: str | None = None
    curve_allowed_clients: str | None = None
    insecure: bool = False
    # Who may connect to the ipc endpoints, checked by the peer's kernel
    # credentials before libzmq accepts a message from it (server/peer_auth.py):
    # comma-separated uids, "self" (the daemon's uid), "root", or "any" (whoever
    # the socket folder's permissions let in).
    ipc_allowed_uids: str = "self,root"

    def __post_init__(self) -> None:
        if not 0 <= self.threads <= MAX_THREADS:
            raise ValueError(f"--threads (ENVD_THREADS) must be in [0, {MAX_THREADS}], got {self.threads}")
        if not self.bind:
            raise ValueError("--bind (ENVD_BIND): at least one endpoint is needed")
        for endpoint in self.bind:
            if not endpoint.startswith(("ipc://", "tcp://")):
                raise ValueError(f"--bind (ENVD_BIND): endpoint {endpoint!r} must start with ipc:// or tcp://")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"--log-format (ENVD_LOG_FORMAT) must be text or json, got "
                             f"{self.log_format!r}")
        # getLevelName maps a level's name to its number (an int) on every
        # Python the project supports; getLevelNamesMapping is 3.11+ only.
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(f"--log-level (ENVD_LOG_LEVEL): unknown level {self.log_level!r}")
        if not 0.1 <= self.lease_timeout <= 86400:
            raise ValueError(f"--lease-timeout (ENVD_LEASE_TIMEOUT) must be in [0.1, 86400] seconds, "
                             f"got {self.lease_timeout}")
        for name in ("max_sessions", "max_envs_per_client", "max_message_bytes",
                     "max_sessions_per_client", "max_shm_bytes", "max_state_bytes",
                     "max_requests_per_second", "max_workers"):
            lowest = 0 if name == "max_requests_per_second" else 1  # 0: unlimited
            if getattr(self, name) < lowest:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} (ENVD_{name.upper()}) must be >= {lowest}, "
                                 f"got {getattr(self, name)}")
        for name in ("max_reply_bytes_per_client", "max_reply_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1 << 20:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} (ENVD_{name.upper()}) must be >= 1048576 (1 MiB), "
                                 f"got {value}")
        if not 1 <= self.max_ops_per_client <= 2:
            raise ValueError(f"--max-ops-per-client (ENVD_MAX_OPS_PER_CLIENT) must be 1 or 2 "
                             f"(the daemon's operation threads), got {self.max_ops_per_client}")
        if not 1 <= self.max_queued_ops <= 1 << 20:
            raise ValueError(f"--max-queued-ops (ENVD_MAX_QUEUED_OPS) must be in [1, 1048576], "
                             f"got {self.max_queued_ops}")
        if not 0 <= self.drain_grace <= 3600:
            raise ValueError(f"--drain-grace (ENVD_DRAIN_GRACE) must be in [0, 3600] seconds, "
                             f"got {self.drain_grace}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"--max-header-bytes (ENVD_MAX_HEADER_BYTES) must be >= 1024, got "
                             f"{self.max_header_bytes}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"--max-connections (ENVD_MAX_CONNECTIONS) must be >= 1, got "
                             f"{self.max_connections}")
        if not 0.1 <= self.hosted_timeout <= 86400:
            raise ValueError(f"--hosted-timeout (ENVD_HOSTED_TIMEOUT) must be in [0.1, 86400] "
                             f"seconds, got {self.hosted_timeout}")
        if not 0.1 <= self.hello_timeout <= 3600:
            raise ValueError(f"--hello-timeout (ENVD_HELLO_TIMEOUT) must be in [0.1, 3600] "
                             f"seconds, got {self.hello_timeout}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"--metrics-port (ENVD_METRICS_PORT) must be in [0, 65535] "
                             f"(0 = off), got {self.metrics_port}")
        if not 0 <= self.fast_path_sessions <= 4096:
            raise ValueError(f"--fast-path-sessions (ENVD_FAST_PATH_SESSIONS) must be in "
                             f"[0, 4096] (0 = off), got {self.fast_path_sessions}")
        if not 0 <= self.fast_path_spin_us <= 100_000:
            raise ValueError(f"--fast-path-spin-us (ENVD_FAST_PATH_SPIN_US) must be in "
                             f"[0, 100000], got {self.fast_path_spin_us}")
        if not self.metrics_bind.strip():
            raise ValueError("--metrics-bind (ENVD_METRICS_BIND) must name a host or address")
        if self.pin_cpus is not None and len(self.pin_cpus) != self.threads:
            raise ValueError(f"--pin-cpus (ENVD_PIN_CPUS) needs one CPU per thread ({self.threads}), "
                             f"got {list(self.pin_cpus)}")
        check_namespace(self.shm_namespace or "")
        self.ipc_uids()  # raises ValueError on a bad list
        self._check_curve()

    def ipc_uids(self) -> frozenset[int] | None:
        """The uids --ipc-allowed-uids admits on ipc endpoints; None for "any"."""
        uids: set[int] = set()
        for word in self.ipc_allowed_uids.replace(",", " ").split():
            if word == "any":
                return None
            if word == "self":
                uids.add(os.geteuid())
            elif word == "root":
                uids.add(0)
            elif word.isdigit():
                uids.add(int(word))
            else:
                raise ValueError(f"--ipc-allowed-uids (ENVD_IPC_ALLOWED_UIDS): {word!r} is not "
                                 "a uid, self, root or any")
        if not uids:
            raise ValueError("--ipc-allowed-uids (ENVD_IPC_ALLOWED_UIDS) names no uid; give "
                             "self, root, uids, or any")
        return frozenset(uids)

    def _check_curve(self) -> None:
        """The CURVE flags come as a pair whose files load, and no tcp endpoint
        reachable from the network goes unauthenticated unless --insecure."""
        if (self.curve_secret_key is None) != (self.curve_allowed_clients is None):
            given, missing = (("--curve-secret-key", "--curve-allowed-clients")
                              if self.curve_allowed_clients is None
                              else ("--curve-allowed-clients", "--curve-secret-key"))
            raise ValueError(
                f"{given} ({_variable(given)}) needs {missing} ({_variable(missing)}) too: "
                "CURVE takes the daemon's .key_secret file (--curve-secret-key) and the "
                "directory of the public .key files of the clients it admits "
                "(--curve-allowed-clients); create keys with `envd keygen`")
        if self.curve:
            try:  # read now, so that a bad file stops the daemon before it starts anything
                self.curve_keys()
                self.allowed_client_keys()
            except keys.KeyFileError as exc:
                raise ValueError(str(exc)) from None
            return
        if self.insecure:
            return
        for endpoint in self.bind:
            host = tcp_host(endpoint)
            if host is not None and not is_loopback_host(host):
                raise ValueError(
                    f"--bind (ENVD_BIND) {endpoint} can be reached from the network, and "
                    "without CURVE keys anyone who reaches it may use the daemon: give it "
                    "keys (`envd keygen`, then --curve-secret-key FILE and "
                    "--curve-allowed-clients DIR), bind tcp://127.0.0.1:PORT, or pass "
                    "--insecure (ENVD_INSECURE=1) to serve it unauthenticated on a network "
                    "you trust")

    @property
    def curve(self) -> bool:
        """Whether tcp endpoints are served with CURVE authentication."""
        return self.curve_secret_key is not None

    def curve_keys(self) -> keys.KeyPair:
        """The daemon's key pair (--curve-secret-key); KeyFileError if unusable."""
        assert self.curve_secret_key is not None
        return keys.load_key_pair(self.curve_secret_key, "--curve-secret-key")

    def allowed_client_keys(self) -> list[bytes]:
        """The public keys --curve-allowed-clients admits; KeyFileError if none."""
        assert self.curve_allowed_clients is not None
        return keys.load_allowed_clients(self.curve_allowed_clients, "--curve-allowed-clients")

    def insecure_endpoints(self) -> list[str]:
        """The tcp endpoints served without authentication although they can be
        reached from the network (only with --insecure)."""
        if self.curve:
            return []
        return [e for e in self.bind if (h := tcp_host(e)) is not None and not is_loopback_host(h)]

    @property
    def header_bytes(self) -> int:
        """The cap on a request's header frame: --max-header-bytes, never more
        than --max-message-bytes."""
        return min(self.max_header_bytes, self.max_message_bytes)

    @property
    def request_burst(self) -> int:
        """Requests a client may send at once before --max-requests-per-second
        throttles it (the token bucket's size); 0 when unlimited."""
        return max(self.max_requests_per_second, 100) if self.max_requests_per_second else 0

    @property
    def reply_bytes_per_client(self) -> int:
        """--max-reply-bytes-per-client, by default twice --max-message-bytes:
        room for a reply as large as the largest request, and as much again
        (replies may carry a session's whole arrays)."""
        if self.max_reply_bytes_per_client is not None:
            return self.max_reply_bytes_per_client
        return 2 * self.max_message_bytes

    @property
    def reply_bytes_total(self) -> int:
        """--max-reply-bytes, by default 8 times --max-message-bytes: four
        connections at their whole budget at once."""
        if self.max_reply_bytes is not None:
            return self.max_reply_bytes
        return 8 * self.max_message_bytes

    @property
    def heartbeat_interval(self) -> float:
        """How often clients heartbeat: three chances per lease."""
        return self.lease_timeout / 3


class StartupError(RuntimeError):
    """The daemon cannot start (a flag names something that does not work:
    an env, a module, a plugin): one line naming the flag and its value,
    which the CLI prints as ``envd: cannot start: ...`` before exiting 1."""


def _cpu_list(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.replace(",", " ").split())


def _endpoints(text: str) -> list[str]:
    return text.replace(",", " ").split()


def _variable(flag: str) -> str:
    """--curve-secret-key -> ENVD_CURVE_SECRET_KEY."""
    return "ENVD_" + flag[2:].replace("-", "_").upper()


def _boolean(variable: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{variable}={text!r} is not a valid boolean (1/true/yes or 0/false/no)")


# flag -> (type, help); the defaults come from Config.
_FLAGS: dict[str, tuple[Callable[[str], object], str]] = {
    "threads": (int, "native worker threads shared by every session (0 = step on the "
                     "event loop thread)"),
    "log_level": (str, "debug, info, warning or error"),
    "log_format": (str, "text (one line per event) or json (one object per line)"),
    "lease_timeout": (float, "seconds of silence after which a client's sessions are freed"),
    "max_sessions": (int, "sessions (made envs) the daemon holds at once, over all clients"),
    "max_envs_per_client": (int, "envs one client connection may hold over all its sessions"),
    "max_message_bytes": (int, "largest message accepted (all frames together); a single "
                                 "frame over it drops the sender's connection"),
    "max_header_bytes": (int, "largest header frame (the msgpack part of a request) accepted, "
                              "refused before it is decoded; arrays and per-env lists travel "
                              "in data frames"),
    "max_sessions_per_client": (int, "sessions one client connection may hold at once"),
    "max_shm_bytes": (int, "bytes of shared memory all sessions' segments may take together; "
                           "the default is half of /dev/shm's size"),
    "max_state_bytes": (int, "bytes of heap all sessions' env state may take together: "
                             "num_envs * (state_size + per-env bookkeeping) per session, "
                             "counted at make; the default is a quarter of the memory "
                             "(RAM, or the container's limit)"),
    "max_requests_per_second": (int, "requests one client connection may send per second, "
                                     "with bursts of max(this, 100); heartbeat, close and bye "
                                     "are never throttled (0 = unlimited)"),
    "max_reply_bytes_per_client": (int, "bytes of large replies one client connection may "
                                        "leave unread (not acknowledged) before its requests "
                                        "are refused (default: 2 x --max-message-bytes)"),
    "max_reply_bytes": (int, "bytes of large replies all connections together may leave "
                             "unread (default: 8 x --max-message-bytes)"),
    "max_connections": (int, "peer connections the daemon holds at once; one over it is "
                             "dropped at once (None: derived from the open-file limit, "
                             "see SECURITY.md)"),
    "hello_timeout": (float, "seconds a new connection has to complete its handshake and "
                             "send hello (or a heartbeat for a connected client) before the "
                             "daemon drops it"),
    "max_workers": (int, "worker processes hosted Python envs (--python-env) may hold at "
                         "once, over all sessions"),
    "ocean_cache": (str, "the Ocean build cache --ocean loads from, a folder of the daemon's "
                         "user, mode 0700 (default $XDG_CACHE_HOME/envd/ocean)"),
    "hosted_timeout": (float, "seconds a hosted Python env's make or reset may run in the "
                              "daemon (a hung env): past it the session's workers are killed "
                              "and the call fails with env_error"),
    "max_ops_per_client": (int, "makes, resets and renders one client connection runs at once "
                                "on the daemon's 2 operation threads; the rest wait in its "
                                "queue, served round-robin with the other clients'"),
    "max_queued_ops": (int, "makes, resets and renders one client connection may have waiting "
                            "for an operation thread; one more is refused with limit_exceeded"),
    "drain_grace": (float, "seconds SIGTERM's drain lets running work finish before it kills "
                           "what still runs in hosted Python envs (whatever --hosted-timeout "
                           "says); the daemon then exits within 15 s more"),
    "pin_cpus": (_cpu_list, "comma-separated CPU per worker thread, e.g. 1,2,3"),
    "shm_namespace": (str, "a name carried by this daemon's shared-memory segments: its startup "
                           "sweep removes only the dead daemons' segments of the same namespace "
                           "(a lowercase letter and up to 15 lowercase letters or digits)"),
    "metrics_port": (int, "serve Prometheus metrics over HTTP at /metrics on this port "
                          "(None or 0 = off; needs prometheus-client, pip install "
                          "'envd-rl[metrics]'; see docs/metrics.md)"),
    "metrics_bind": (str, "address the metrics port listens on; anything but loopback "
                          "exposes the daemon's metrics to the network"),
    "fast_path_sessions": (int, "sessions whose steps a native thread serves from a doorbell "
                                "in shared memory, without a socket round trip (same-host "
                                "clients ask for it at make); each holds a thread (0 = off)"),
    "fast_path_spin_us": (int, "microseconds a doorbell thread spins for the next step "
                               "before it sleeps (spinning threads never outnumber the CPUs)"),
    "curve_secret_key": (str, "the daemon's CURVE .key_secret file (from `envd keygen`, mode "
                              "0600): tcp endpoints then admit only clients whose key is in "
                              "--curve-allowed-clients; ipc endpoints stay as they are"),
    "curve_allowed_clients": (str, "directory of the public .key files of the clients a CURVE "
                                   "daemon admits (read at startup)"),
    "ipc_allowed_uids": (str, "users whose processes may connect to the ipc endpoints, checked "
                              "by their kernel credentials before a message is accepted: "
                              "comma-separated uids, self (the daemon's uid), root, or any "
                              "(whoever the socket folder lets in)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # For the help texts only: insecure, so that a client's non-loopback
    # ENVD_ENDPOINT (the default bind) does not stop `envd status` or --help.
    defaults = Config(insecure=True)
    parser.add_argument("--bind", action="append", metavar="ENDPOINT",
                        help="endpoint to serve, repeatable: ipc:///path or tcp://host:port "
                             f"(env ENVD_BIND, else ENVD_ENDPOINT; default {defaults.bind[0]})")
    parser.add_argument("--plugin", action="append", metavar="PATH", dest="plugins",
                        help="env plugin library to load at startup, repeatable (env "
                             "ENVD_PLUGINS, paths separated by ':'); a path that names no "
                             "file stops the startup, a library that fails to load is "
                             "logged and skipped, see `envd status`")
    parser.add_argument("--ocean", action="append", metavar="ENV", dest="ocean_envs",
                        help="PufferLib Ocean env to serve as puffer:ENV, repeatable or "
                             "separated by ',' ('all': every env built; env ENVD_OCEAN), "
                             "loaded from the Ocean cache `envd ocean build` filled; see "
                             "docs/ocean.md")
    parser.add_argument("--python-env", action="append", metavar="ID", dest="python_envs",
                        help="gymnasium env id clients may make as py:ID (a hosted Python "
                             "env in worker processes), or pz:MODULE:FACTORY (a PettingZoo "
                             "ParallelEnv, its agents as rows), repeatable (env ENVD_PYTHON_ENVS, ids "
                             "separated by ','); see docs/python-envs.md")
    parser.add_argument("--import", action="append", metavar="MODULE", dest="imports",
                        help="Python module to import at startup, whose gymnasium.register "
                             "calls add ids for --python-env, repeatable (env ENVD_IMPORTS, "
                             "modules separated by ','); it runs with the daemon's privileges")
    for name, (kind, text) in _FLAGS.items():
        default = getattr(defaults, name)
        if name == "threads":  # the machine's value, said with where it comes from
            default = f"the number of usable CPUs, here {default}"
        parser.add_argument("--" + name.replace("_", "-"), type=kind, metavar=name.upper(),
                            help=f"{text} (env ENVD_{name.upper()}; default {default})")
    parser.add_argument("--config", metavar="FILE",
                        help="a TOML file of settings, keyed by these flags' names (env "
                             "ENVD_CONFIG); a flag or its ENVD_* variable wins over the file "
                             "(docs/configuration.md)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="allow tcp endpoints reachable from the network without CURVE "
                             "keys: anyone who reaches them may use the daemon (env "
                             "ENVD_INSECURE=1)")


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """The Config of parsed arguments, with ENVD_* variables, then the
    --config file (ENVD_CONFIG), filling what the command line left out.
    ValueError names the bad flag, variable or file key."""
    environ = os.environ if environ is None else environ
    path = getattr(args, "config", None) or environ.get("ENVD_CONFIG") or None
    from_file = config_file.load(path, _FLAGS)
    values: dict[str, Any] = {}  # (each checked by its flag's parser)
    for name, (kind, _) in _FLAGS.items():
        given = getattr(args, name, None)
        variable = f"ENVD_{name.upper()}"
        if given is None and environ.get(variable):
            try:
                given = kind(environ[variable])
            except ValueError:
                raise ValueError(f"{variable}={environ[variable]!r} is not a valid "
                                 f"--{name.replace('_', '-')}") from None
        if given is None:
            given = from_file.get(name)
        if given is not None:
            values[name] = given
    bind = (getattr(args, "bind", None) or _endpoints(environ.get("ENVD_BIND", ""))
            or from_file.get("bind"))
    values["bind"] = tuple(bind) if bind else (default_endpoint(environ),)
    plugins = _listed(args, environ, "plugins", os.pathsep) or from_file.get("plugins", ())
    values["plugins"] = tuple(path for path in plugins if path)
    for name in ("python_envs", "imports"):
        given = _listed(args, environ, name, ",") or from_file.get(name, ())
        values[name] = tuple(item.strip() for item in given if item.strip())
    ocean = (_listed(args, environ, "ocean_envs", ",", "ENVD_OCEAN")
             or from_file.get("ocean_envs", ()))
    values["ocean_envs"] = tuple(env.strip() for item in ocean for env in item.split(",")
                                 if env.strip())
    if values.get("pin_cpus") is not None:
        values["pin_cpus"] = tuple(values["pin_cpus"])
    insecure = getattr(args, "insecure", None)
    if insecure is None and environ.get("ENVD_INSECURE", "").strip():
        insecure = _boolean("ENVD_INSECURE", environ["ENVD_INSECURE"])
    if insecure is None:
        insecure = from_file.get("insecure", False)
    values["insecure"] = insecure
    return Config(**values)


def _listed(args: argparse.Namespace, environ: Mapping[str, str], name: str,
            separator: str, variable: str | None = None) -> list[str] | None:
    """A list setting (plugins, python_envs, imports, ocean_envs) from its
    repeated flag, else its variable (ENVD_<NAME> unless named; items
    separated by separator); None when neither gives it (then the --config
    file's applies)."""
    given = getattr(args, name, None)
    if given:
        return list(given)
    text = environ.get(variable or f"ENVD_{name.upper()}", "")
    return text.split(separator) if text.strip() else None
