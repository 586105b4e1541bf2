"""envd daemons placed by Ray: one daemon per Ray node (``pip install 'envd-rl[ray]'``).

    import envd, ray
    from envd.integrations.ray import start_daemons

    ray.init(address="auto")
    with start_daemons(num_nodes=3, threads=4) as daemons:
        with daemons.connect() as client:          # an envd.MultiClient over all of them
            env = client.make("CartPole-v1", num_envs=3072, seed=0)

How: a placement group with one bundle per daemon and the ``STRICT_SPREAD``
strategy puts every bundle on a different node (Ray refuses a group it cannot
place so: fewer nodes than asked is an error, see below).  In each bundle a
``_DaemonActor`` owns one daemon (``python -m envd``), started through a
keeper process (envd.integrations._ray_keeper) that lives outside the actor's
process tree, because Ray SIGKILLs an actor's children when the actor goes
and a SIGKILLed daemon could not remove its socket or segments.  The keeper
watches the actor's process (a pidfd): when the actor dies (``ray.kill``,
``ray.shutdown``, a crash of its node's worker) the daemon gets SIGTERM,
drains and removes its socket file and shared-memory segments; however the
daemon dies, the keeper removes what it left (the socket, the segments of dead
daemons) and records its exit status for the actor.

Endpoints: every daemon serves an ipc socket (trainers on its node: shared
memory, no keys) and a tcp port on its node's own address (Ray's node IP, never
0.0.0.0) protected by CURVE.  The integration generates one key pair for the
daemons and one for the trainers per ``start_daemons`` call; the secrets never
touch a disk longer than the daemon's startup (the actor writes them into a
private folder, the daemon loads them, the folder is removed) except the
trainer's secret, which ``connect_kwargs()`` writes into a mode-0700 folder of
the calling process, removed by ``close()`` (or when that process exits).
They do travel through Ray itself: as the actors' arguments and inside the
pickled ``DaemonSet``, they sit in Ray's control store and object store (which
may spill to disk), under Ray's own trust, as any task argument does.
``endpoints()`` gives, for the calling process's node, the ipc socket of the
daemon there and the tcp endpoint of every other daemon; ``envd.connect(
daemons.endpoints(), **daemons.connect_kwargs())`` reaches them all (ipc
endpoints ignore the keys).

A dead daemon is surfaced, never restarted: its envs' state (episodes in
flight, RNG streams) died with it, so a restarted daemon would silently serve
different envs.  The trainer's next call on an env with rows there raises
``envd.ConnectionLostError`` naming the endpoint; ``daemons.check()`` raises
``envd.DaemonError`` naming the Ray node, its address and the daemon's exit
status, and ``with daemons.naming_nodes(): ...`` turns any envd error from
inside the block into that message.  ``close()`` stops every daemon (SIGTERM,
then SIGKILL after a deadline), kills the actors and removes the placement
group; it is idempotent, and a ``ray.shutdown()`` without it still ends every
daemon (through the death signal).

PufferLib's Ocean envs (docs/ocean.md): a daemon serves them only from its
own node's Ocean cache, so build them on every node first, then pass the
flags on::

    build_ocean_on_nodes(["cartpole"])          # `envd ocean build` on each node
    daemons = start_daemons(3, daemon_args=["--ocean", "cartpole"])
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover -- depends on the installation
    raise ImportError("envd.integrations.ray needs Ray: pip install 'envd-rl[ray]'") from exc

import zmq

import envd
from envd.errors import DaemonError, EnvdError, InvalidArgumentError
from envd.keys import certificate_text, write_private

__all__ = ["DaemonInfo", "DaemonSet", "build_ocean_on_nodes", "start_daemons"]

#: How long a daemon may take to answer its first status (a loaded machine
#: with many Ray workers starting may take a while to import numpy and zmq).
_START_TIMEOUT_S = 120.0

#: How long naming_nodes waits for a lost daemon's exit to be recorded.
_REPORT_GRACE_S = 10.0

#: How long close() waits for a daemon to drain after SIGTERM before SIGKILL.
_STOP_TIMEOUT_S = 30.0


def _free_port(host: str) -> int:
    """A tcp port free on host now (the daemon binds it right after; a port
    taken meanwhile fails the daemon's start, which the actor retries)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class DaemonInfo:
    """One daemon placed by Ray: the node it runs on and its endpoints."""

    node_id: str
    node_ip: str
    ipc: str
    tcp: str
    pid: int

    def describe(self) -> str:
        """The daemon in words, for error messages."""
        return f"the envd daemon on Ray node {self.node_id[:12]} ({self.node_ip}, {self.tcp})"


class _DaemonActor:
    """Owns one envd daemon on its node (a Ray actor; see the module's docstring)."""

    def __init__(self, threads: int, server_secret: str, client_public: str,
                 daemon_args: Sequence[str]):
        self._threads = threads
        self._server_secret = server_secret
        self._client_public = client_public
        self._daemon_args = list(daemon_args)
        self._sock_dir: str | None = None
        self._pid: int | None = None

    def start(self) -> DaemonInfo:
        """Start the daemon and wait until it answers; its DaemonInfo."""
        node_ip = ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        last_error = ""
        for _ in range(3):  # a port taken between _free_port and the bind: try another
            folder = tempfile.mkdtemp(prefix="envd-ray-")  # mode 0700
            try:
                info = self._start_once(folder, node_id, node_ip)
            except RuntimeError as exc:
                last_error = str(exc)
                continue
            finally:
                shutil.rmtree(folder, ignore_errors=True)  # keys loaded (or start failed)
            return info
        raise DaemonError(f"the envd daemon on Ray node {node_id[:12]} ({node_ip}) did not "
                          f"start: {last_error}")

    def _start_once(self, folder: str, node_id: str, node_ip: str) -> DaemonInfo:
        secret_file = os.path.join(folder, "server.key_secret")
        allowed = os.path.join(folder, "clients")
        os.mkdir(allowed, 0o700)
        write_private(secret_file, self._server_secret)
        write_private(os.path.join(allowed, "trainer.key"), self._client_public)
        # The daemon's own folder (socket, pid, status, log; see _ray_keeper)
        # is apart from the key folder, which goes once the daemon has loaded the keys.
        sock_dir = tempfile.mkdtemp(prefix="envd-ray-")
        ipc = f"ipc://{sock_dir}/envd.sock"
        host = f"[{node_ip}]" if ":" in node_ip else node_ip
        tcp = f"tcp://{host}:{_free_port(node_ip)}"
        argv = [sys.executable, "-m", "envd", "--bind", ipc, "--bind", tcp,
                "--threads", str(self._threads), "--curve-secret-key", secret_file,
                "--curve-allowed-clients", allowed, *self._daemon_args]
        subprocess.run([sys.executable, "-m", "envd.integrations._ray_keeper", str(os.getpid()),
                        sock_dir, "--", *argv], stdin=subprocess.DEVNULL, check=True)
        self._sock_dir = sock_dir
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while True:
                status = self.poll()
                if status is not None:
                    raise RuntimeError(f"exit status {status}: " + self._log_tail())
                if self._pid is not None:
                    try:
                        with envd.connect(ipc, timeout=2.0) as client:
                            client.status()
                        break
                    except EnvdError:
                        pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer at {ipc} within {_START_TIMEOUT_S:.0f} s")
                time.sleep(0.2)
        except BaseException:
            self._kill()
            shutil.rmtree(sock_dir, ignore_errors=True)
            self._pid = None
            raise
        return DaemonInfo(node_id, node_ip, ipc, tcp, self._pid)

    def _read(self, name: str) -> str | None:
        if self._sock_dir is None:  # (not started)
            return None
        try:
            with open(os.path.join(self._sock_dir, name), encoding="ascii") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _log_tail(self) -> str:
        if self._sock_dir is None:  # (not started)
            return "(no output)"
        try:
            with open(os.path.join(self._sock_dir, "daemon.log"), "rb") as f:
                return " / ".join(f.read().decode(errors="replace").strip().splitlines()[-3:])
        except FileNotFoundError:
            return "(no output)"

    def poll(self) -> int | None:
        """The daemon's exit status (negative: killed by that signal), or None while it runs."""
        if self._sock_dir is None:
            return None
        if self._pid is None:
            pid = self._read("daemon.pid")
            self._pid = int(pid) if pid else None
        status = self._read("status")
        return int(status) if status else None

    def _kill(self, sig: int = signal.SIGKILL) -> None:
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, sig)

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the daemon (it drains), SIGKILL after timeout; its exit
        status once its keeper has cleaned up after it."""
        if self._sock_dir is None or self._pid is None:
            return None
        if self.poll() is None:
            self._kill(signal.SIGTERM)
        deadline, killed = time.monotonic() + timeout, False
        while (status := self.poll()) is None:
            if time.monotonic() > deadline:
                if killed:  # no keeper left to record it (it was killed too)
                    break
                self._kill()
                deadline, killed = time.monotonic() + timeout, True
            time.sleep(0.05)
        shutil.rmtree(self._sock_dir, ignore_errors=True)
        return status


def _remove_folder(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class DaemonSet:
    """The daemons start_daemons placed, one per Ray node (see the module's docstring).

    Picklable: hand it to other Ray tasks and actors (the env runners of
    envd.integrations.rllib); each process reaches the daemon of its own node
    over ipc and the others over tcp with CURVE."""

    def __init__(self, actors: list[Any], infos: list[DaemonInfo], pg: Any,
                 server_public: str, client_secret: str):
        self.actors = actors
        self.daemons = tuple(infos)
        self._pg = pg
        self._server_public = server_public
        self._client_secret = client_secret
        self._key_dir: str | None = None
        self.closed = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_key_dir"] = None  # each process writes its own copy of the trainer's key
        return state

    def endpoints(self, node_id: str | None = None) -> list[str]:
        """One endpoint per daemon, for a process on node_id (default: the
        calling process's node): ipc for the daemon on that node, tcp for the others."""
        if node_id is None:
            node_id = ray.get_runtime_context().get_node_id()
        return [d.ipc if d.node_id == node_id else d.tcp for d in self.daemons]

    def local_endpoint(self, node_id: str | None = None) -> str | None:
        """The ipc endpoint of the daemon on node_id (default: this process's node), or None."""
        if node_id is None:
            node_id = ray.get_runtime_context().get_node_id()
        return next((d.ipc for d in self.daemons if d.node_id == node_id), None)

    def connect_kwargs(self) -> dict[str, Any]:
        """server_key and client_key for envd.connect (the trainer's secret
        written, once per process, into a private folder)."""
        if self._key_dir is None:
            self._key_dir = tempfile.mkdtemp(prefix="envd-ray-trainer-")
            write_private(os.path.join(self._key_dir, "trainer.key_secret"), self._client_secret)
            weakref.finalize(self, _remove_folder, self._key_dir)
        return {"server_key": self._server_public,
                "client_key": os.path.join(self._key_dir, "trainer.key_secret")}

    def connect(self, **kwargs: Any) -> envd.MultiClient:
        """envd.connect over every daemon (kwargs such as timeout go to each Client)."""
        self._check_open()
        return envd.MultiClient(self.endpoints(), **self.connect_kwargs(), **kwargs)

    def node_of(self, endpoint: str) -> DaemonInfo | None:
        """The daemon serving endpoint (ipc or tcp), or None."""
        return next((d for d in self.daemons if endpoint in (d.ipc, d.tcp)), None)

    def dead(self) -> list[tuple[DaemonInfo, int]]:
        """The daemons that have exited, with their exit status (negative: the signal)."""
        self._check_open()
        refs = [actor.poll.remote() for actor in self.actors]
        dead = []
        for info, ref in zip(self.daemons, refs):
            try:
                code = ray.get(ref)
            except ray.exceptions.RayActorError:
                code = -signal.SIGTERM  # its actor died: the keeper stopped the daemon
            if code is not None:
                dead.append((info, code))
        return dead

    def check(self) -> None:
        """Raise DaemonError naming every dead daemon's node; nothing when all run."""
        dead = self.dead()
        if dead:
            raise DaemonError("; ".join(
                f"{info.describe()} exited with status {code}"
                + (f" (signal {signal.Signals(-code).name})" if code < 0 else "")
                for info, code in dead))

    @contextlib.contextmanager
    def naming_nodes(self) -> Iterator[None]:
        """Within the block, an envd error caused by a dead daemon is raised as
        DaemonError naming its Ray node (the original error chained)."""
        try:
            yield
        except EnvdError as exc:
            if self.closed:
                raise
            # The trainer may see the connection drop before the keeper has
            # recorded the daemon's exit: give it a moment.
            deadline = time.monotonic() + _REPORT_GRACE_S
            while True:
                try:
                    self.check()
                except DaemonError as dead:
                    raise DaemonError(f"{dead}: {exc}") from exc
                if (not isinstance(exc, envd.ConnectionLostError)
                        or time.monotonic() > deadline):
                    raise
                time.sleep(0.1)

    def _check_open(self) -> None:
        if self.closed:
            raise envd.EnvStateError("this DaemonSet is closed")

    def close(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Stop every daemon, kill the actors, remove the placement group. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            ray.get([actor.stop.remote(timeout) for actor in self.actors])
        except ray.exceptions.RayError:
            pass  # a dead actor's keeper has stopped its daemon already
        finally:
            for actor in self.actors:
                ray.kill(actor)
            remove_placement_group(self._pg)
            if self._key_dir is not None:
                _remove_folder(self._key_dir)

    def __enter__(self) -> DaemonSet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<DaemonSet {len(self.daemons)} daemons on nodes "
                f"{[d.node_id[:8] for d in self.daemons]}{' closed' if self.closed else ''}>")


def start_daemons(num_nodes: int, *, threads: int = 1,
                  bundle: dict[str, float] | None = None,
                  daemon_args: Sequence[str] = (),
                  timeout: float = 60.0) -> DaemonSet:
    """Start one envd daemon on each of num_nodes distinct Ray nodes.

    threads: the daemon's --threads; bundle: the Ray resources each daemon
    holds (default ``{"CPU": threads}``), so Ray schedules nothing else onto
    the CPUs its threads use; daemon_args: more envd flags (e.g.
    ``["--python-env", "LunarLander-v3"]``, or ``["--ocean", "cartpole"]``
    after build_ocean_on_nodes).  Ray must be initialised
    (``ray.init``).  DaemonError when Ray cannot place the bundles on
    num_nodes distinct nodes within timeout seconds (nothing is left running)
    or a daemon fails to start."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise InvalidArgumentError(f"num_nodes must be an int >= 1, got {num_nodes!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise InvalidArgumentError(f"threads must be an int >= 0, got {threads!r}")
    if not ray.is_initialized():
        raise EnvdError("start_daemons needs a running Ray: call ray.init() first")
    bundle = dict(bundle) if bundle is not None else {"CPU": float(max(threads, 1))}
    pg = placement_group([bundle] * num_nodes, strategy="STRICT_SPREAD")
    if not pg.wait(timeout):
        remove_placement_group(pg)
        alive = sorted(str(n.get("NodeManagerAddress")) for n in ray.nodes() if n.get("Alive"))
        raise DaemonError(
            f"start_daemons asked for {num_nodes} daemons on distinct Ray nodes with "
            f"{bundle} each, but Ray could not place them within {timeout:g} s: the cluster "
            f"has {len(alive)} live node(s) ({', '.join(alive)}), too few with that much "
            "free; add nodes, lower num_nodes, or ask a smaller bundle")
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    actor_class = ray.remote(_DaemonActor)
    actors = [actor_class.options(
        num_cpus=0, resources={},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote(
        threads, certificate_text(server_public, server_secret),
        certificate_text(client_public, None), list(daemon_args))
        for i in range(num_nodes)]
    try:
        infos = ray.get([actor.start.remote() for actor in actors])
    except BaseException as exc:
        with contextlib.suppress(Exception):
            ray.get([actor.stop.remote() for actor in actors])
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(pg)
        cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
        if isinstance(cause, DaemonError):
            raise DaemonError(str(cause)) from None
        raise
    return DaemonSet(actors, infos, pg, server_public.decode(),
                     certificate_text(client_public, client_secret))


def _build_ocean(envs: list[str], source: str | None, cache: str | None) -> tuple[str, dict]:
    """`envd ocean build envs` here (a Ray task): this node's id and the failures."""
    from envd.native import ocean_build
    try:
        _, failed = ocean_build.build(envs, source, None if cache is None else Path(cache))
    except EnvdError as exc:  # no compiler, no source, a cache not the daemon user's
        failed = {"all": str(exc)}
    return ray.get_runtime_context().get_node_id(), failed


def build_ocean_on_nodes(envs: Sequence[str], *, source: str | None = None,
                         cache: str | None = None) -> list[str]:
    """Build PufferLib's Ocean ``envs`` (``envd ocean build``) on every live
    Ray node, one task per node, so that daemons started with ``daemon_args=
    ["--ocean", ...]`` find them in their node's cache.

    source and cache: as ``envd ocean build``'s (None: ENVD_OCEAN_SOURCE, else
    the pinned sdist from the package index; ENVD_OCEAN_CACHE, else the
    user's cache), as seen on each node.  Nodes that share a filesystem share
    the build (the cache's lock orders them).  Returns the ids of the nodes
    built on; DaemonError naming every node and env that failed."""
    if isinstance(envs, str) or not envs or not all(isinstance(e, str) for e in envs):
        raise InvalidArgumentError(f"envs must be a list of Ocean env names, got {envs!r}")
    if not ray.is_initialized():
        raise EnvdError("build_ocean_on_nodes needs a running Ray: call ray.init() first")
    task = ray.remote(num_cpus=0)(_build_ocean)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    results = ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(list(envs), source, cache) for n in nodes])
    failures = [f"Ray node {node_id[:12]} ({n.get('NodeManagerAddress')}): {env}: {error}"
                for n, (node_id, failed) in zip(nodes, results) for env, error in failed.items()]
    if failures:
        raise DaemonError("envd ocean build failed on " + "; ".join(failures))
    return [node_id for node_id, _ in results]
