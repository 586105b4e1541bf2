"""A daemon-served env whose step was cut short (Ctrl-C while waiting for a
daemon's answer, a daemon that stopped answering) and async_reset's rows,
over one daemon (a RemoteVecEnv) and two (a MultiVecEnv):

- a step interrupted while waiting (KeyboardInterrupt, injected once into
  the transport's wait, or into a MultiVecEnv's copy of a shard's results
  with another shard not waited for yet) marks every step still unanswered
  as may still be running: the next step refuses until the late answer
  came, then steps as the in-process env would (the cut step ran on every
  daemon), and a later reset's outputs are the reset's, never the late
  step's;
- a step interrupted once its answer was read (while it was taken in: an
  inline env's arrays half copied; or in the channel's wait just after the
  read) never wedges the env: the next step or reset takes the cut step's
  answer in whole, then returns its own, as in-process;
- after an interrupt (not a timeout) the next step waits for the late
  answer instead of refusing at once; a daemon that died while a step may
  still run gives ConnectionLostError, never "retry later" forever; a
  doorbell env's timed-out reset is not taken as ended by the doorbell's
  last answer; an interrupted blocking recv makes the next recv refuse
  (the async books are lost);
- a step refused because one daemon's last step may still be running moves
  no daemon's envs (retrying does not run the healthy ones ahead);
- after async_reset every row of the env's buffers is a fresh episode's
  (reward 0, no flags), as in-process (tests/native/test_async.py).

The reference is the in-process env of the same seed (envd.make), which
tests/integration/test_multi_daemon.py shows bit-identical to the served
ones when nothing is cut short."""
from __future__ import annotations

import dataclasses
import signal

import numpy as np
import pytest
from support.daemon import DEADLINE, daemon_group, wait_until

import envd

NUM_ENVS = 4
#: (transport, fast_path) of the served env
TRANSPORTS = {"inline": ("inline", None), "shm": ("shm", False), "doorbell": ("shm", True)}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    """Two daemons for the module; at the end every session must be closed
    and each must drain to exit 0 leaving no segment."""
    folder = tmp_path_factory.mktemp("sync_step")
    flags = ("--threads", "1", "--lease-timeout", "10")
    with daemon_group(folder, flags, flags) as procs:
        yield procs


@pytest.fixture(scope="module")
def clients(daemons):
    """A MultiClient over both daemons and a Client of the second."""
    multi = envd.connect([d.endpoint for d in daemons], timeout=DEADLINE)
    single = daemons[1].connect(timeout=DEADLINE)
    try:
        yield multi, single
    finally:
        single.close()
        multi.close()


def make_served(clients, kind: str, transport: str, **kwargs):
    """A CartPole env of NUM_ENVS envs on both daemons (kind "multi") or on
    the second (kind "single"), and its steppers that a cut step reaches last
    (the second daemon's)."""
    multi, single = clients
    name, fast_path = TRANSPORTS[transport]
    options = {"transport": name, "fast_path": fast_path, **kwargs}
    env = (multi if kind == "multi" else single).make("CartPole-v1", NUM_ENVS, seed=1, **options)
    for shard in env.shards if kind == "multi" else [env]:
        assert shard.transport == name and shard.fast_path == bool(fast_path)
    return env, (env.shards[-1].stepper if kind == "multi" else env.stepper)


def interrupt_wait_once(monkeypatch, stepper) -> None:
    """The stepper's next wait for an answer raises KeyboardInterrupt (as
    Ctrl-C there would), once: its request is out, its answer not read."""
    def interrupt(*args, **kwargs):
        monkeypatch.undo()
        raise KeyboardInterrupt

    if stepper.fast_path:  # (the doorbell's wait, past its quick look at the answer)
        monkeypatch.setattr(stepper.doorbell, "quick_answer", lambda: None)
        monkeypatch.setattr(stepper.doorbell, "wait", interrupt)
    else:  # (the channel's wait for the posted step's reply)
        monkeypatch.setattr(stepper.channel, "wait_posted", interrupt)


def interrupt_copy_once(monkeypatch, env) -> None:
    """The MultiVecEnv's next copy of a shard's results (the first shard's,
    the second's step posted and not waited for yet) raises
    KeyboardInterrupt, once."""
    stepper = env._stepper
    host = stepper._host

    def interrupt(k: int) -> None:
        monkeypatch.undo()
        raise KeyboardInterrupt

    monkeypatch.setattr(stepper, "_host", dataclasses.replace(host, copy_results=interrupt))


def outputs(result) -> list[np.ndarray]:
    """A step's or reset's arrays, copied (the env's are views)."""
    if len(result) == 2:
        return [np.array(result[0])]
    return [np.array(array) for array in result[:4]]


def assert_same(got, want, what: str) -> None:
    for a, b in zip(outputs(got), outputs(want)):
        np.testing.assert_array_equal(a, b, err_msg=what)


def step_once_free(env, actions) -> tuple:
    """env.step(actions), retried while it is refused because the cut
    step's late answer has not come (a refused step moves no envs)."""
    results = []

    def steps() -> bool:
        try:
            results.append(env.step(actions))
        except envd.EnvStateError as exc:
            assert "timed out or was interrupted" in str(exc), exc
            return False
        return True

    wait_until(steps, what="a step once the cut step's late answer came")
    return results[0]


@pytest.mark.parametrize("kind,transport,where", [
    ("single", "inline", "wait"), ("single", "doorbell", "wait"), ("single", "shm", "wait"),
    ("multi", "inline", "wait"), ("multi", "doorbell", "wait"), ("multi", "shm", "wait"),
    ("multi", "inline", "copy"), ("multi", "doorbell", "copy")])
def test_an_interrupted_step_is_waited_for_before_the_next_call(clients, monkeypatch, kind,
                                                                transport, where):
    zeros, ones = np.zeros(NUM_ENVS, np.int64), np.ones(NUM_ENVS, np.int64)
    reference = envd.make("CartPole-v1", NUM_ENVS, seed=1)
    env, last = make_served(clients, kind, transport)
    try:
        assert_same(env.reset(seed=3), reference.reset(seed=3), "the first reset")
        if where == "wait":
            interrupt_wait_once(monkeypatch, last)
        else:
            interrupt_copy_once(monkeypatch, env)
        with pytest.raises(KeyboardInterrupt):
            env.step(zeros)
        # the step was posted and its answer not read: it may still run
        assert last.maybe_running
        reference.step(zeros)  # (the cut step ran on every daemon)
        assert_same(step_once_free(env, ones), reference.step(ones), "the step after")
        assert not last.maybe_running
        # the late answer was taken in before: the reset's outputs are the reset's
        assert_same(env.reset(seed=5), reference.reset(seed=5), "the reset after")
        assert_same(env.step(zeros), reference.step(zeros), "a step after the reset")
    finally:
        env.close()
        reference.close()


@pytest.mark.parametrize("fast_path", [True, False], ids=["doorbell", "shm"])
def test_a_step_refused_for_one_daemon_moves_no_daemon(harness, fast_path):
    """The second daemon stops answering: the step times out naming it (the
    first daemon's envs stepped); while its late answer cannot come, every
    retried step is refused naming it and leaves the first daemon's envs
    where they are; once it answers, the env steps on as in-process (the
    timed-out step ran on both)."""
    zeros, ones = np.zeros(NUM_ENVS, np.int64), np.ones(NUM_ENVS, np.int64)
    daemons = [harness.daemon("--threads", "1"), harness.daemon("--threads", "1")]
    multi = envd.connect([d.endpoint for d in daemons], timeout=DEADLINE)
    reference = envd.make("CartPole-v1", NUM_ENVS, seed=1)
    try:
        env = multi.make("CartPole-v1", NUM_ENVS, seed=1, fast_path=fast_path)
        assert_same(env.reset(seed=3), reference.reset(seed=3), "the first reset")
        daemons[1].signal(signal.SIGSTOP)  # (returns once it is stopped)
        try:
            for client in multi.clients:  # short only while the daemon cannot answer
                client.timeout = 2.0
            with pytest.raises(envd.EnvdTimeoutError, match=daemons[1].endpoint):
                env.step(zeros)
            first = env.shards[0]
            stepped = [np.array(first.observations), np.array(first.rewards)]
            for _ in range(3):
                with pytest.raises(envd.EnvStateError, match="timed out") as info:
                    env.step(ones)
                assert daemons[1].endpoint in str(info.value)
                assert daemons[0].endpoint not in str(info.value)
                np.testing.assert_array_equal(first.observations, stepped[0])
                np.testing.assert_array_equal(first.rewards, stepped[1])
            with pytest.raises(envd.EnvStateError, match="timed out"):
                env.reset(seed=4)  # (no shard resets either)
            np.testing.assert_array_equal(first.observations, stepped[0])
        finally:
            daemons[1].proc.send_signal(signal.SIGCONT)
        for client in multi.clients:
            client.timeout = DEADLINE
        reference.step(zeros)
        assert_same(step_once_free(env, ones), reference.step(ones), "the step after")
        env.close()
    finally:
        reference.close()
        multi.close()


@pytest.mark.parametrize("kind,transport", [("single", "inline"), ("single", "shm"),
                                            ("multi", "inline"), ("multi", "shm")])
def test_async_reset_leaves_every_row_a_fresh_episodes(clients, kind, transport):
    """tests/native/test_async.py's, served: the env's own buffers (an
    inline env's private copies, a MultiVecEnv's rows) too."""
    env, _ = make_served(clients, kind, transport, batch_size=2)
    try:
        env.reset()
        for _ in range(200):  # (pushing left ends CartPole's episode within ~10 steps)
            env.step(np.zeros(NUM_ENVS, np.int64))
            if env._dones.any():
                break
        assert env.rewards.tolist() == [1.0] * NUM_ENVS and env._dones.any(), env._dones
        env.async_reset()
        assert env.rewards.tolist() == [0.0] * NUM_ENVS
        for flags in (env.terminations, env.truncations, env._dones):
            assert not flags.any(), flags
        assert env.recv()[1].tolist() == [0.0, 0.0]
    finally:
        env.close()


def interrupt_after_read_once(monkeypatch, stepper, where: str) -> None:
    """The stepper's next step answer is read and then cut short by
    KeyboardInterrupt, once: "take" while its outputs are taken in (an
    inline env's arrays half copied: every output array scribbled over
    first), "recv" inside the channel's wait just after the reply was read
    off the socket (the channel no longer awaits it)."""
    if where == "take":
        def take(reply, blobs, rows):
            monkeypatch.undo()
            for name in stepper._outputs if stepper.outputs_in_replies else ():
                stepper.buffers[name][...] = 1  # (half copied: not the step's outputs)
            raise KeyboardInterrupt

        monkeypatch.setattr(stepper, "_take_outputs", take)
        return
    channel = stepper.channel
    recv_reply = channel._recv_reply

    def recv(*args):
        reply = recv_reply(*args)
        if "num_done" in reply:  # (a step's reply)
            monkeypatch.undo()
            raise KeyboardInterrupt
        return reply

    monkeypatch.setattr(channel, "_recv_reply", recv)


@pytest.mark.parametrize("then", ["step", "reset"])
@pytest.mark.parametrize("kind,transport,where", [
    ("single", "inline", "take"), ("single", "shm", "take"), ("single", "inline", "recv"),
    ("single", "shm", "recv"), ("multi", "inline", "take"), ("multi", "shm", "take"),
    ("multi", "inline", "recv"), ("multi", "shm", "recv")])
def test_a_step_interrupted_after_its_answer_was_read_does_not_wedge(
        clients, monkeypatch, kind, transport, where, then):
    """Ctrl-C once the step's reply was read (for a MultiVecEnv: the first
    daemon's, the second's not waited for yet): no late reply can come for
    it, so the next call must not be refused for want of one; it takes the
    cut step's outputs in whole (never the half-copied rows) and then
    returns its own, as in-process."""
    zeros, ones = np.zeros(NUM_ENVS, np.int64), np.ones(NUM_ENVS, np.int64)
    reference = envd.make("CartPole-v1", NUM_ENVS, seed=1)
    env, _ = make_served(clients, kind, transport)
    first = env.shards[0].stepper if kind == "multi" else env.stepper
    try:
        assert_same(env.reset(seed=3), reference.reset(seed=3), "the first reset")
        interrupt_after_read_once(monkeypatch, first, where)
        with pytest.raises(KeyboardInterrupt):
            env.step(zeros)
        if where == "take":  # (outputs half taken in: not claimed done until taken in whole)
            assert first.maybe_running
        reference.step(zeros)  # (the cut step ran on every daemon)
        if then == "step":
            assert_same(env.step(ones), reference.step(ones), "the step after")
        else:  # (a reset while the cut step's answer is unread or half taken in)
            assert_same(env.reset(seed=5), reference.reset(seed=5), "the reset after")
        stepped = env.step(zeros)
        assert_same(stepped, reference.step(zeros), "a step after that")
        for shard in env.shards if kind == "multi" else [env]:
            assert not shard.stepper.maybe_running
    finally:
        env.close()
        reference.close()


def own_daemons(harness, kind: str):
    """Daemons of the test's own (two for kind "multi", else one) and a
    client of them (a MultiClient, or a Client)."""
    daemons = [harness.daemon("--threads", "1") for _ in range(2 if kind == "multi" else 1)]
    if kind == "multi":
        return daemons, envd.connect([d.endpoint for d in daemons], timeout=DEADLINE)
    return daemons, harness.connect(daemons[0], timeout=DEADLINE)


@pytest.mark.parametrize("kind,transport", [
    ("single", "inline"), ("single", "shm"), ("single", "doorbell"), ("multi", "shm"),
    ("multi", "doorbell")])
def test_a_step_interrupted_while_the_daemon_steps_is_waited_for(harness, monkeypatch, kind,
                                                                  transport):
    """Ctrl-C while a slow step runs (tests/integration/test_fast_path.py's
    slow env): the daemon is healthy, so the next step waits for the cut
    step's late answer (at most the client's timeout) instead of refusing
    at once."""
    name, fast_path = TRANSPORTS[transport]
    daemons, client = own_daemons(harness, kind)
    try:
        env = client.make("ConnectFour-v0", 64, seed=0, depth=8, transport=name,
                          fast_path=fast_path)
        env.reset()
        actions = np.full(64, 3, np.int64)
        # (a MultiVecEnv's first: the second daemon's step is not waited for at all)
        first = env.shards[0].stepper if kind == "multi" else env.stepper
        interrupt_wait_once(monkeypatch, first)
        with pytest.raises(KeyboardInterrupt):
            env.step(actions)
        assert first.maybe_running
        env.step(actions)  # (not refused: it waited for the late answer)
        for shard in env.shards if kind == "multi" else [env]:
            assert not shard.stepper.maybe_running
        env.close()
    finally:
        client.close()


@pytest.mark.parametrize("kind,transport", [
    ("single", "inline"), ("single", "shm"), ("single", "doorbell"), ("multi", "shm"),
    ("multi", "doorbell")])
def test_a_daemon_gone_while_a_step_may_run_is_a_lost_connection(harness, kind, transport):
    """A step times out (its daemon stopped), then the daemon dies: the next
    calls raise ConnectionLostError (a MultiVecEnv's names the daemon and
    refuses every later call), never "retry later" forever."""
    name, fast_path = TRANSPORTS[transport]
    daemons, client = own_daemons(harness, kind)
    zeros = np.zeros(NUM_ENVS, np.int64)
    try:
        env = client.make("CartPole-v1", NUM_ENVS, seed=1, transport=name, fast_path=fast_path)
        env.reset(seed=3)
        daemons[-1].signal(signal.SIGSTOP)
        for each in getattr(client, "clients", [client]):
            each.timeout = 1.0
        with pytest.raises(envd.EnvdTimeoutError):
            env.step(zeros)
        daemons[-1].proc.kill()
        daemons[-1].proc.wait()
        lost = []

        def refused_as_lost() -> bool:
            try:
                env.step(zeros)
            except envd.ConnectionLostError as exc:
                lost.append(exc)
                return True
            except envd.EnvStateError as exc:
                assert "timed out or was interrupted" in str(exc), exc
                return False
            raise AssertionError("a step went through on a dead daemon")

        wait_until(refused_as_lost, timeout=DEADLINE / 2, what="the daemon's loss to be noticed")
        if kind == "multi":
            assert daemons[-1].endpoint in str(lost[0])
        with pytest.raises(envd.ConnectionLostError):
            env.step(zeros)
        env.close()
    finally:
        client.close()


def test_a_socket_resets_timeout_is_not_cleared_by_the_doorbells_last_answer(harness):
    """A doorbell env's reset (over the socket) times out: the doorbell's
    answer to the step before it says nothing of the reset, so the next
    step is refused until the reset's late reply came, then steps on as
    in-process (the reset ran)."""
    zeros = np.zeros(NUM_ENVS, np.int64)
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=DEADLINE)
    reference = envd.make("CartPole-v1", NUM_ENVS, seed=1)
    try:
        env = client.make("CartPole-v1", NUM_ENVS, seed=1, fast_path=True)
        assert env.fast_path
        assert_same(env.reset(seed=3), reference.reset(seed=3), "the first reset")
        assert_same(env.step(zeros), reference.step(zeros), "a step")
        daemon.signal(signal.SIGSTOP)
        try:
            client.timeout = 1.0
            with pytest.raises(envd.EnvdTimeoutError):
                env.reset(seed=4)
            with pytest.raises(envd.EnvStateError, match="timed out or was interrupted"):
                env.step(zeros)
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        client.timeout = DEADLINE
        reference.reset(seed=4)
        assert_same(step_once_free(env, zeros), reference.step(zeros), "the step after")
        env.close()
    finally:
        reference.close()


@pytest.mark.parametrize("transport", ["inline", "shm", "doorbell"])
def test_an_interrupted_recv_loses_the_async_books(clients, monkeypatch, transport):
    """Ctrl-C in a blocking recv's wait: the envs its late answer names
    would be received by nobody, so the next send or recv refuses, saying
    so, instead of losing them silently."""
    env, stepper = make_served(clients, "single", transport, batch_size=2)
    try:
        env.async_reset()
        ids = env.recv()[4]["env_id"].copy()
        env.send(np.zeros(2, np.int64), ids)
        env.recv()  # (the other two)
        interrupt_wait_once(monkeypatch, stepper)
        with pytest.raises(KeyboardInterrupt):
            env.recv()
        with pytest.raises(envd.EnvStateError, match="timed out or was interrupted, so which"):
            env.recv()
    finally:
        env.close()


@pytest.mark.parametrize("transport", ["inline", "shm"])
def test_an_interrupted_wait_for_a_kept_recv_ticket_keeps_the_async_books(clients, monkeypatch,
                                                                        transport):
    """Ctrl-C in a wait for a recv ticket its poster keeps (the multi-daemon
    stepper's books hold its tickets, and wait again): the ticket's answer
    is still taken in, so nothing is lost and the stepper goes on (only the
    blocking recv(), which drops its ticket, loses the books).  The
    doorbell's interrupted wait hands its ticket to the same give_up; which
    of its requests a posted send and recv ring (a SEND, a SENDRECV) depends
    on when the daemon answers, so the socket's tickets show the rule."""
    env, stepper = make_served(clients, "single", transport, batch_size=2)
    try:
        env.async_reset()
        env.recv(), env.recv()  # (every env received: none in flight)
        env.actions[:2] = 0
        sent = stepper.post_send(np.array([0, 1]))
        ticket = stepper.post_recv(2)
        interrupt_wait_once(monkeypatch, stepper)
        with pytest.raises(KeyboardInterrupt):
            stepper.wait(ticket)
        assert not stepper.async_lost
        stepper.wait(ticket)
        assert ticket.done and ticket.error is None and sorted(ticket.ids.tolist()) == [0, 1]
        stepper.wait(sent)  # (a socket's send reply: taken in when waited for)
        assert sent.done and sent.error is None
    finally:
        env.close()
