"""The thread that keeps a client's lease alive while the trainer is busy elsewhere.

A ZeroMQ socket belongs to one thread, so the heartbeat thread has a DEALER
socket of its own and names the client it speaks for (the routing id of the
client's main socket).  It sends a heartbeat every interval whatever the
trainer does, so a trainer that spends minutes in backprop keeps its envs; a
process that dies stops heartbeating and the daemon frees its sessions after
the lease timeout.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any

import zmq

from envd import protocol


class Heartbeat(threading.Thread):
    """Sends ``heartbeat{client}`` to endpoint every interval seconds until stop()."""

    def __init__(self, context: zmq.Context, endpoint: str, client_id: bytes, interval: float,
                 socket_options: Mapping[int, Any] | None = None):
        super().__init__(name="envd-heartbeat", daemon=True)
        self._context = context
        self._endpoint = endpoint
        self._client_id = client_id
        self._interval = interval
        # Those of the client's main socket the connection needs (CURVE keys, IPV6).
        self._socket_options = dict(socket_options or {})
        self._stop_event = threading.Event()

    def run(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            for option, value in self._socket_options.items():
                sock.setsockopt(option, value)
            sock.connect(self._endpoint)
            for request_id in itertools.count():
                try:
                    sock.send(protocol.pack({"type": "heartbeat", "id": request_id,
                                             "client": self._client_id}), zmq.NOBLOCK)
                except zmq.Again:  # no daemon to queue for: try again next time
                    pass
                if self._stop_event.wait(self._interval):
                    return
                while sock.poll(0):  # replies only tell us the daemon is there
                    sock.recv()
        finally:
            sock.close(linger=0)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
