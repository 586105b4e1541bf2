"""Issue 38: what the daemon remembers of gone connections and sessions is
bounded in bytes, and counted (SECURITY.md's formula, `envd status`).

The memo of dropped connections held up to 65536 routing ids with a reason
string each (about 26 MB, outside the bound); the memos of expired sessions
and clients 65536 ids each."""
from __future__ import annotations

import collections
import os
import secrets
import tracemalloc

from envd import protocol
from envd.server import replies
from envd.server.replies import ReplyBooks
from envd.server.service import Service

MiB = 1 << 20
#: SECURITY.md's figure for each memo (dropped connections, expired
#: sessions, expired clients, truncated sessions: 8 MiB together).
MEMO_BYTES = 2 * MiB


def grown_by(fill) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fill()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def test_the_memo_of_dropped_connections_is_bounded_in_bytes():
    books = ReplyBooks(1 << 20, 1 << 24)
    first = os.urandom(16)

    def fill():
        books.drop(first, "first")
        for _ in range(100_000):  # each with its reason built anew, as Service builds it
            books.drop(os.urandom(16), f"the daemon dropped this connection because it did "
                       f"not read its replies (its queue of {protocol.REPLY_QUEUE} replies was "
                       "full, or its unread replies were not acknowledged for a lease "
                       "timeout) and freed its sessions; connect again and read every reply")
        return books
    grown, _ = grown_by(fill)
    print(f"\ndropped memo: {books.remembered_drops} ids, {grown / MiB:.2f} MiB")
    assert books.remembered_drops == replies.DROPPED_MEMORY
    assert books.dropped(first) is None  # the oldest are forgotten first
    assert grown < MEMO_BYTES, grown


def test_the_memos_of_expired_sessions_and_clients_are_bounded_in_bytes():
    memories = (collections.OrderedDict(), collections.OrderedDict())

    def fill():
        for _ in range(100_000):
            Service._remember(memories[0], secrets.token_hex(16))  # a session id
            Service._remember(memories[1], os.urandom(16))  # a client's routing id
        return memories
    grown, _ = grown_by(fill)
    print(f"\nexpired memos: {len(memories[0])} + {len(memories[1])} ids, {grown / MiB:.2f} MiB")
    assert len(memories[0]) == len(memories[1]) < 100_000
    assert grown < 2 * MEMO_BYTES, grown
