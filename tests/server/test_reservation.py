"""A make's limit accounting (server/reservation.py): every check in one
place, a reservation released exactly once, bytes in use given back once."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd.errors import LimitExceededError
from envd.native._envd_native import lib
from envd.native.registry import get_spec
from envd.server.config import Config
from envd.server.hosted import HostedEnvSpec, hosted_state_plan
from envd.server.reservation import ResourceBooks
from envd.server.sessions import ClientRecord, segment_plan, state_plan

SPEC = get_spec("CartPole-v1")
MODE = AutoresetMode.NEXT_STEP


def config(**limits) -> Config:
    return Config(bind=("ipc:///nonexistent/envd.sock",), threads=1, **limits)


class FakeSession:
    def __init__(self, num_envs: int):
        self.segment_bytes = segment_plan(SPEC, num_envs, MODE)[1]
        self.state_bytes = state_plan(SPEC, num_envs)


def test_a_reservation_counts_until_released_and_only_once():
    books, client = ResourceBooks(config()), ClientRecord(b"a")
    reservation = books.reserve(client, SPEC, 16, MODE, open_sessions=0)
    assert books.reserved_sessions == 1 and client.reserved_envs == 16
    assert books.shm_bytes == segment_plan(SPEC, 16, MODE)[1]
    assert books.state_bytes == state_plan(SPEC, 16)
    reservation.release()
    assert books.shm_bytes == books.state_bytes == books.reserved_sessions == 0
    assert client.reserved_envs == client.reserved_sessions == 0
    with pytest.raises(RuntimeError, match="twice"):
        reservation.release()
    assert books.reserved_sessions == 0 and client.reserved_envs == 0


def test_leaving_the_block_by_an_exception_releases_and_claim_holds_the_bytes():
    books, client = ResourceBooks(config()), ClientRecord(b"a")
    with pytest.raises(ValueError):
        with books.reserve(client, SPEC, 16, MODE, open_sessions=0):
            raise ValueError("the make failed")
    assert books.shm_bytes == 0 and books.reserved_sessions == 0
    session = FakeSession(16)
    with books.reserve(client, SPEC, 16, MODE, open_sessions=0) as reservation:
        reservation.claim(session)
    assert books.reserved_shm == books.reserved_state == books.reserved_sessions == 0
    assert books.shm_in_use == session.segment_bytes and books.state_in_use == session.state_bytes
    books.give_back(session)
    books.give_back(session)  # once only
    assert books.shm_in_use == books.state_in_use == 0
    books.give_back(FakeSession(4))  # never claimed: nothing to give back
    assert books.shm_in_use == 0


@pytest.mark.parametrize("limits, open_sessions, flag", [
    ({"max_sessions": 2}, 2, "--max-sessions"),
    ({"max_sessions_per_client": 1}, 0, "--max-sessions-per-client"),
    ({"max_envs_per_client": 20}, 0, "--max-envs-per-client"),
    ({"max_shm_bytes": 1 << 12}, 0, "--max-shm-bytes"),
    ({"max_state_bytes": 1 << 10}, 0, "--max-state-bytes"),
])
def test_each_limit_refuses_by_name_and_reserves_nothing(limits, open_sessions, flag):
    books, client = ResourceBooks(config(**limits)), ClientRecord(b"a")
    held = books.reserve(client, SPEC, 8, MODE, open_sessions=0) if flag in (
        "--max-sessions-per-client", "--max-envs-per-client") else None
    before = (books.reserved_sessions, books.shm_bytes, books.state_bytes,
              client.reserved_sessions, client.reserved_envs)
    with pytest.raises(LimitExceededError, match=flag):
        books.reserve(client, SPEC, 16, MODE, open_sessions=open_sessions)
    assert before == (books.reserved_sessions, books.shm_bytes, books.state_bytes,
                      client.reserved_sessions, client.reserved_envs)
    if held is not None:
        held.release()


def test_the_fd_check_sees_the_makes_in_flight_and_can_refuse():
    books, client = ResourceBooks(config()), ClientRecord(b"a")
    seen: list[int] = []
    books.reserve(client, SPEC, 2, MODE, 0, fd_check=lambda makes, *_: seen.append(makes))
    books.reserve(client, SPEC, 2, MODE, 0, fd_check=lambda makes, *_: seen.append(makes))
    assert seen == [0, 1]

    def refuse(in_flight: int, *_: int) -> None:
        raise LimitExceededError("no fd left")

    with pytest.raises(LimitExceededError, match="no fd left"):
        books.reserve(client, SPEC, 2, MODE, 0, fd_check=refuse)
    assert books.reserved_sessions == 2


def test_a_hosted_make_over_the_state_limit_is_refused_by_name():
    """A hosted spec has no native definition (no state_size): the refusal
    names the limit all the same (it raised AttributeError before)."""
    spec = HostedEnvSpec("py:CartPole-v1", "CartPole-v1", spaces.Box(-1, 1, (4,), np.float32),
                         spaces.Discrete(2), 500, step_seconds=1e-5)
    needs = hosted_state_plan(spec, 64, 2, MODE, 0)
    books, client = ResourceBooks(config(max_state_bytes=needs - 1)), ClientRecord(b"a")
    with pytest.raises(LimitExceededError, match="--max-state-bytes") as refused:
        books.reserve(client, spec, 64, MODE, open_sessions=0, num_workers=2)
    assert f"needs {needs} bytes" in str(refused.value) and "private segment" in str(refused.value)
    assert books.reserved_state == books.reserved_workers == client.reserved_envs == 0
    books = ResourceBooks(config(max_state_bytes=needs))
    books.reserve(client, spec, 64, MODE, open_sessions=0, num_workers=2).release()  # it fits


def test_a_hosted_multi_agent_make_counts_its_agents_books_and_checks():
    """Review finding L2: --max-state-bytes counts a hosted PettingZoo
    session's backend (backend_workers.c) too: per env its slot and its A
    agents' books (envd_agent_books_t: a double, an int64 and three bools,
    24 bytes), per agent its action row's checks (envd_action_check_t: three
    int64 and two int32, 32 bytes; a MultiDiscrete of 6 elements: 6 checks
    an agent).  A limit of what the segment and the session's books alone
    need (the old count) refuses the make; the full count fits."""
    from envd.server.hosted import private_plan

    agents, n, workers = 64, 512, 2
    spec = HostedEnvSpec("pz:wide", "", spaces.Box(-1, 1, (2,), np.float32),
                         spaces.MultiDiscrete([3] * 6), None, step_seconds=1e-5,
                         creator=b"", num_agents=agents,
                         agent_names=tuple(f"a{k}" for k in range(agents)))
    needs = hosted_state_plan(spec, n, workers, MODE, 0)
    old = (private_plan(spec, n, workers, MODE, 0)[1]
           + int(lib.envd_session_books_max_bytes(n)))
    assert needs - old >= n * agents * 24 + agents * 6 * 32
    for limit in (old, needs - 1):
        books, client = ResourceBooks(config(max_state_bytes=limit)), ClientRecord(b"a")
        with pytest.raises(LimitExceededError, match="--max-state-bytes"):
            books.reserve(client, spec, n, MODE, open_sessions=0, num_workers=workers)
        assert books.reserved_state == client.reserved_envs == 0
    books = ResourceBooks(config(max_state_bytes=needs))
    books.reserve(client, spec, n, MODE, open_sessions=0, num_workers=workers).release()
