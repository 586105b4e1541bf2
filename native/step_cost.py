"""The cost of one step of a Python env, measured once when it is described
(native/hosted_template.py), for the default worker count
(``default_num_workers`` in native/hosted_env.py).

The steps are timed in blocks, and the cost is the lowest block's mean:

- a block's mean keeps what a step really costs on average, resets (an
  episode's end, timed with its step) and an env's occasional costly steps
  included;
- the lowest block leaves out the time the process was not running: on a
  loaded machine a preemption of a few milliseconds lands in one block and
  would otherwise add a hundred microseconds to every step of the mean,
  enough to give workers to an env that is cheaper stepped in the caller;
- the actions are drawn before the clock starts (drawing one costs several
  microseconds, a good part of a cheap env's step).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Steps per block, blocks, and the time budget of the whole measurement.
BLOCK_STEPS = 16
BLOCKS = 4
BUDGET_SECONDS = 0.05


def measure_step_seconds(env: Any, *, block_steps: int = BLOCK_STEPS, blocks: int = BLOCKS,
                         budget: float = BUDGET_SECONDS,
                         clock: Callable[[], float] = time.perf_counter,
                         infos: list | None = None) -> float:
    """Seconds one env.step costs: the lowest mean over `blocks` blocks of
    `block_steps` steps.  A slow env stops at `budget` seconds: the blocks
    completed by then count, or, when none is, the steps so far (at least
    one).  env has been reset; it is reset again when an episode ends.
    infos: a list the steps' infos are appended to."""
    space = env.action_space
    actions = [space.sample() for _ in range(block_steps * blocks)]
    means: list[float] = []
    deadline = clock() + budget
    for b in range(blocks):
        steps, start = 0, clock()
        for action in actions[b * block_steps:(b + 1) * block_steps]:
            _, _, term, trunc, info = env.step(action)
            steps += 1
            if infos is not None:
                infos.append(info)
            if term or trunc:
                env.reset()
            if clock() > deadline:
                break
        now = clock()
        if steps == block_steps or not means:  # a partial block only when it is all there is
            means.append((now - start) / steps)
        if now > deadline:
            break
    return min(means)
