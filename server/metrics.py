"""Prometheus metrics of one daemon, served over HTTP at /metrics (``--metrics-port``).

Only envd's own metrics (and the standard ``process_*`` ones) are served: a
private CollectorRegistry, never prometheus_client's global one.  The hot
path pays almost nothing:
  - step latency (a histogram) and error replies (a counter per code) are
    recorded where they happen, on the event loop thread;
  - everything else is read at scrape time from what the Service keeps
    anyway (plain ints and dicts): the scrape hops onto the event loop thread
    (call_soon_threadsafe) and reads there, so it never races a session being
    freed and never sees a dict changing size.

See docs/metrics.md for every metric.  prometheus-client is an optional
dependency (``pip install 'envd-rl[metrics]'``); this module is imported only
when --metrics-port is set.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from envd.server.service import Service

log = logging.getLogger("envd.server")

#: Step latency buckets (seconds): an inline step of a few cheap envs takes
#: microseconds, a pooled step of a million envs tens of milliseconds or more.
LATENCY_BUCKETS = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                   25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0)
#: How long a scrape waits for the event loop to read the Service's state.
SNAPSHOT_TIMEOUT = 5.0


class Metrics:
    """The metrics of one daemon: its registry, the event-point recorders and the HTTP server."""

    def __init__(self, pool_threads: int):
        self.registry = CollectorRegistry()
        self.pool_threads = pool_threads
        self.step_latency = Histogram(
            "envd_step_latency_seconds",
            "Time from a sync step's submit to its reply (inline and pooled steps, ok or failed "
            "in an env; steps refused before they ran are not counted)",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self._errors = Counter("envd_errors", "Error replies sent, by error code",
                               ["code"], registry=self.registry)
        self._error_children: dict[Any, Any] = {}
        ProcessCollector(registry=self.registry)
        self.registry.register(_ServiceCollector(self))
        self._service: Service | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # ---- event points (event loop thread) ---------------------------------------------
    def observe_step(self, seconds: float) -> None:
        self.step_latency.observe(seconds)

    def count_error(self, code: Any) -> None:
        child = self._error_children.get(code)
        if child is None:
            child = self._error_children[code] = self._errors.labels(code=str(code))
        child.inc()

    def attach(self, service: Service, loop: asyncio.AbstractEventLoop) -> None:
        """Scrapes read this service's state on this loop from now on."""
        self._service, self._loop = service, loop

    # ---- HTTP --------------------------------------------------------------------------
    def serve(self, port: int, addr: str) -> None:
        """Serve /metrics on addr:port from a daemon thread; RuntimeError
        naming --metrics-port when the port cannot be bound."""
        try:
            self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        except OSError as exc:
            raise RuntimeError(f"cannot serve metrics on {addr}:{port} (--metrics-port "
                               f"{port}, --metrics-bind {addr}): {exc.strerror or exc}; pick "
                               "another port with --metrics-port") from None
        log.info("serving Prometheus metrics at http://%s:%d/metrics", addr, port)

    def close(self) -> None:
        """Stop the HTTP server (idempotent); scrapes in progress may fail."""
        self._service = self._loop = None
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            if self._thread is not None:  # (started with the server)
                self._thread.join(timeout=5.0)

    # ---- scrapes (HTTP thread) ---------------------------------------------------------
    def snapshot(self) -> dict[str, Any] | None:
        """The Service's state read on the event loop thread; None before the
        daemon serves, after it stopped, or when the loop does not answer."""
        service, loop = self._service, self._loop
        if service is None or loop is None:
            return None
        result: concurrent.futures.Future = concurrent.futures.Future()

        def read() -> None:
            try:
                result.set_result(read_service(service))
            except BaseException as exc:  # noqa: BLE001 -- reported to the scrape, not the loop
                result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(read)
            return result.result(timeout=SNAPSHOT_TIMEOUT)
        except RuntimeError:  # the loop is closed
            return None
        except concurrent.futures.TimeoutError:
            log.warning("a metrics scrape got no answer from the event loop in %g s",
                        SNAPSHOT_TIMEOUT)
            return None


def read_service(service: Service) -> dict[str, Any]:
    """What a scrape reports of the Service; on the event loop thread."""
    service.collect_doorbell_steps()  # the fast path's steps, up to now
    inline, pooled = service.closed_session_jobs
    envs = 0
    workers: dict[tuple[str, str], int] = {}  # hosted: (session id prefix, env id) -> worker processes
    for session in service.sessions.values():
        envs += session.num_envs
        num_workers = getattr(session, "num_workers", 0)  # (hosted sessions have workers)
        if num_workers:
            workers[(session.id[:8], session.spec.id)] = num_workers
        stats = session.job_stats()
        inline += stats["inline_jobs"]
        pooled += stats["pooled_jobs"]
    return {"env_steps": service.env_steps, "env_steps_by_env": dict(service.env_steps_by_env),
            "sessions": len(service.sessions), "envs": envs, "clients": len(service.clients),
            "shm_bytes": service.shm_bytes, "state_bytes": service.state_bytes,
            "inline_jobs": inline, "pooled_jobs": pooled,
            "sessions_stepping": service.sessions_stepping,
            "lease_expiries": service.lease_expiries,
            "lease_expired_sessions": service.lease_expired_sessions,
            "refused_headers": service.refused_headers,
            "ops_running": service.ops.running, "ops_queued": service.ops.queued,
            "ops_refused": service.ops.refused,
            "draining": service.draining,
            "workers": service.books.workers,
            "session_workers": workers}


class _ServiceCollector:
    """The metrics read from the Service at scrape time."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are only known from collect; no clash checks needed

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("envd_pool_threads", "Native worker threads configured "
                                "(--threads); how many are busy is not measured",
                                value=self.metrics.pool_threads)
        state = self.metrics.snapshot()
        if state is None:
            return
        yield CounterMetricFamily("envd_env_steps", "Env steps, sync and async, over all "
                                  "sessions (one per env stepped)", value=state["env_steps"])
        by_env = CounterMetricFamily("envd_env_steps_by_env", "Env steps by env id",
                                     labels=["env_id"])
        for env_id, count in sorted(state["env_steps_by_env"].items()):
            by_env.add_metric([env_id], count)
        yield by_env
        for name, key, text in (
                ("envd_sessions", "sessions", "Sessions (made envs) open"),
                ("envd_envs", "envs", "Envs in the open sessions"),
                ("envd_clients", "clients", "Client connections known (said hello, lease not expired)"),
                ("envd_shm_bytes", "shm_bytes", "Bytes of shared memory the sessions' segments "
                                                "hold, makes in flight included"),
                ("envd_state_bytes", "state_bytes", "Bytes of env state (heap) the sessions "
                                                    "hold at most, makes in flight included"),
                ("envd_sessions_stepping", "sessions_stepping",
                 "Sessions with a sync step or async batches running on the pool"),
                ("envd_draining", "draining", "1 while the daemon drains after SIGTERM/SIGINT"),
                ("envd_workers", "workers", "Worker processes of hosted Python envs, makes in "
                                            "flight included (what --max-workers limits)"),
                ("envd_ops_running", "ops_running", "Makes, resets and renders running on the "
                                                    "daemon's operation threads"),
                ("envd_ops_queued", "ops_queued", "Makes, resets and renders waiting for an "
                                                  "operation thread, over all clients (per "
                                                  "client: envd status)")):
            yield GaugeMetricFamily(name, text, value=int(state[key]))
        per_session = GaugeMetricFamily("envd_session_workers", "Worker processes of each "
                                        "open hosted Python env session",
                                        labels=["session", "env_id"])
        for (session, env_id), count in sorted(state["session_workers"].items()):
            per_session.add_metric([session, env_id], count)
        yield per_session
        for name, key, text in (
                ("envd_inline_jobs", "inline_jobs",
                 "Step jobs (sync steps and async batches) run inline on the event loop thread"),
                ("envd_pooled_jobs", "pooled_jobs",
                 "Step jobs (sync steps and async batches) split over the native pool"),
                ("envd_lease_expiries", "lease_expiries",
                 "Clients whose lease expired (silent longer than --lease-timeout)"),
                ("envd_lease_expired_sessions", "lease_expired_sessions",
                 "Sessions freed because their client's lease expired"),
                ("envd_ops_refused", "ops_refused",
                 "Makes, resets and renders refused because their client's queue was full "
                 "(--max-queued-ops; per client: envd status)"),
                ("envd_refused_headers", "refused_headers",
                 "Request header frames refused before decoding (over --max-header-bytes, "
                 "nested too deep or holding too many objects)")):
            yield CounterMetricFamily(name, text, value=state[key])
