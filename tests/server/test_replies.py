"""The books of unread replies (server/replies.py): budgets, receipts, drops."""
from __future__ import annotations

from types import SimpleNamespace

from envd import protocol
from envd.server import replies
from envd.server.replies import MAX_UNREAD_LARGE_REPLIES, ReplyBooks, is_small

A, B = b"\x01a", b"\x01b"


def test_tokens_acknowledge_their_reply_and_every_one_before():
    books = ReplyBooks(max_per_client=1000, max_total=10_000)
    tokens = [books.admit(A, 100) for _ in range(5)]
    assert all(isinstance(t, int) for t in tokens) and len(set(tokens)) == 5
    assert books.unread_bytes(A) == books.total == 500
    books.acknowledge(A, tokens[2])
    assert books.unread_bytes(A) == books.total == 200
    books.acknowledge(A, tokens[1])  # acknowledged already: nothing more
    books.acknowledge(A, tokens[4] ^ 1)  # made up: nothing
    books.acknowledge(B, tokens[4])  # another connection's token: nothing
    assert books.total == 200
    books.acknowledge(A, tokens[4])
    assert books.total == 0 and len(books) == 0  # an empty ledger is forgotten


def test_budgets_per_connection_and_in_total():
    books = ReplyBooks(max_per_client=1000, max_total=1500)
    assert isinstance(books.admit(A, 900), int)
    refused = books.admit(A, 200)  # 1100 > 1000: not sent, not recorded
    assert isinstance(refused, str) and "--max-reply-bytes-per-client" in refused
    assert books.refusal(A) is None  # 900 < 1000: requests still run
    assert isinstance(books.admit(A, 100), int)
    assert "--max-reply-bytes-per-client" in books.refusal(A)
    assert isinstance(books.admit(B, 400), int)
    assert "--max-reply-bytes)" in books.admit(B, 101)  # 1400 + 101 > 1500
    assert isinstance(books.admit(B, 100), int)  # 1500: at the total
    assert books.refusal(b"\x01c") is None  # nothing unread: never refused by the total
    assert "--max-reply-bytes" in books.refusal(B)


def test_the_count_of_large_replies_is_bounded_too():
    books = ReplyBooks(max_per_client=1 << 40, max_total=1 << 40)
    for _ in range(MAX_UNREAD_LARGE_REPLIES):
        books.admit(A, 1)
    assert "replies" in books.refusal(A)


def test_a_dropped_connection_is_forgotten_and_remembered(monkeypatch):
    now = [1000.0]  # (a clock of the test's: no sleep, no race with the scheduler)
    monkeypatch.setattr(replies, "time", SimpleNamespace(monotonic=lambda: now[0]))
    books = ReplyBooks(max_per_client=1000, max_total=1000)
    books.admit(A, 600)
    books.drop(A, "gone")
    assert books.total == 0 and books.dropped(A) == "gone" and books.dropped(B) is None
    books.admit(B, 10)
    assert list(books.stale(60.0)) == []
    now[0] += 0.05
    assert list(books.stale(0.01)) == [B]
    books.seen(B)
    assert list(books.stale(0.01)) == []


def test_small_replies_need_no_receipt():
    assert is_small(protocol.SMALL_REPLY_BYTES) and not is_small(protocol.SMALL_REPLY_BYTES + 1)
    for text in ("x" * 100_000, "\u2603" * 100_000):  # cut by bytes, not characters
        long = protocol.error_reply(1, protocol.BadRequest(text))
        assert len(protocol.pack(long)) < protocol.SMALL_REPLY_BYTES
        assert long["message"].endswith("...")
