"""server/fair_ops.py: the operation threads' queues, without a daemon."""
from __future__ import annotations

from concurrent.futures import Future

import pytest

import envd
from envd.server.fair_ops import FairOps


class Threads:
    """A fake executor: remembers what started; finish(k) completes it."""

    def __init__(self):
        self.started: list[tuple[str, object]] = []

    def start(self, fn, finished) -> None:
        self.started.append((fn(), finished))

    def finish(self, name: str) -> None:
        (index,) = [i for i, (n, _) in enumerate(self.started) if n == name]
        _, finished = self.started.pop(index)
        future: Future = Future()
        future.set_result(name)
        finished(future)


def test_one_client_never_holds_both_threads_and_turns_go_round():
    threads, done = Threads(), []
    ops = FairOps(threads.start, per_client=1, max_queued=64)
    for k in range(3):
        ops.submit(b"hog", lambda k=k: f"hog{k}", lambda f: done.append(f.result()))
    assert [n for n, _ in threads.started] == ["hog0"]  # the other thread stays free
    ops.submit(b"b", lambda: "b0", lambda f: done.append(f.result()))
    ops.submit(b"b", lambda: "b1", lambda f: done.append(f.result()))
    ops.submit(b"c", lambda: "c0", lambda f: done.append(f.result()))
    assert [n for n, _ in threads.started] == ["hog0", "b0"]
    assert (ops.running, ops.queued) == (2, 4)
    # round-robin in the order clients joined the line: hog, b, c; each
    # turn starts one operation, then the client goes to the back
    threads.finish("hog0")
    threads.finish("b0")
    assert [n for n, _ in threads.started] == ["hog1", "b1"]
    assert ops.waiting(b"hog") == (1, 1) and ops.owners() == {b"hog", b"b", b"c"}
    threads.finish("hog1")
    assert [n for n, _ in threads.started] == ["b1", "c0"]  # c's turn, before hog's third
    threads.finish("b1")
    threads.finish("c0")
    threads.finish("hog2")
    assert done == ["hog0", "b0", "hog1", "b1", "c0", "hog2"]
    assert (ops.running, ops.queued, ops.owners()) == (0, 0, set())


def test_a_full_queue_is_refused_at_once():
    threads = Threads()
    ops = FairOps(threads.start, per_client=2, max_queued=2)
    for k in range(4):  # two run (per_client=2), two wait
        ops.check_room(b"hog")
        ops.submit(b"hog", lambda k=k: k, lambda f: None)
    with pytest.raises(envd.LimitExceededError, match="--max-queued-ops 2"):
        ops.check_room(b"hog")
    ops.check_room(b"other")  # other clients have room
    assert ops.refused == 1 and ops.waiting(b"hog") == (2, 2)


def test_a_departed_clients_waiting_operations_fail_at_once_and_its_running_one_finishes():
    threads, done = Threads(), []

    def record(f: Future) -> None:
        done.append(f.result() if f.exception() is None else repr(f.exception()))

    ops = FairOps(threads.start, per_client=1, max_queued=64)
    for k in range(3):
        ops.submit(b"gone", lambda k=k: f"gone{k}", record)
    ops.submit(b"b", lambda: "b0", record)
    gone = envd.ConnectionLostError("bye")
    assert ops.cancel(b"gone", gone) == 2
    assert done == [repr(gone)] * 2  # failed now, each answered once
    assert ops.waiting(b"gone") == (1, 0) and ops.queued == 0
    assert ops.cancel(b"gone", gone) == 0 and ops.cancel(b"never", gone) == 0
    threads.finish("gone0")
    threads.finish("b0")
    assert done[2:] == ["gone0", "b0"]
    assert (ops.running, ops.queued, ops.owners()) == (0, 0, set())
    ops.submit(b"b", lambda: "b1", record)  # the line still works
    threads.finish("b1")
    assert done[-1] == "b1"
