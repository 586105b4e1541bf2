"""Robustness of the worker-process backend in-process (REVIEW_ISSUE17.md
items 4, 5, 6, 8, 9): a send naming an env twice is refused; the worker
reads its inputs after an acquire fence; the template survives the thread
that started it and never runs an env's code itself; a worker never
outlives a parent that holds no pidfd of it; client bytes are read as bytes
and Discrete bounds never overflow; an inline KeyboardInterrupt stays one."""
from __future__ import annotations

import os
import threading

import gymnasium
import numpy as np
import pytest
from envs import ExitingConstructorEnv, FailingEnv, InterruptingEnv, PidRecordingEnv, alive, wait_until
from gymnasium import spaces

import envd
from envd.buffer_layout import buffer_layout
from envd.native import hosted_template, hosted_worker
from envd.native.hosted_segment import Segment, segment_layout


# ---- item 4: a repeated env id in one send ----------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_a_send_naming_an_env_twice_is_refused(num_workers):
    env = envd.make(lambda: FailingEnv(-1, -1), 4, num_workers=num_workers, batch_size=2)
    try:
        env.async_reset(seed=0)
        for _ in range(2):
            env.recv()
        actions = np.zeros(4, np.int64)
        # (the VecEnv refuses repeats itself; the native session is what the
        # daemon's paths, the doorbell among them, reach)
        with pytest.raises(envd.EnvStateError, match=r"env 1 is already in flight \(or twice"):
            env._session.send(np.array([1, 1]))
        assert env._session.counts() == (0, 0)
        # refused whole: nothing went in flight, and the session goes on
        env.send(actions[:2], np.array([0, 1]))
        ids = sorted(int(i) for i in env.recv()[4]["env_id"])
        assert ids == [0, 1]
        env.send(actions[:2], np.array([2, 3]))
        assert sorted(int(i) for i in env.recv()[4]["env_id"]) == [2, 3]
    finally:
        env.close()


# ---- item 5: the worker's acquire fence -------------------------------------------------
class _Logged(np.ndarray):
    """An array that logs each read of it (the order the worker reads in)."""

    def __getitem__(self, key):
        self.log.append(self.name)
        return super().__getitem__(key)


def test_the_worker_reads_its_inputs_after_an_acquire_fence(monkeypatch):
    """The acquire fence only matters on weakly ordered CPUs (aarch64): on
    x86 loads are not reordered with loads, so no run here can show a stale
    input.  What can be checked is the code path: run_pending reads req,
    then calls envd_worker_acquire, then reads kind and the actions."""
    space = spaces.Discrete(3, start=-1)
    obs_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
    buffers = buffer_layout(obs_space, space, 2, gymnasium.vector.AutoresetMode.NEXT_STEP)
    layout, size = segment_layout(2, 1, buffers)
    segment, fd = Segment.create(layout, size)
    os.close(fd)
    log: list[str] = []
    real_lib = hosted_worker.lib

    class Lib:
        def __getattr__(self, name):
            value = getattr(real_lib, name)
            if name == "envd_worker_acquire":
                def acquire():
                    log.append("acquire")
                    value()
                return acquire
            return value

    monkeypatch.setattr(hosted_worker, "lib", Lib())
    try:
        env_slice = hosted_worker.EnvSlice(lambda: FailingEnv(-1, -1), 0, 2, segment, 0,
                                           gymnasium.vector.AutoresetMode.NEXT_STEP)
        for name, attr in (("req", "_req"), ("kind", "_kind"), ("actions", "_actions")):
            logged = getattr(env_slice, attr).view(_Logged)
            logged.log, logged.name = log, name
            setattr(env_slice, attr, logged)
        env_slice._kind[:] = real_lib.ENVD_HOSTED_RESET
        env_slice._req[:] = 1
        del log[:]
        env_slice.run_pending()
        assert "acquire" in log, log
        fence = log.index("acquire")
        assert "req" in log[:fence], log
        assert "req" not in log[fence + 1:] or log[fence + 1:].index("req") > max(
            log[fence + 1:].index(n) for n in ("kind", "actions") if n in log[fence + 1:]), log
        assert "kind" in log[fence + 1:] and "kind" not in log[:fence], log
        assert "actions" not in log[:fence], log
        env_slice.close()
    finally:
        segment.close()


# ---- item 6: the template and the thread that started it ---------------------------------
def test_the_template_outlives_the_thread_that_started_it():
    hosted_template.shutdown()  # the next make starts one, from the thread below
    made = []
    thread = threading.Thread(target=lambda: made.append(
        envd.make("py:CartPole-v1", 2, num_workers=1, seed=0)))
    thread.start()
    thread.join()
    env = made[0]
    try:
        template_pid = hosted_template.template().pid
        env.reset(seed=0)
        for _ in range(50):  # (PR_SET_PDEATHSIG would have killed it by now)
            env.step(np.zeros(2, np.int64))
        assert alive(template_pid)
        assert all(alive(p) for p in env.worker_pids)
        assert hosted_template.template().pid == template_pid
    finally:
        env.close()


# ---- item 8: the template runs no env code ------------------------------------------------
def test_the_template_never_makes_an_env_itself(tmp_path):
    path = tmp_path / "pids"
    env = envd.make(lambda: PidRecordingEnv(str(path)), 2, num_workers=1)
    try:
        template_pid = hosted_template.template().pid
        pids = {int(line) for line in path.read_text().split()}
        assert template_pid not in pids, (template_pid, pids)
        assert set(env.worker_pids) <= pids  # (and the child that described it)
    finally:
        env.close()


def test_system_exit_in_an_env_constructor_fails_that_make_only():
    template_pid = hosted_template.template().pid
    with pytest.raises(envd.EnvError, match="SystemExit: 7"):
        envd.make(ExitingConstructorEnv, 2, num_workers=1)
    assert hosted_template.template().pid == template_pid  # the same template serves on
    env = envd.make("py:CartPole-v1", 2, num_workers=1, seed=0)
    try:
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))
    finally:
        env.close()
    assert hosted_template.template().pid == template_pid


# ---- item 9: the worker's start pipe -----------------------------------------------------
def test_a_worker_whose_parent_holds_no_pidfd_of_it_exits():
    """The template passes the write end of each worker's start pipe; a
    parent that closes it unwritten (its pidfd_open failed, or it is out of
    fds) leaves no worker behind."""
    space = spaces.Discrete(2)
    obs_space = spaces.Box(-1, 1, (1,), np.float32)
    buffers = buffer_layout(obs_space, space, 1, gymnasium.vector.AutoresetMode.NEXT_STEP)
    layout, size = segment_layout(1, 1, buffers)
    segment, fd = Segment.create(layout, size)
    try:
        pid, start = hosted_template.template().spawn(
            {"spec": ("id", "CartPole-v1", None, {}), "layout": layout, "size": size,
             "worker": 0, "begin": 0, "end": 1, "autoreset_mode":
             gymnasium.vector.AutoresetMode.NEXT_STEP, "spin_ns": 0}, (fd,))
        assert alive(pid)  # waiting for its start byte
        os.close(start)
        assert wait_until(lambda: not alive(pid), 30)
        assert segment.arrays["worker_state"][0] == 0  # it never made its envs
    finally:
        os.close(fd)
        segment.close()


def test_a_worker_never_outlives_a_template_that_dies_as_it_forks():
    """A stand-in template forks a worker (hosted_template._spawn) and exits
    at once: the worker checks its template by the pid taken before the fork
    (evaluated after it, getppid would name init if the template was gone),
    so whichever runs first, it dies too."""
    import socket
    space = spaces.Discrete(2)
    buffers = buffer_layout(spaces.Box(-1, 1, (1,), np.float32), space, 1,
                            gymnasium.vector.AutoresetMode.NEXT_STEP)
    layout, size = segment_layout(1, 1, buffers)
    segment, fd = Segment.create(layout, size)
    read_end, write_end = os.pipe()
    stand_in = os.fork()
    if stand_in == 0:  # the stand-in template
        try:
            ours, _theirs = socket.socketpair()
            pid, _start = hosted_template._spawn(ours, {
                "spec": ("id", "CartPole-v1", None, {}), "layout": layout, "size": size,
                "worker": 0, "begin": 0, "end": 1, "spin_ns": 0,
                "autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP}, [fd])
            os.write(write_end, pid.to_bytes(8, "little"))
        finally:
            os._exit(0)
    try:
        os.close(write_end)
        worker = int.from_bytes(os.read(read_end, 8), "little")
        os.waitpid(stand_in, 0)
        assert worker > 0
        assert wait_until(lambda: not alive(worker), 30)
    finally:
        os.close(read_end)
        os.close(fd)
        segment.close()


# ---- item 9: client bytes and Discrete bounds --------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_discrete_with_a_negative_start_refuses_a_huge_action(num_workers):
    """Discrete(3, start=-1): a - start overflowed for a near INT64_MAX."""
    env = envd.make(lambda: FailingEnv(-1, -1), 2, num_workers=num_workers)
    try:
        env.reset(seed=0)
        for bad in (np.iinfo(np.int64).max, 2, -2, np.iinfo(np.int64).min):
            with pytest.raises(envd.InvalidActionError):
                env.step(np.array([0, bad], np.int64))
        obs, *_ = env.step(np.array([-1, 1], np.int64))
        assert obs[:, 1].tolist() == [-1.0, 1.0]
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_reset_mask_is_read_as_bytes(num_workers):
    """A mask byte that is neither 0 nor 1 (a client can write any byte)
    selects its env, as the native vec's copy_mask reads it."""
    env = envd.make(lambda: FailingEnv(-1, -1), 4, num_workers=num_workers)
    try:
        env.reset(seed=0)
        for _ in range(3):
            env.step(np.zeros(4, np.int64))
        session = env._session
        mask = session.segment.arrays["reset_mask"].view(np.uint8)
        mask[:] = [0, 2, 0, 255]
        session.reset(False, True)
        obs = session.segment.arrays["observations"]
        assert obs[:, 0].tolist() == [3.0, 0.0, 3.0, 0.0]  # envs 1 and 3 were reset
    finally:
        env.close()


# ---- item 9: inline KeyboardInterrupt ----------------------------------------------------
def test_an_inline_keyboard_interrupt_is_raised_as_it_is():
    env = envd.make(lambda: InterruptingEnv(-1, -1), 2, num_workers=0)
    try:
        env.reset(seed=0)
        with pytest.raises(KeyboardInterrupt):
            env.step(np.zeros(2, np.int64))
    finally:
        env.close()


# ---- item 9: --python-env py:ID --------------------------------------------------------
def test_an_allowed_id_given_with_its_prefix_is_served_under_one_prefix():
    from envd.server.hosted import HostedCatalog
    catalog = HostedCatalog(("py:CartPole-v1", "Acrobot-v1"))
    assert catalog.ids() == ["py:Acrobot-v1", "py:CartPole-v1"]
    assert catalog.get("py:CartPole-v1").gym_id == "CartPole-v1"
