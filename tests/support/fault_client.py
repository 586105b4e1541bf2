"""Client processes for tests/integration/test_faults.py.

- ``trainer``: one trainer process, forked from a forkserver that imported
  envd once (a process importing envd costs about half a second of CPU; a
  hundred trainers each paying it would take the test well over a minute on
  a loaded 2-core machine).  Each trainer connects on its own, makes 1-2 envs
  of random built-in ids, sync or async, and steps them until it is SIGKILLed.
- ``python tests/support/fault_client.py frozen ENDPOINT``: the client of the SIGSTOP test;
  it makes envs, says "ready", waits for "go" on stdin, and prints as JSON
  what its next calls raised.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

if __name__ == "__main__":  # run as a script: tests/ on sys.path, for `support`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import envd
from support.daemon import in_bounds_actions

#: Phases a trainer reports in its slot of the progress array.
STARTED, CONNECTED, MADE, STEPPING, FAILED = 1, 2, 3, 4, -1
#: Env ids whose observations are large: fewer envs per session.
_BIG_OBSERVATIONS = {"Snake-v0", "ConnectFour-v0"}


def noop() -> None:
    """Started once to have the forkserver running before the clock starts."""


def trainer(endpoint: str, index: int, seed: int, env_ids: list[str], progress, log_path: str) -> None:
    """progress[2 * index] is the phase, progress[2 * index + 1] the steps done."""
    try:
        rng = np.random.default_rng(seed)
        progress[2 * index] = STARTED
        client = envd.connect(endpoint, timeout=60)
        progress[2 * index] = CONNECTED
        envs = []
        for _ in range(int(rng.integers(1, 3))):
            env_id = env_ids[int(rng.integers(len(env_ids)))]
            sizes = [1, 7, 32, 128] if env_id in _BIG_OBSERVATIONS else [1, 7, 32, 256, 2048]
            num_envs = int(rng.choice(sizes))
            batch_size = (int(rng.integers(1, num_envs))
                          if num_envs > 1 and rng.random() < 0.5 else None)
            envs.append(client.make(env_id, num_envs, seed=int(rng.integers(2**31)),
                                    batch_size=batch_size,
                                    autoreset_mode=("next_step", "same_step")[int(rng.integers(2))]))
        progress[2 * index] = MADE
        for env in envs:
            # (batch_size counts envs; num_envs rows, num_agents per env)
            if env.batch_size < env.num_env_instances:
                env.async_reset()
            else:
                env.reset()
        progress[2 * index] = STEPPING
        steps = 0
        while True:
            for env in envs:
                if env.batch_size < env.num_env_instances:
                    ids = env.recv()[4]["env_id"]
                    env.send(in_bounds_actions(env.single_action_space, len(ids), rng), ids)
                else:
                    env.step(in_bounds_actions(env.single_action_space, env.num_envs, rng))
            steps += 1
            progress[2 * index + 1] = steps
            time.sleep(float(rng.uniform(0, 0.004)))  # the trainer's own work: the CPU is shared
    except BaseException:  # noqa: BLE001 -- the test reads the file and fails
        with open(log_path, "w") as log:
            log.write(traceback.format_exc())
        progress[2 * index] = FAILED
        os._exit(1)


def frozen(endpoint: str) -> None:
    """Make a sync and an async env, step, say "ready"; after "go" (the test
    has SIGSTOPped and SIGCONTed this process meanwhile) try both envs, then
    make a new env, idle for three leases and step it; print what happened."""
    result: dict[str, object] = {"pid": os.getpid()}
    client = envd.connect(endpoint, timeout=30)
    sync_env = client.make("CartPole-v1", 8, seed=1)
    async_env = client.make("Acrobot-v1", 64, seed=2, batch_size=16)
    sync_env.reset()
    sync_env.step(np.zeros(8, np.int64))
    async_env.async_reset()
    # Receive every env (so the next recv must ask the daemon) and send them
    # all back: batches in flight while frozen.
    ids = np.concatenate([async_env.recv()[4]["env_id"].copy() for _ in range(4)])
    assert sorted(ids.tolist()) == list(range(64))
    async_env.send(np.zeros(len(ids), np.int64), ids)
    result["sessions"] = [sync_env.session, async_env.session]
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"

    def attempt(name, call):
        try:
            call()
            result[name] = {"error": None}
        except Exception as exc:  # noqa: BLE001 -- reported to the test
            result[name] = {"error": type(exc).__name__, "message": str(exc),
                            "is_session_expired": isinstance(exc, envd.SessionExpiredError)}

    attempt("step", lambda: sync_env.step(np.zeros(8, np.int64)))
    attempt("recv", async_env.recv)
    attempt("step_again", lambda: sync_env.step(np.zeros(8, np.int64)))
    # A new env after the expiry, checked against an in-process twin, also
    # after idling three leases (the heartbeat must keep the new lease alive).
    lease = float(client.server_info["lease_timeout"])
    with envd.make("Pendulum-v1", 4, seed=9) as local:
        again = client.make("Pendulum-v1", 4, seed=9)
        same = again.reset()[0].tobytes() == local.reset()[0].tobytes()
        rng = np.random.default_rng(0)
        for step in range(20):
            if step == 10:
                time.sleep(3 * lease)
            actions = rng.uniform(-2, 2, (4, 1)).astype(np.float32)
            got, want = again.step(actions), local.step(actions)
            same = same and all(a.tobytes() == b.tobytes() for a, b in zip(got[:4], want[:4]))
    result["new_env_same_as_twin"] = same
    result["status_sessions"] = client.status()["sessions"]
    again.close()
    client.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "frozen":
        frozen(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
