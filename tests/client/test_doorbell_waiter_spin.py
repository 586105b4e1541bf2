"""Waiting on several daemons' doorbells (client/transports/waiting.py): the
trainer spins instead of sleeping only while an answer is expected within
_SPIN_WITHIN_S, and never longer than _SPIN_MARGIN_S past it; a probe, or a
daemon without an estimate, spins up to _SPIN_WITHIN_S.  Checked on a fake clock
(each reading advances it), so no test depends on this machine's speed."""
from __future__ import annotations

import types

import pytest

from envd.client.transports import doorbell_stepper, waiting
from envd.client.transports.doorbell_stepper import DoorbellStepper

STEP_S = 1e-6  # the fake clock's advance per reading


class Bell:
    """A doorbell whose answer comes at the `answer_at`-th look (never: None)."""

    def __init__(self, answer_at: int | None):
        self.looks, self.answer_at = 0, answer_at

    @property
    def answered(self) -> bool:
        self.looks += 1
        return self.answer_at is not None and self.looks >= self.answer_at


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]

    def perf_counter() -> float:
        now[0] += STEP_S
        return now[0]

    monkeypatch.setattr(waiting, "time", types.SimpleNamespace(perf_counter=perf_counter))
    return now


def shard(rung_at: float, expected: float | None) -> types.SimpleNamespace:
    """What the waiter reads of a doorbell stepper: its ring's time and estimate."""
    return types.SimpleNamespace(rung_at=rung_at, expected=expected)


def spin(shards: list, bells: list, probe: bool = False) -> bool:
    return waiting._spin([(k, one, bell) for k, (one, bell) in enumerate(zip(shards, bells))],
                         probe=probe)


def test_no_spin_when_the_answer_is_far(clock):
    for expected in (waiting._SPIN_WITHIN_S + 50e-6, 1.0):
        bell = Bell(answer_at=1)
        spin([shard(clock[0], expected)], [bell])
        assert bell.looks == 0, expected


def test_a_probe_or_a_daemon_without_an_estimate_spins_up_to_the_window(clock):
    """So that an answer within _SPIN_WITHIN_S is seen when it comes: the
    estimate, once above the window by a slept sample, can come back."""
    window = waiting._SPIN_WITHIN_S / STEP_S
    for expected, probe in ((None, False), (1.0, True)):
        late, soon = Bell(answer_at=None), Bell(answer_at=7)
        spin([shard(clock[0], expected)], [late], probe=probe)
        spin([shard(clock[0], expected)], [soon], probe=probe)
        assert window / 2 <= late.looks <= window + 1 and soon.looks == 7, (expected, probe)


def test_spins_until_the_answer_comes(clock):
    bell = Bell(answer_at=5)
    assert spin([shard(clock[0], 10e-6)], [bell]) is True
    assert bell.looks == 5


def test_the_soonest_daemon_decides_and_any_answer_ends_the_spin(clock):
    far, near = Bell(answer_at=None), Bell(answer_at=3)
    spin([shard(clock[0], 1.0), shard(clock[0], 10e-6)], [far, near])
    assert near.looks == 3 and far.looks == 3


def test_a_spin_is_bounded_when_no_answer_comes(clock):
    """At most _SPIN_MARGIN_S past the expected answer, so at most
    _SPIN_WITHIN_S + _SPIN_MARGIN_S in all; an answer overdue by more than
    the margin is not spun for at all."""
    within, margin = waiting._SPIN_WITHIN_S, waiting._SPIN_MARGIN_S
    for expected, bound in ((within - 2e-6, within + margin), (0.0, margin), (-1.0, 0.0)):
        bell = Bell(answer_at=None)
        assert spin([shard(clock[0], expected)], [bell]) is False
        assert bell.looks <= bound / STEP_S + 1, expected
        assert (bell.looks > 0) == (bound > 0), expected


def test_a_probe_spins_at_least_as_long_as_the_estimate_asks(clock):
    """An answer expected 50 us from now: a probe spins to 20 us past it,
    not only the 60 us window from now."""
    bell = Bell(answer_at=None)
    spin([shard(clock[0] - 10e-6, 60e-6 + 10e-6 - 1e-6)], [bell],
                                probe=True)
    window = waiting._SPIN_WITHIN_S / STEP_S
    assert bell.looks > window + 5


def test_an_answer_seen_spinning_replaces_the_estimate_a_slept_one_is_averaged():
    """A slept sample (answer plus the wake-up) moves the estimate by
    _EXPECTED_WEIGHT; one seen spinning sets it: after slept samples held it
    above the window, one probe that sees the answer brings it back."""
    learn = DoorbellStepper.learn_answer_time  # (on the fake: what it reads and writes)
    one = shard(0.0, None)
    learn(one, 90e-6, exact=False)
    assert one.expected == pytest.approx(90e-6)  # (the first sample, however seen)
    learn(one, 110e-6, exact=False)
    assert one.expected == pytest.approx(90e-6 + 20e-6 * doorbell_stepper._EXPECTED_WEIGHT)
    learn(one, 38e-6, exact=True)
    assert one.expected == pytest.approx(38e-6)
    assert one.expected < waiting._SPIN_WITHIN_S
