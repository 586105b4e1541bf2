"""Workers' life: forked from one preloaded template (reused by every make),
reclaimed by close (no process, zombie, fd or mapping left), dead with their
parent."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
from envs import alive, children, open_fds, wait_until

import envd
from envd.native import hosted_template


def test_close_leaves_no_process_zombie_or_fd():
    envd.make("py:Acrobot-v1", 2, num_workers=1).close()  # the template is up
    gc.collect()
    template_pid = hosted_template.template().pid
    # that make's worker (and earlier tests' in this process) may still be
    # exiting on a loaded machine: start from a template with no child
    assert wait_until(lambda: children(template_pid) == [])
    fds = open_fds()
    for _ in range(3):
        env = envd.make("py:Acrobot-v1", 6, num_workers=3)
        pids = env.worker_pids
        assert sorted(children(template_pid)) == sorted(pids)
        env.reset(seed=0)
        results = env.step(np.zeros(6, np.int64))
        env.close()
        del results, env  # (views keep the mapping, and its descriptor, alive)
        gc.collect()
        assert wait_until(lambda: not any(alive(p) for p in pids))
        assert wait_until(lambda: children(template_pid) == [])  # no zombie either
    # (at most the baseline's: a finalizer on another thread may close an
    # earlier test's descriptor meanwhile; a leak keeps one open)
    assert wait_until(lambda: open_fds() <= fds), sorted(open_fds() - fds)
    assert hosted_template.template().pid == template_pid  # one template, reused


def test_template_is_preloaded_and_reused():
    """A second make forks from the same template, which imported the env's
    module at the first."""
    with envd.make("py:Pendulum-v1", 2, num_workers=1):
        first = hosted_template.template().pid
    with open(f"/proc/{first}/maps") as f:
        assert "envd" in f.read()  # the native core is loaded there already
    with envd.make("py:Pendulum-v1", 2, num_workers=1):
        assert hosted_template.template().pid == first


def test_workers_and_template_die_with_their_parent(tmp_path):
    script = textwrap.dedent("""
        import sys, numpy as np, envd
        from envd.native import hosted_template
        env = envd.make("py:CartPole-v1", 4, num_workers=2)
        env.reset(seed=0)
        print(hosted_template.template().pid, *env.worker_pids, flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3 and all(alive(p) for p in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_views_outlive_close():
    """Arrays a step returned stay readable after close (the mapping goes
    with the last view)."""
    env = envd.make("py:CartPole-v1", 2, num_workers=1)
    obs, _ = env.reset(seed=0)
    snapshot = obs.copy()
    env.close()
    assert np.array_equal(obs, snapshot)


def test_close_kills_a_hung_worker(monkeypatch):
    """An env that hangs in a step in flight cannot hang close: after the
    grace period its worker is killed, and nothing is left."""
    from envs import HangingEnv

    from envd.native import hosted_session
    monkeypatch.setattr(hosted_session, "CLOSE_GRACE_SECONDS", 0.5)
    env = envd.make(lambda: HangingEnv(0, at_step=1), 2, num_workers=2, batch_size=1)
    pids = env.worker_pids
    env.async_reset(seed=0)
    for _ in range(2):
        env.recv()
    env.send(np.zeros(1, np.int64), np.array([1]))
    assert env.recv()[4]["env_id"].tolist() == [1]
    env.send(np.zeros(1, np.int64), np.array([0]))  # hangs in worker 0
    env.close()
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_a_killed_template_is_replaced_even_before_it_is_reaped(monkeypatch):
    """waitpid lags a SIGKILL (a process is not reapable until all its
    threads exited): while the dead template still looks alive to it, the
    next make must start a new template, not fail on the old one's closed
    socket (Broken pipe / Connection reset)."""
    first = hosted_template.template()
    os.kill(first.pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(first.pid), 30)
    # (as if waitpid could not reap it yet: the window the race hits)
    monkeypatch.setattr(hosted_template.Template, "alive", lambda self: True)
    with envd.make("py:CartPole-v1", 2, seed=0, num_workers=1) as env:
        assert env.reset()[0].shape == (2, 4)
    monkeypatch.undo()
    assert hosted_template.template() is not first
    assert not first.alive()
