"""Where an in-process async batch spends the trainer's CPU (issue 20).

Runs EnvPool's loop (recv B envs, send their actions straight back, a short
sleep standing in for a GPU-bound learner) and charges the calling thread's
CPU time (time.thread_time, so other processes' load does not count) to each
phase of BatchedVecEnv.recv and .send:

- stepper_recv: the native session's recv (books, waiting; the calling
  thread also runs chunks of the batch it waits for);
- gather: copying the B envs' rows into recv's batch buffers, and the info;
- check_ids: send's env-id checks (dtype, range, repeats);
- action_rows: writing the actions into the env's rows;
- stepper_send: the native session's send (books, the vec's checks, the
  pool submit and its wake-ups).

It calls BatchedVecEnv's internals (the phases have no public names), so it
measures this checkout's install (or another of the same layout):

    python bench/async_batch_costs.py [--env CartPole-v1] [--num-envs 4096]
        [--batches 3000] [--learner-us 50]

Figures are microseconds of the trainer thread's CPU per batch.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import envd


def measure(env_id: str, num_envs: int, batches: int, learner_s: float) -> dict[str, float]:
    batch = num_envs // 2
    env = envd.make(env_id, num_envs, seed=0, batch_size=batch)
    try:
        space = env.single_action_space
        actions = np.zeros((batch, *space.shape), space.dtype)
        env.async_reset()
        stepper, clock = env._stepper, time.thread_time
        costs = dict.fromkeys(("stepper_recv", "gather", "check_ids", "action_rows",
                               "stepper_send"), 0.0)
        warm_up = 200
        for k in range(warm_up + batches):
            if k == warm_up:
                costs = dict.fromkeys(costs, 0.0)
            t0 = clock()
            ids = stepper.recv(batch)
            t1 = clock()
            env_ids = env._gather(ids)[4]["env_id"]
            t2 = clock()
            checked = env._check_env_ids(env_ids)
            t3 = clock()
            env._actions[checked] = actions
            t4 = clock()
            stepper.send(checked)
            t5 = clock()
            for name, spent in zip(costs, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                costs[name] += spent
            time.sleep(learner_s)
        env.recv()
        env.recv()
    finally:
        env.close()
    return {name: spent / batches * 1e6 for name, spent in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--learner-us", type=float, default=50.0)
    args = parser.parse_args()
    costs = measure(args.env, args.num_envs, args.batches, args.learner_us * 1e-6)
    total = sum(costs.values())
    print(f"{args.env}, N={args.num_envs}, batch {args.num_envs // 2}: trainer-thread CPU "
          f"per batch {total:.1f} us = " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()))


if __name__ == "__main__":
    main()
