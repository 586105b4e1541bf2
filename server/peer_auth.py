"""Who may speak to the daemon: the ZAP handler of every socket it serves.

libzmq asks a ZAP handler (ZeroMQ's authentication protocol, RFC 27) about
each new connection before it accepts a single message on it, so a peer this
handler refuses cannot make the daemon buffer anything: libzmq holds a
multi-frame message in memory until its last frame has arrived, whatever its
total size (SECURITY.md, "What one peer can make the daemon hold"), and only
an admitted peer gets that far.

- ipc endpoints are bound with the ZAP domain ``IPC_DOMAIN``.  For them libzmq
  puts the peer's kernel credentials (SO_PEERCRED) in the request's address,
  ``<host>:<uid>:<gid>:<pid>``; the handler admits the uids of
  ``--ipc-allowed-uids`` (default: the daemon's own uid and root), so a socket
  folder whose permissions are looser than they should be does not let other
  users in.  An address without credentials is refused: there is then no way
  to tell who is asking.
- plain tcp endpoints (loopback, or ``--insecure``) are bound before any ZAP
  domain is set (a listener copies the socket's options when it binds), so
  libzmq asks no ZAP handler about them: nothing identifies their peers.
- CURVE tcp endpoints use the domain ``"*"``, whose keys pyzmq's
  Authenticator checks (``configure_curve``).
"""
from __future__ import annotations

import logging
import os
import time

from zmq.auth.thread import ThreadAuthenticator

IPC_DOMAIN = b"envd-ipc"
CURVE_DOMAIN = b"*"

log = logging.getLogger("envd.server")

#: A refused uid is logged at most this often (a peer may retry in a loop).
_LOG_INTERVAL_S = 60.0


def default_ipc_uids() -> frozenset[int]:
    """The daemon's own uid and root: the users a 0700 socket folder admits."""
    return frozenset({os.geteuid(), 0})


def peer_uid(address: str) -> int | None:
    """The uid in a ZAP address of an ipc peer (``<host>:<uid>:<gid>:<pid>``),
    or None when the address carries no credentials."""
    parts = address.rsplit(":", 3)
    if len(parts) != 4 or not all(part.isdigit() for part in parts[1:]):
        return None
    return int(parts[1])


class PeerAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread, with ipc peers checked by uid.

    ``allowed_uids`` None admits every ipc peer the socket folder lets in
    (``--ipc-allowed-uids any``)."""

    def __init__(self, context, allowed_uids: frozenset[int] | None):
        super().__init__(context, log=logging.getLogger("envd.server.auth"))
        self.allowed_uids = allowed_uids
        self._last_logged: dict[int | None, float] = {}

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 6 and msg[2] == IPC_DOMAIN and self.allowed_uids is not None:
            address = msg[3].decode("utf-8", "replace")
            uid = peer_uid(address)
            if uid not in self.allowed_uids:
                self._log_refusal(uid, address)
                self._send_zap_reply(msg[1], b"400", b"uid not allowed on this ipc endpoint")
                return
        await super().handle_zap_message(msg)

    def _log_refusal(self, uid: int | None, address: str) -> None:
        now = time.monotonic()
        if now - self._last_logged.get(uid, -_LOG_INTERVAL_S) < _LOG_INTERVAL_S:
            return
        self._last_logged[uid] = now
        if uid is None:
            log.warning("refused an ipc connection whose credentials libzmq did not give "
                        "(address %r): the daemon cannot tell who it is", address)
        else:
            log.warning("refused an ipc connection of uid %d (pid %s): only uids %s may "
                        "connect (--ipc-allowed-uids); further refusals of this uid are "
                        "logged at most once a minute", uid, address.rsplit(":", 1)[-1],
                        ",".join(map(str, sorted(self.allowed_uids or ()))))
