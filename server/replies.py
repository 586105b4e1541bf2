"""The daemon's books of replies its peers have not read (docs/protocol.md, SECURITY.md).

ZeroMQ queues a reply the peer does not read, in the daemon's memory, and
never says when a peer consumed one.  So the bytes the daemon may hold for
peers are bounded two ways:
  - small replies (at most protocol.SMALL_REPLY_BYTES, every error among
    them) by their count: the ROUTER socket queues at most
    protocol.REPLY_QUEUE messages per peer, and the daemon drops a client
    whose queue is full (Service.send);
  - large replies by receipts: each carries a random token, the client
    names the token of the last large reply it read in the "ack" field of
    its next requests, and these books keep, per connection (routing id),
    the large replies sent and not acknowledged.  A large reply that would
    take a connection over max_per_client bytes, or all connections over
    max_total, is replaced by a small limit_exceeded error; a connection at
    or over its budget has its requests refused before they run.

Invariants: ``total`` is the sum of every ledger's ``bytes``; a ledger
exists only while it holds an unacknowledged reply, and it outlives the
connection's client record (hello, bye, lease expiry): a peer cannot empty
its books by saying hello again.  A ledger nobody acknowledged for a lease
timeout belongs to a peer that is gone or does not read: it is forgotten and
its routing id dropped (remembered, bounded, so that it cannot start again).
"""
from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Iterator

from envd import protocol

#: How many dropped routing ids the daemon remembers (bounded: a long-lived
#: daemon must not grow); with their reasons shared (a handful of distinct
#: texts), about 1.3 MiB (tests/server/test_memos.py, SECURITY.md).
DROPPED_MEMORY = 8192
#: Most large replies one connection may leave unacknowledged (each costs the
#: daemon a few hundred bytes of books, whatever its size).
MAX_UNREAD_LARGE_REPLIES = 1024


class Ledger:
    """The large replies one connection was sent and has not acknowledged, oldest first."""

    __slots__ = ("bytes", "first_seq", "last_seen", "seqs", "sizes")

    def __init__(self) -> None:
        self.sizes: collections.deque[int] = collections.deque()
        self.seqs: dict[int, int] = {}  # token -> sequence number of its reply
        self.first_seq = 0              # sequence number of sizes[0]
        self.bytes = 0
        self.last_seen = time.monotonic()

    def record(self, token: int, size: int) -> None:
        self.seqs[token] = self.first_seq + len(self.sizes)
        self.sizes.append(size)
        self.bytes += size

    def acknowledge(self, token: int) -> int:
        """Forget the reply of token and every one before it; the bytes freed.
        An unknown token (acknowledged already, or made up) frees nothing."""
        seq = self.seqs.get(token)
        freed = 0
        if seq is None:
            return 0
        while self.first_seq <= seq:
            freed += self.sizes.popleft()
            self.first_seq += 1
        # Tokens of the forgotten replies: few (those acknowledged at once).
        for old in [t for t, s in self.seqs.items() if s <= seq]:
            del self.seqs[old]
        self.bytes -= freed
        return freed


class ReplyBooks:
    """Every connection's ledger, the total, and the routing ids dropped."""

    def __init__(self, max_per_client: int, max_total: int):
        self.max_per_client = max_per_client
        self.max_total = max_total
        self.total = 0
        self._ledgers: dict[bytes, Ledger] = {}
        self._dropped: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._reasons: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._ledgers)

    def unread_bytes(self, identity: bytes) -> int:
        ledger = self._ledgers.get(identity)
        return 0 if ledger is None else ledger.bytes

    def acknowledge(self, identity: bytes, token: int) -> None:
        """The peer read the large reply of token and every one before it."""
        ledger = self._ledgers.get(identity)
        if ledger is None:
            return
        self.total -= ledger.acknowledge(token)
        if not ledger.sizes:
            del self._ledgers[identity]

    def seen(self, identity: bytes) -> None:
        """The peer sent a request: it is alive (see sweep)."""
        ledger = self._ledgers.get(identity)
        if ledger is not None:
            ledger.last_seen = time.monotonic()

    def refusal(self, identity: bytes) -> str | None:
        """Why a request of this connection is refused before it runs, or None."""
        ledger = self._ledgers.get(identity)
        if ledger is not None and (ledger.bytes >= self.max_per_client
                                   or len(ledger.sizes) >= MAX_UNREAD_LARGE_REPLIES):
            return (f"this connection has {ledger.bytes} bytes in {len(ledger.sizes)} large "
                    "replies it has not acknowledged reading, at or over the daemon's limit "
                    f"of {self.max_per_client} bytes (--max-reply-bytes-per-client) or "
                    f"{MAX_UNREAD_LARGE_REPLIES} replies; this request was refused and not "
                    "run. Read your replies and acknowledge them (the 'ack' field, "
                    "docs/protocol.md); envd's client does")
        # The total refuses only connections that hold unread replies
        # themselves: one that reads and acknowledges everything still runs
        # its requests (a large reply of it may be withheld, see admit).
        if ledger is not None and self.total >= self.max_total:
            return (f"the daemon holds {self.total} bytes of replies its clients have not "
                    f"read, at or over its limit of {self.max_total} (--max-reply-bytes); "
                    "this request was refused and not run; retry later")
        return None

    def admit(self, identity: bytes, size: int) -> int | str:
        """A large reply of size bytes to a connection: its token (recorded),
        or why it must not be sent."""
        ledger = self._ledgers.get(identity)
        held = 0 if ledger is None else ledger.bytes
        if held + size > self.max_per_client:
            return (f"its reply of {size} bytes would give this connection {held + size} bytes "
                    f"of replies not acknowledged as read, over the daemon's limit of "
                    f"{self.max_per_client} (--max-reply-bytes-per-client)")
        if self.total + size > self.max_total:
            return (f"its reply of {size} bytes would take the daemon's unread replies to "
                    f"{self.total + size} bytes, over its limit of {self.max_total} "
                    "(--max-reply-bytes)")
        if ledger is None:
            ledger = self._ledgers[identity] = Ledger()
        token = secrets.randbits(64)
        ledger.record(token, size)
        self.total += size
        return token

    def forget(self, identity: bytes) -> None:
        """Give up the books of a connection (dropped: its queue is discarded)."""
        ledger = self._ledgers.pop(identity, None)
        if ledger is not None:
            self.total -= ledger.bytes

    # ---- dropped connections --------------------------------------------------------------
    def drop(self, identity: bytes, why: str) -> None:
        """Forget the connection's books and refuse it from now on."""
        self.forget(identity)
        # (one copy of each distinct reason, however many ids share it)
        self._dropped[identity] = self._reasons.setdefault(why, why)
        while len(self._dropped) > DROPPED_MEMORY:
            self._dropped.popitem(last=False)
        if len(self._reasons) > DROPPED_MEMORY:  # (reasons that vary: bounded too)
            self._reasons = {reason: reason for reason in self._dropped.values()}

    @property
    def remembered_drops(self) -> int:
        """Dropped routing ids remembered now (at most DROPPED_MEMORY)."""
        return len(self._dropped)

    def dropped(self, identity: bytes) -> str | None:
        """Why this routing id was dropped, or None."""
        return self._dropped.get(identity)

    def stale(self, older_than: float) -> Iterator[bytes]:
        """Routing ids whose books nobody touched for older_than seconds."""
        now = time.monotonic()
        return iter([identity for identity, ledger in self._ledgers.items()
                     if now - ledger.last_seen > older_than])


def is_small(size: int) -> bool:
    """Whether a reply of size bytes needs no receipt."""
    return size <= protocol.SMALL_REPLY_BYTES
