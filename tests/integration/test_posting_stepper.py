"""The non-blocking half of a daemon session's stepper
(envd.stepping.PostingStepper), on every transport (shm over the socket,
inline, the doorbell): a posted send and recv finish their tickets with the
envs' results in the buffers, equal to the same envs stepped in-process; a
refused send finishes its ticket with the refusal and steps nothing; the
doorbell rings a send of all its envs with their recv (SENDRECV) and any
other recv only once a caller waits for it; a RECV answered with another
count than asked (a misbehaving daemon) fails its ticket at once and every
later call with the same error; a daemon killed under a posted recv is
reported by check_alive."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from support.daemon import DEADLINE, DaemonProcess, daemon_group, wait_until

import envd
from envd.client.transports.waiting import DoorbellWaiter, SocketWaiter, waiter_for
from envd.stepping import PostingStepper, Ticket

#: (transport, fast_path) of each path
PATHS = {"shm": ("shm", False), "inline": ("inline", False), "doorbell": ("shm", True)}
NUM_ENVS = 4


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with daemon_group(tmp_path_factory.mktemp("posting"), ("--threads", "1")) as procs:
        yield procs[0]


@pytest.fixture(params=list(PATHS))
def remote(daemon, request):
    """A CartPole-v1 env of NUM_ENVS envs on the path, every env idle after
    an async reset with seed 3 (received through the blocking calls)."""
    transport, fast_path = PATHS[request.param]
    with daemon.connect() as client, \
            client.make("CartPole-v1", NUM_ENVS, seed=3, batch_size=NUM_ENVS,
                        transport=transport, fast_path=fast_path) as env:
        assert env.fast_path == fast_path and isinstance(env.stepper, PostingStepper)
        env.async_reset(seed=3)
        env.recv()
        yield env


def received(stepper, ticket: Ticket, in_flight: int) -> list[int]:
    """Every env id the recv ticket and the ones posted after it name
    until in_flight envs came back (waiting as a several-daemon caller does)."""
    waiter, ids = waiter_for([stepper]), []
    deadline = time.monotonic() + DEADLINE
    while True:
        while not stepper.poll(ticket):
            assert time.monotonic() < deadline, "no answer to a posted recv"
            ready, check = waiter.wait([(0, stepper, ticket)], 0.05)
            for _ in check:
                stepper.check_alive("a test's recv")
        assert ticket.error is None, repr(ticket.error)
        ids += ticket.ids.tolist()
        if len(ids) == in_flight:
            waiter.close()
            return ids
        ticket = stepper.post_recv(in_flight - len(ids))


def in_process_step(actions: np.ndarray) -> np.ndarray:
    """The observations of the same envs (seed 3) after one step, in-process."""
    with envd.make("CartPole-v1", NUM_ENVS, seed=3) as local:
        local.reset(seed=3)
        return local.step(actions)[0].copy()


def test_a_posted_send_and_recv_leave_the_in_process_results(remote):
    stepper = remote.stepper
    actions = np.array([0, 1, 1, 0], np.int64)
    stepper.buffers["actions"][:] = actions
    send = stepper.post_send(np.array([1, 2], np.int64))
    ids = received(stepper, stepper.post_recv(2), 2)
    assert sorted(ids) == [1, 2]
    assert stepper.poll(send) and send.error is None
    reference = in_process_step(actions)
    np.testing.assert_array_equal(stepper.buffers["observations"][[1, 2]], reference[[1, 2]])


def test_a_refused_send_finishes_its_ticket_with_the_refusal(remote):
    """Env 1 sent twice: the second send is refused (not idle) and steps
    nothing; env 1 comes back once, as if sent once."""
    stepper = remote.stepper
    actions = np.array([1, 0, 0, 1], np.int64)
    stepper.buffers["actions"][:] = actions
    first = stepper.post_send(np.array([1], np.int64))
    second = stepper.post_send(np.array([1], np.int64))
    wait_until(lambda: stepper.poll(second), what="the refusal read")
    assert isinstance(second.error, envd.EnvStateError) and "env 1" in str(second.error)
    assert received(stepper, stepper.post_recv(1), 1) == [1]
    assert stepper.poll(first) and first.error is None
    np.testing.assert_array_equal(stepper.buffers["observations"][1], in_process_step(actions)[1])


@pytest.mark.parametrize("remote", ["doorbell"], indirect=True)  # (the doorbell's wire)
def test_the_doorbell_rings_a_send_of_all_its_envs_with_their_recv(remote):
    assert remote.fast_path
    stepper = remote.stepper
    stepper.buffers["actions"][:] = 0
    stepper.post_send(np.arange(NUM_ENVS, dtype=np.int64))
    recv = stepper.post_recv(NUM_ENVS)
    assert recv.posted  # (the SENDRECV's recv: out with the send)
    assert sorted(received(stepper, recv, NUM_ENVS)) == list(range(NUM_ENVS))
    stepper.post_send(np.array([0, 3], np.int64))
    recv = stepper.post_recv(2)
    assert not recv.posted  # (the doorbell stays free for sends until a caller waits)
    assert stepper.waitables(recv) == (stepper.doorbell,) and recv.posted
    assert sorted(received(stepper, recv, 2)) == [0, 3]


class OneMore:
    """A doorbell's result word as a misbehaving daemon would answer: one more."""

    def __init__(self, word):
        self.word = word

    def __getitem__(self, index: int) -> int:
        return self.word[index] + 1


@pytest.mark.parametrize("remote", ["doorbell"], indirect=True)  # (the doorbell's answer)
def test_a_recv_answered_with_another_count_fails_its_ticket_and_every_later_call(remote):
    stepper = remote.stepper
    bell = stepper.doorbell
    stepper.buffers["actions"][:] = 0
    stepper.post_send(np.array([0, 3], np.int64))  # (a SEND: its answer's state is 1 now, harmless)
    recv = stepper.post_recv(2)
    bell._result = OneMore(bell._result)
    assert stepper.waitables(recv) == (bell,)  # (rings its RECV of 2)
    wait_until(lambda: bell.answered, what="the RECV's answer")
    assert stepper.poll(recv) and isinstance(recv.error, envd.ProtocolError)
    assert "RECV of 2 envs with 3" in str(recv.error)
    for call in (lambda: stepper.poll(recv), lambda: stepper.wait(recv),
                 lambda: stepper.post_recv(2), stepper.post_step,
                 lambda: stepper.post_send(np.array([1], np.int64)),
                 lambda: remote.step(np.zeros(NUM_ENVS, np.int64)), remote.recv):
        with pytest.raises(envd.ProtocolError) as raised:
            call()
        assert raised.value is recv.error


def test_a_waiter_of_the_transports_kind(remote):
    waiter = waiter_for([remote.stepper])
    assert type(waiter) is (DoorbellWaiter if remote.fast_path else SocketWaiter)
    waiter.close()


@pytest.mark.parametrize("path", ["shm", "doorbell"])
def test_a_daemon_killed_under_a_posted_recv_is_reported(tmp_path, path):
    transport, fast_path = PATHS[path]
    with DaemonProcess(tmp_path / "victim", "--threads", "1") as victim:
        with victim.connect() as client:
            env = client.make("CartPole-v1", NUM_ENVS, seed=3, batch_size=NUM_ENVS,
                              transport=transport, fast_path=fast_path)
            env.async_reset(seed=3)
            env.recv()
            stepper = env.stepper
            victim.signal(signal.SIGSTOP)
            # (all its envs: posted over the socket, a SENDRECV through the
            # doorbell; neither waits for the stopped daemon)
            stepper.post_send(np.arange(NUM_ENVS, dtype=np.int64))
            recv = stepper.post_recv(NUM_ENVS)
            victim.signal(signal.SIGKILL)
            victim.wait()
            waiter = waiter_for([stepper])

            def lost() -> bool:
                try:
                    stepper.poll(recv)
                    waiter.wait([(0, stepper, recv)], 0.05)
                    stepper.check_alive("a test's recv")
                except envd.ConnectionLostError:
                    return True
                return recv.lost

            wait_until(lost, what="the lost daemon reported")
            waiter.close()
