"""Waiting on posted tickets through doorbells (client/transports/waiting.py
DoorbellWaiter) never spins or sleeps on a doorbell the daemon closed, and
sleeps on the socket of a stepper whose doorbell is gone instead of
returning at once (a caller's loop would poll it busily until the answer or
its deadline).  A doorbell in a private mapping, no daemon: nothing answers
unless the test says so."""
from __future__ import annotations

import mmap
import time
import types

import numpy as np
import pytest
import zmq
from gymnasium import spaces

from envd.client.transports import waiting
from envd.client.transports.doorbell_stepper import DoorbellStepper
from envd.client.transports.waiting import DoorbellWaiter
from envd.errors import ConnectionLostError
from envd.stepping import Ticket

OFFSET = 128  # native/src/doorbell.h ENVD_DOORBELL_OFFSET
NUM_ENVS = 4


@pytest.fixture
def stepper():
    """A doorbell stepper of NUM_ENVS envs whose daemon never answers."""
    channel = types.SimpleNamespace(endpoint="ipc:///nowhere", timeout=30.0)
    buffers = {"actions": np.zeros(NUM_ENVS, np.int64),
               "doorbell_ids": np.zeros(NUM_ENVS, np.int64)}
    return DoorbellStepper(channel, "session", "CartPole-v1", spaces.Discrete(2), NUM_ENVS,
                           buffers, memory=mmap.mmap(-1, 4096), offset=OFFSET)


def test_a_doorbell_closed_under_a_posted_recv_settles_it_without_a_sleep(stepper, monkeypatch):
    """The daemon closed the doorbell without answering the SENDRECV rung:
    the wait hands the recv back at once, lost (its batch went with the
    doorbell), instead of sleeping a slice before a liveness check."""

    def no_sleep(bells, seconds):
        raise AssertionError("slept on a closed doorbell")

    monkeypatch.setattr(waiting, "wait_any", no_sleep)
    stepper.post_send(np.arange(NUM_ENVS, dtype=np.int64))  # (all its envs: a SENDRECV)
    recv = stepper.post_recv(NUM_ENVS)
    stepper.doorbell._closed[0] = 1  # (what the daemon's envd_doorbell_stop does)
    waiter = DoorbellWaiter()
    ready, _ = waiter.wait([(0, stepper, recv)], 30.0)
    waiter.close()
    assert ready == [0] and recv.done and recv.lost
    assert isinstance(recv.error, ConnectionLostError) and not stepper.fast_path


class OverSocket:
    """A stepper whose doorbell is gone: its ticket waits on a socket (that
    never becomes readable here)."""

    def __init__(self, context: zmq.Context):
        self.sockets = (context.socket(zmq.PAIR), context.socket(zmq.PAIR))

    def waitables(self, ticket: Ticket) -> tuple:
        return self.sockets


def test_a_ticket_over_the_socket_is_slept_on_not_handed_back_at_once():
    context = zmq.Context()
    stepper = OverSocket(context)
    waiter = DoorbellWaiter()
    try:
        started = time.monotonic()
        ready, check = waiter.wait([(0, stepper, Ticket("recv"))], 0.2)
        elapsed = time.monotonic() - started
    finally:
        waiter.close()
        for sock in stepper.sockets:
            sock.close(linger=0)
        context.term()
    assert (ready, check) == ([], [])  # (nothing came: nothing to poll or check)
    assert elapsed >= 0.1  # (it slept: a loaded machine only makes it longer)
