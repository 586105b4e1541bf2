"""native/native_session.py: the native session's books (what every path --
in-process, the daemon's socket handlers, the doorbell -- relies on): recv
returns exactly count ids in ready order, every env sent comes back exactly
once, refusals name the env and its state, async_reset drops what is in
flight, and the doorbell is held off by lock()."""
from __future__ import annotations

import os
import select
import threading
import time

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envd
from envd.buffer_layout import buffer_layout
from envd.errors import EnvStateError, InvalidArgumentError
from envd.native._envd_native import lib
from envd.native.native_session import NativeSession
from envd.native.native_vec import NativePool
from envd.native.request_engine import RequestEngine
from envd.native.vector_env import AUTORESET_MODE_CODES
from envd.stepping import Stepper


def make_session(num_envs: int, pool: NativePool | None, env_id: str = "CartPole-v1",
                 max_threads: int | None = None) -> tuple[NativeSession, dict]:
    spec = envd.native.get_spec(env_id)
    mode = AutoresetMode.NEXT_STEP
    buffers = {name: np.zeros(shape, dtype) for name, (shape, dtype)
               in buffer_layout(spec.observation_space, spec.action_space, num_envs, mode,
                                spec.info_fields).items()}
    buffers["reset_seeds"][...] = np.arange(num_envs, dtype=np.uint64)
    session = NativeSession(spec, num_envs, autoreset_mode=AUTORESET_MODE_CODES[mode],
                            max_episode_steps=500, params=spec.param_values({}, ()),
                            buffers=buffers, pool=pool, max_threads=max_threads)
    session.seed()
    return session, buffers


@pytest.fixture(params=[0, 1], ids=["serial", "pool"])
def session(request):
    pool = NativePool(request.param) if request.param else None
    session, buffers = make_session(16, pool)
    session.buffers = buffers
    yield session
    session.close()
    if pool is not None:
        pool.close()


def test_it_is_a_stepper(session):
    assert isinstance(session, Stepper)


def test_recv_returns_exactly_count_ids_in_ready_order(session):
    session.async_reset(False)
    assert session.counts() == (0, 16)
    first = session.recv(5)
    assert first.dtype == np.int64 and first.tolist() == [0, 1, 2, 3, 4]
    assert session.counts() == (0, 11)
    assert session.recv(11).tolist() == list(range(5, 16))
    assert session.counts() == (0, 0)


def test_every_env_sent_comes_back_exactly_once(session):
    rng = np.random.default_rng(0)
    session.async_reset(False)
    held = list(session.recv(16))
    back: list[int] = []
    for _ in range(200):
        if held and rng.random() < 0.6:
            k = int(rng.integers(1, len(held) + 1))
            chosen = rng.choice(len(held), k, replace=False)
            ids = np.array([held[i] for i in chosen], np.int64)
            held = [e for i, e in enumerate(held) if i not in set(chosen)]
            session.send(ids)
            back.extend(ids.tolist())
        in_flight, ready = session.counts()
        assert in_flight + ready + len(held) == 16
        if in_flight + ready:
            count = int(rng.integers(1, in_flight + ready + 1))
            got = session.recv(count)
            assert len(got) == count
            held.extend(got.tolist())
    assert sorted(held + [e for e in range(16) if e not in held]) == list(range(16))
    assert len(set(held)) == len(held)


def test_try_recv_takes_exactly_count_and_refuses_more_than_are_out(session):
    session.async_reset(False)
    assert session.try_recv(10).tolist() == list(range(10))
    assert session.counts() == (0, 6)
    with pytest.raises(EnvStateError, match="recv returns 7 envs but only 6"):
        session.try_recv(7)
    assert session.try_recv(6).tolist() == list(range(10, 16))


def test_try_recv_returns_none_until_enough_are_ready():
    pool = NativePool(1)
    session, buffers = make_session(256, pool, "Acrobot-v1")
    try:
        session.set_chunk(64)  # every batch on the pool
        session.async_reset(False)
        session.send(session.recv(256))
        nones = 0
        while (got := session.try_recv(256)) is None:
            nones += 1
            time.sleep(0.0005)
        assert sorted(got.tolist()) == list(range(256))
        assert session.counts() == (0, 0)
    finally:
        session.close()
        pool.close()


def test_send_refuses_an_env_not_idle_naming_it_and_its_state(session):
    session.async_reset(False)
    with pytest.raises(EnvStateError, match="env 3 is ready, not received yet"):
        session.send(np.array([3], np.int64))
    ids = session.recv(16)
    session.send(ids[:4])
    in_flight, ready = session.counts()
    if in_flight:  # (a cheap batch may have finished already: then it is ready)
        with pytest.raises(EnvStateError, match="env 1 is (in flight|ready)"):
            session.send(np.array([5, 1], np.int64))
    else:
        with pytest.raises(EnvStateError, match="env 1 is ready"):
            session.send(np.array([5, 1], np.int64))
    assert session.counts()[0] + session.counts()[1] == 4  # env 5 was not sent
    with pytest.raises(InvalidArgumentError, match="out of range"):
        session.send(np.array([16], np.int64))
    with pytest.raises(EnvStateError, match="twice"):
        session.send(np.array([6, 6], np.int64))
    assert sorted(session.recv(4).tolist()) == [0, 1, 2, 3]


def test_step_and_reset_refuse_while_envs_are_out(session):
    session.async_reset(False)
    with pytest.raises(EnvStateError, match=r"step\(\) while 16 envs wait for recv"):
        session.step()
    refused = RequestEngine().step(session.handle, 1)  # (as the daemon's loop submits it)
    assert refused is not None and refused.refused
    with pytest.raises(EnvStateError, match=r"step\(\) while 16 envs wait for recv"):
        session.step_result(refused.result)
    ids = session.recv(16)
    session.buffers["actions"][:] = 1
    session.send(ids[:3])
    # wait until they are ready, then refuse step for the ready ones
    while session.counts()[0]:
        time.sleep(0.001)
    with pytest.raises(EnvStateError, match="3 envs wait for recv"):
        session.step()
    # reset forgets the ready ones and goes back to step()
    session.reset(False, False)
    assert session.counts() == (0, 0)
    assert session.step() >= 0


def test_reset_refuses_while_envs_are_in_flight():
    """(The C test of session.c holds a batch in flight deterministically; here
    a pooled batch of 4096 Acrobots is long enough that the reset right after
    the send finds it in flight at least once in 10 tries, on any machine.)"""
    pool = NativePool(1)
    session, buffers = make_session(4096, pool, "Acrobot-v1")
    try:
        session.set_chunk(64)  # every batch on the pool
        session.async_reset(False)
        refusals = 0
        for _ in range(10):
            session.send(session.recv(4096))
            try:
                session.reset(False, False)  # (refused, or it forgets the ready envs)
            except EnvStateError as exc:
                assert "reset() while" in str(exc) and "in flight" in str(exc)
                refusals += 1
            session.async_reset(False)
        assert refusals
    finally:
        session.close()
        pool.close()


RENDER_REFUSED = r"render\(\) while envs are in flight or not received"


def test_render_refuses_while_envs_are_out_as_the_daemon_does(session):
    """In flight or ready: their results have not reached the trainer."""
    frames = np.zeros((16, 400, 600, 3), np.uint8)
    session.async_reset(False)
    with pytest.raises(EnvStateError, match=RENDER_REFUSED):
        session.render(frames)
    ids = session.recv(16)
    session.send(ids[:3])
    with pytest.raises(EnvStateError, match=RENDER_REFUSED):
        session.render(frames)
    session.recv(3)
    session.render(frames)
    assert frames.any()


def test_async_reset_drops_results_in_flight_and_readies_every_env_in_order():
    pool = NativePool(1)
    session, buffers = make_session(64, pool, "Acrobot-v1")
    try:
        session.async_reset(False)
        session.send(session.recv(64)[::-1].copy())
        session.async_reset(False)
        assert session.counts() == (0, 64)
        assert session.recv(64).tolist() == list(range(64))
    finally:
        session.close()
        pool.close()


def test_recv_count_is_checked(session):
    session.async_reset(False)
    for bad in (0, 17):
        with pytest.raises(InvalidArgumentError, match="1 to 16"):
            session.recv(bad)


def test_results_equal_the_in_process_env():
    """The session steps what envd.make steps (the same vec underneath)."""
    session, buffers = make_session(8, None)
    try:
        with envd.make("CartPole-v1", 8, seed=0, num_threads=0) as env:
            obs, _ = env.reset()
            session.reset(False, False)
            np.testing.assert_array_equal(buffers["observations"], obs)
            rng = np.random.default_rng(1)
            for _ in range(100):
                actions = rng.integers(0, 2, 8)
                buffers["actions"][:] = actions
                num_done = session.step()
                obs, rew, term, trunc, _ = env.step(actions)
                np.testing.assert_array_equal(buffers["observations"], obs)
                assert num_done == int((term | trunc).sum())
    finally:
        session.close()


def test_served_counts_steps_and_async_env_steps(session):
    session.reset(False, False)
    session.step()
    engine_step(session)
    session.async_reset(False)
    ids = session.recv(16)
    session.send(ids[:5])
    session.recv(5)
    assert session.served() == (2, 5)


def test_close_is_idempotent_and_refuses_later_calls(session):
    session.close()
    session.close()
    with pytest.raises(EnvStateError, match="closed"):
        session.step()


def test_lock_is_reentrant_for_its_holder_and_holds_others_off(session):
    session.reset(False, False)
    session.lock()
    try:
        session.step()  # the holder may call the session
        results = []
        other = threading.Thread(target=lambda: results.append(session.try_lock()))
        other.start()
        other.join()
        assert results == [False]
    finally:
        session.unlock()
    assert session.try_lock()
    session.unlock()


def test_the_doorbell_is_held_off_while_the_lock_is_held():
    """A step rung at the doorbell while a caller holds the lock is served
    only after unlock (and served counts it)."""
    session, buffers = make_session(4, None)
    segment = bytearray(4096)
    header = np.frombuffer(segment, np.uint32, 32, lib.ENVD_DOORBELL_OFFSET)
    ids = np.zeros(4, np.int64)
    try:
        session.reset(False, False)
        session.start_doorbell(segment, ids, 0)
        session.lock()
        header[1] = lib.ENVD_DOORBELL_STEP  # req_kind
        header[0] += 1                  # req_seq (the server wakes within its sleep slice)
        time.sleep(0.3)
        assert header[16] == 0          # done_seq: not served while locked
        session.unlock()
        deadline = time.monotonic() + 30
        while header[16] != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert header[16] == 1 and session.served()[0] == 1
        session.stop_doorbell()
        assert header[22] == 1          # closed
        assert session.served() == (1, 0)
        session.stop_doorbell()         # idempotent
        session.step()                  # the session steps directly again
    finally:
        session.close()


# ---- the per-session thread cap (max_threads) ---------------------------------------------
def capped_trajectory(pool: NativePool, max_threads: int | None, env_id: str, steps: int):
    """Outputs of sync steps, then of async sends of random halves, of one
    session under max_threads, every run forced onto the pool (chunk 3);
    and the session's dispatch stats."""
    num_envs = 24
    session, buffers = make_session(num_envs, pool, env_id, max_threads)
    try:
        session.set_chunk(3)
        rng = np.random.default_rng(5)
        n = session.spec.action_space.n
        session.reset(False, False)
        out = [buffers["observations"].tobytes()]
        for _ in range(steps):
            buffers["actions"][...] = rng.integers(0, n, num_envs)
            session.step()
            out += [buffers[k].tobytes() for k in ("observations", "rewards", "terminations")]
        session.async_reset(False)
        session.recv(num_envs)
        for _ in range(steps):
            ids = rng.permutation(num_envs)[:num_envs // 2].astype(np.int64)
            buffers["actions"][ids] = rng.integers(0, n, len(ids))
            session.send(ids[:6])
            session.send(ids[6:])  # two batches in flight under one cap
            got = np.sort(session.recv(len(ids)))
            assert got.tolist() == sorted(ids.tolist())
            out += [buffers[k][got].tobytes() for k in ("observations", "rewards")]
        return out, session.stats()
    finally:
        session.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_results_are_identical_under_every_thread_cap(env_id):
    """Seeds are per env, not per thread: a cap of 0, 1, 2 threads or none on
    a 3-thread pool gives bit-identical outputs, sync and async; cap 0 runs
    every call inline (no pooled job, even with a forced chunk)."""
    pool = NativePool(3)
    try:
        reference, stats = capped_trajectory(pool, None, env_id, 30)
        assert stats["pooled_jobs"] > 0
        for cap in (0, 1, 2, 3):
            out, stats = capped_trajectory(pool, cap, env_id, 30)
            assert out == reference, f"{env_id}: max_threads={cap} changed the results"
            assert (stats["pooled_jobs"] == 0) == (cap == 0), (cap, stats)
    finally:
        pool.close()


@pytest.mark.parametrize("bad", [-1, -5, 1, 257, 1.0])
def test_a_thread_cap_out_of_range_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="max_threads"):
        make_session(4, None, max_threads=bad)


def test_a_thread_cap_is_bounded_by_the_pools_threads():
    """The session checks the cap as make's options do
    (make_options.check_max_threads): at most the threads of its pool."""
    pool = NativePool(2)
    try:
        with pytest.raises(InvalidArgumentError, match=r"pool has 2 threads .*<= 2"):
            make_session(4, pool, max_threads=3)
        session, _ = make_session(4, pool, max_threads=2)
        assert session.max_threads == 2
        session.close()
    finally:
        pool.close()


def engine_step(session: NativeSession) -> int:
    """A step submitted to a request engine and polled until it completes,
    as the daemon's event loop does; the envs whose episode ended."""
    engine = RequestEngine()
    done = engine.step(session.handle, 7)
    deadline = time.monotonic() + 60
    while done is None:
        assert time.monotonic() < deadline, "a submitted step never finished"
        time.sleep(0.001)
        [done] = engine.poll() or [None]
    assert done.tag == 7 and not done.refused
    return session.step_result(done.result)


def submitted_step_pooled(session: NativeSession) -> bool:
    """Submit a step as the daemon's event loop does; whether it went to the pool."""
    before = session.stats()["pooled_jobs"]
    engine_step(session)
    return session.stats()["pooled_jobs"] > before


def test_cap_zero_keeps_costly_runs_off_the_event_loop():
    """Under a cap of 0 a run for an event loop (a step through the engine, send with
    notify) runs inline only when measured cheap (<= 1 ms): one not measured
    yet, or costlier, goes to one pool thread, so that one session cannot
    stall the loop serving the others.  Blocking calls stay inline."""
    pool = NativePool(2)
    try:
        cheap, _ = make_session(16, pool, "CartPole-v1", max_threads=0)
        costly, _ = make_session(4096, pool, "ConnectFour-v0", max_threads=0)  # ~20 us per env
        try:
            for session in (cheap, costly):
                session.reset(False, False)
            assert submitted_step_pooled(cheap)  # not measured yet
            assert not any(submitted_step_pooled(cheap) for _ in range(5))
            for _ in range(3):
                assert submitted_step_pooled(costly)
            costly.step()  # blocking: inline whatever it costs
            assert costly.stats()["cost_ns_per_env"] * 4096 > 1e6
            pooled = costly.stats()["pooled_jobs"]
            costly.step()
            assert costly.stats()["pooled_jobs"] == pooled
        finally:
            cheap.close()
            costly.close()
    finally:
        pool.close()


WHOLE_VEC_CLAIMED = r"while a recv is still being served on these envs"


def test_whole_vec_calls_are_refused_beside_the_loops_waiting_recv():
    """Beside a recv the daemon's loop parked in the request engine (another
    front door's request), reset, async_reset and seed are refused
    (EnvStateError naming that recv, as a step beside it is refused), render
    too (its envs are out); nothing changes, and the recv then completes with
    every env it waited for.  (A pooled batch of 4096 Acrobots is long enough
    that the recv submitted right after its send waits, at least once in 20
    tries, on any machine.)"""
    pool = NativePool(1)
    session, _ = make_session(4096, pool, "Acrobot-v1")
    engine = RequestEngine()
    try:
        session.set_chunk(64)  # every batch on the pool
        session.reset(False, False)
        ids = np.arange(4096, dtype=np.int64)
        out = np.empty(4096, np.int64)
        parked = 0
        for tag in range(1, 21):
            rc, _, done = engine.send(session.handle, ids)
            assert rc == 0 and done is None
            done = engine.recv(session.handle, 4096, 4096, out, tag)
            if done is None:  # it waits: the engine claimed it
                parked += 1
                for call in (lambda: session.reset(False, False),
                             lambda: session.async_reset(False), session.seed):
                    with pytest.raises(EnvStateError, match=WHOLE_VEC_CLAIMED):
                        call()
                with pytest.raises(EnvStateError):
                    session.step()  # (as a step beside it is)
                with pytest.raises(EnvStateError, match=RENDER_REFUSED):
                    session.render(np.zeros(1, np.uint8))  # (refused before its size)
                assert sum(session.counts()) == 4096  # no env dropped or made ready
                while done is None:  # (the batch's NOTIFY event, as the daemon's loop waits)
                    readable, _, _ = select.select([pool.eventfd()], [], [], 60)
                    assert readable, "the waiting recv's batch never ended"
                    os.read(pool.eventfd(), 8)
                    [done] = engine.poll() or [None]
            assert done.tag == tag and done.result == 4096, done
            assert sorted(out.tolist()) == list(range(4096))
            assert session.counts() == (0, 0)
        assert parked
        assert engine.waiting() == 0
        session.seed()  # nothing claimed: every call runs again
        session.async_reset(False)
        assert session.recv(4096).tolist() == list(range(4096))
    finally:
        engine.close()
        session.close()
        pool.close()


def test_an_in_process_reset_beside_a_waiting_recv_gets_the_step_error():
    """In-process, a VecEnv takes one call at a time: a reset (or a step) from
    a second thread while recv() waits in the first is refused with the same
    EnvStateError, and the recv completes."""
    with envd.make("CartPole-v1", 8, seed=3, num_threads=1) as env:
        env.async_reset()
        env.recv()
        env.send(np.zeros(8, np.int64), np.arange(8))
        stepper = env._stepper
        real_recv = stepper.recv
        inside, release = threading.Event(), threading.Event()

        def held_recv(count):  # (the recv waits here: deterministically inside it)
            inside.set()
            assert release.wait(60)
            return real_recv(count)

        stepper.recv = held_recv
        result: list = []
        waiter = threading.Thread(target=lambda: result.append(env.recv()))
        waiter.start()
        try:
            assert inside.wait(60)
            errors = []
            for call in (env.reset, lambda: env.step(np.zeros(8, np.int64))):
                with pytest.raises(EnvStateError) as refused:
                    call()
                errors.append(str(refused.value))
            assert errors[0] == errors[1] and "used by another thread" in errors[0]
        finally:
            release.set()
            waiter.join(60)
        assert result and sorted(result[0][4]["env_id"].tolist()) == list(range(8))
