"""Snake-v0 (native/src/envs/snake.c) against an independent Python reference.

The reference below is written from the spec alone (the comment at the top of
snake.c): a 12 x 12 grid drawn at 7 x 7 pixels per cell into an (84, 84)
uint8 image (empty 0, food 64, body 128, head 255); actions 0 up, 1 right,
2 down, 3 left, the reversing action ignored; reset to a length-3 snake with
its head at (6, 6) heading right; food on the int(random() * k)-th of the k
free cells in row-major order, drawn from np.random.default_rng(seed + i);
death (wall, or a snake cell other than the tail) gives -1, terminated, and
leaves the image as it was before the fatal move; eating gives +1 and grows
the snake; filling the grid terminates with +1 (a win).

The vectorised env (envd.make) is checked step by step against reference
envs driven the way envd drives its envs: the time limit truncates after
max_episode_steps steps of an episode, and with autoreset_mode "next_step"
the step after a done resets the env (drawing from the same generator),
ignores the action and reports reward 0, not terminated, not truncated.
"""
from __future__ import annotations

import ctypes
import itertools

import cbuild
import numpy as np
import pytest

import envd

G = 12          # grid cells per side
PX = 7          # pixels per cell
MOVES = [(-1, 0), (0, 1), (1, 0), (0, -1)]  # up, right, down, left
EMPTY, FOOD, BODY, HEAD = 0, 64, 128, 255
EINVAL, ESTATE = cbuild.ERROR_CODES["ENVD_EINVAL"], cbuild.ERROR_CODES["ENVD_ESTATE"]


class RefSnake:
    """One Snake-v0 from the spec; rng is the env's numpy Generator."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.body: list[tuple[int, int]] = []  # head first
        self.heading = 1
        self.food: tuple[int, int] | None = None
        self.last_death = None  # "wall" or "self" after a fatal step

    def _place_food(self) -> None:
        occupied = set(self.body)
        free = [(r, c) for r in range(G) for c in range(G) if (r, c) not in occupied]
        self.food = None
        if free:
            self.food = free[int(self.rng.random() * len(free))]

    def render(self) -> np.ndarray:
        cells = np.zeros((G, G), np.uint8)
        if self.food is not None:
            cells[self.food] = FOOD
        for rc in self.body[1:]:
            cells[rc] = BODY
        cells[self.body[0]] = HEAD
        return np.repeat(np.repeat(cells, PX, axis=0), PX, axis=1)

    def reset(self) -> np.ndarray:
        self.body = [(6, 6), (6, 5), (6, 4)]
        self.heading = 1
        self._place_food()
        self.obs = self.render()
        return self.obs

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        if (action + 2) % 4 != self.heading:  # not a reversal onto the neck
            self.heading = action
        dr, dc = MOVES[self.heading]
        head = (self.body[0][0] + dr, self.body[0][1] + dc)
        grows = head == self.food
        if not (0 <= head[0] < G and 0 <= head[1] < G):
            self.last_death = "wall"
            return self.obs, -1.0, True  # the image before the fatal move
        blocking = self.body if grows else self.body[:-1]  # the tail moves away
        if head in blocking:
            self.last_death = "self"
            return self.obs, -1.0, True
        self.last_death = None
        self.body.insert(0, head)
        if not grows:
            self.body.pop()
            reward, terminated = 0.0, False
        else:
            self._place_food()
            reward, terminated = 1.0, self.food is None  # no free cell: a win
        self.obs = self.render()
        return self.obs, reward, terminated


class RefVec:
    """Reference envs driven as envd's vec drives them (next_step autoreset)."""

    def __init__(self, seed: int, num_envs: int, max_episode_steps: int):
        self.envs = [RefSnake(np.random.default_rng(seed + i)) for i in range(num_envs)]
        self.limit = max_episode_steps
        self.elapsed = [0] * num_envs
        self.needs_reset = [False] * num_envs
        self.stats = {"wall": 0, "self": 0, "food": 0, "truncated": 0, "autoreset": 0}

    def reset(self) -> np.ndarray:
        self.elapsed = [0] * len(self.envs)
        self.needs_reset = [False] * len(self.envs)
        return np.stack([e.reset() for e in self.envs])

    def step(self, actions):
        n = len(self.envs)
        obs = np.empty((n, G * PX, G * PX), np.uint8)
        rewards = np.zeros(n, np.float32)
        terms, truncs = np.zeros(n, bool), np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            if self.needs_reset[i]:
                obs[i] = env.reset()
                self.elapsed[i] = 0
                self.needs_reset[i] = False
                self.stats["autoreset"] += 1
                continue
            obs[i], rewards[i], terms[i] = env.step(int(actions[i]))
            self.elapsed[i] += 1
            truncs[i] = self.limit > 0 and self.elapsed[i] >= self.limit
            self.needs_reset[i] = terms[i] or truncs[i]
            if env.last_death:
                self.stats[env.last_death] += 1
            self.stats["food"] += rewards[i] > 0
            self.stats["truncated"] += truncs[i]
        return obs, rewards, terms, truncs


def policy(ref: RefVec, rng: np.random.Generator, greed: float) -> np.ndarray:
    """Mostly head for the food (so snakes grow long enough to bite
    themselves), otherwise any of the four actions (reversals included)."""
    actions = rng.integers(0, 4, size=len(ref.envs))
    for i, env in enumerate(ref.envs):
        if env.food is not None and rng.random() < greed:
            (hr, hc), (fr, fc) = env.body[0], env.food
            options = [a for a, ok in ((0, fr < hr), (1, fc > hc), (2, fr > hr), (3, fc < hc)) if ok]
            if options:
                actions[i] = options[rng.integers(len(options))]
    return actions.astype(np.int64)


def assert_same(got, want, ctx):
    obs, rewards, terms, truncs = got[:4]
    w_obs, w_rewards, w_terms, w_truncs = want
    assert obs.dtype == np.uint8 and obs.shape == w_obs.shape, ctx
    if obs.tobytes() != w_obs.tobytes():
        bad = np.nonzero((obs != w_obs).reshape(len(obs), -1).any(axis=1))[0]
        raise AssertionError(f"{ctx}: observations differ for envs {bad.tolist()}")
    np.testing.assert_array_equal(rewards, w_rewards, err_msg=str(ctx))
    np.testing.assert_array_equal(terms, w_terms, err_msg=str(ctx))
    np.testing.assert_array_equal(truncs, w_truncs, err_msg=str(ctx))


def run_against_reference(seed, num_envs, steps, greed, max_episode_steps=None,
                          num_threads=0):
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = envd.make("Snake-v0", num_envs=num_envs, seed=seed, num_threads=num_threads, **kwargs)
    ref = RefVec(seed, num_envs, 1000 if max_episode_steps is None else max_episode_steps)
    act_rng = np.random.default_rng(1_000 + seed)
    try:
        obs, _ = env.reset()
        w_obs = ref.reset()
        assert obs.tobytes() == w_obs.tobytes(), (seed, "reset")
        for t in range(steps):
            actions = policy(ref, act_rng, greed)
            got = env.step(actions)
            assert_same(got, ref.step(actions), (seed, t))
    finally:
        env.close()
    return ref.stats


def test_spaces_and_reset():
    env = envd.make("Snake-v0", num_envs=2, seed=0, num_threads=0)
    try:
        space = env.single_observation_space
        assert space.shape == (84, 84) and space.dtype == np.uint8
        assert (space.low == 0).all() and (space.high == 255).all()
        assert env.single_action_space.n == 4
        assert envd.native.get_spec("Snake-v0").max_episode_steps == 1000
        obs, _ = env.reset()
        cells = obs[0, ::PX, ::PX]
        assert cells[6, 6] == HEAD and cells[6, 5] == BODY and cells[6, 4] == BODY
        assert (cells == FOOD).sum() == 1 and (cells == EMPTY).sum() == G * G - 4
        # whole cells are filled
        assert (np.repeat(np.repeat(cells, PX, 0), PX, 1) == obs[0]).all()
    finally:
        env.close()


@pytest.mark.parametrize("seed,greed", [(0, 0.9), (7, 0.6), (12345, 0.97)])
def test_matches_reference(seed, greed):
    stats = run_against_reference(seed, num_envs=16, steps=1500, greed=greed)
    assert stats["wall"] > 0 and stats["food"] > 0 and stats["autoreset"] > 0, stats
    assert stats["self"] > 0, stats


def test_matches_reference_with_truncation():
    stats = run_against_reference(3, num_envs=8, steps=400, greed=0.9, max_episode_steps=40)
    assert stats["truncated"] > 0 and stats["autoreset"] > 0, stats


def test_matches_reference_default_time_limit():
    # A snake circling a 2 x 2 block never dies (unless food lands in the
    # block twice): the default limit (1000 steps) truncates it.
    n = 4
    env = envd.make("Snake-v0", num_envs=n, seed=5, num_threads=0)
    ref = RefVec(5, n, 1000)
    try:
        assert env.reset()[0].tobytes() == ref.reset().tobytes()
        circle = [2, 3, 0, 1]  # down, left, up, right
        for t in range(1001):
            actions = np.full(n, circle[t % 4], np.int64)
            want = ref.step(actions)
            assert_same(env.step(actions), want, t)
            if t < 999:
                assert not want[2].any() and not want[3].any(), t
        assert want[1].tolist() == [0.0] * n and not want[2].any()  # the autoreset step
        assert ref.stats["truncated"] == n and ref.stats["autoreset"] == n
    finally:
        env.close()


def test_thread_count_independent():
    results = []
    for num_threads in (0, 2):
        env = envd.make("Snake-v0", num_envs=64, seed=99, num_threads=num_threads,
                        max_episode_steps=100)
        if num_threads:
            env.set_chunk_size(8)  # force the pool even for this small batch
        act_rng = np.random.default_rng(4)
        try:
            out = [env.reset()[0].copy()]
            for _ in range(300):
                obs, rew, term, trunc, _ = env.step(act_rng.integers(0, 4, 64))
                out += [obs.copy(), rew.copy(), term.copy(), trunc.copy()]
        finally:
            env.close()
        results.append(out)
    for a, b in zip(*results):
        assert a.tobytes() == b.tobytes()


# ---- edge cases, one instance driven directly ---------------------------------------
@pytest.fixture(scope="module")
def lib():
    return cbuild.load(["rng.c", "raster.c", "envs/snake.c"])


def pair(lib, seed):
    env = cbuild.SingleEnv(lib, "envd_builtin_snake")
    ref = RefSnake(np.random.default_rng(seed))
    obs = env.reset(seed)
    assert obs.tobytes() == ref.reset().tobytes()
    return env, ref


def check_step(env, ref, action, ctx=None):
    obs, reward, term, trunc = env.step(action)
    w_obs, w_reward, w_term = ref.step(action)
    assert obs.tobytes() == w_obs.tobytes(), ctx
    assert (reward, term, trunc) == (w_reward, w_term, False), ctx
    return obs, reward, term


def head_of(obs):
    return tuple(int(v) for v in np.argwhere(obs[::PX, ::PX] == HEAD)[0])


def test_refused_calls(lib):
    env = cbuild.SingleEnv(lib, "envd_builtin_snake")
    reward = ctypes.c_double()
    term, trunc = ctypes.c_bool(), ctypes.c_bool()

    def raw_step(action):
        env.action[...] = action
        return env.define.step(env._state, ctypes.byref(env.rng), env.action.ctypes.data,
                               env.obs.ctypes.data, ctypes.byref(reward),
                               ctypes.byref(term), ctypes.byref(trunc))
    assert raw_step(1) == ESTATE  # before the first reset
    env.reset(0)
    assert raw_step(4) == EINVAL and raw_step(-1) == EINVAL
    assert raw_step(1) == 0


def test_reversal_is_ignored(lib):
    env, ref = pair(lib, 0)
    obs, _, _ = check_step(env, ref, 3)  # left, while heading right
    assert head_of(obs) == (6, 7)
    obs, _, _ = check_step(env, ref, 2)  # down
    assert head_of(obs) == (7, 7)
    obs, _, _ = check_step(env, ref, 0)  # up, while heading down: ignored
    assert head_of(obs) == (8, 7)


def test_death_by_wall_keeps_the_last_image(lib):
    env, ref = pair(lib, 1)
    for t in range(20):
        before = env.obs.copy()
        obs, reward, term = check_step(env, ref, 0, t)  # straight up
        if term:
            break
    assert term and reward == -1.0 and ref.last_death == "wall"
    assert head_of(obs) == (0, 6) and obs.tobytes() == before.tobytes()
    # A step after the end (the host resets first) changes nothing.
    obs2, reward, term, trunc = env.step(1)
    assert (reward, term, trunc) == (0.0, True, False) and obs2.tobytes() == obs.tobytes()


def greedy_to_food(env, ref, ctx):
    """Step both toward the food until the snake eats (it must not die)."""
    length = len(ref.body)
    for t in range(200):
        (hr, hc), (fr, fc) = ref.body[0], ref.food
        moves = [a for a, ok in ((0, fr < hr), (1, fc > hc), (2, fr > hr), (3, fc < hc)) if ok]
        moves = [a for a in moves if (a + 2) % 4 != ref.heading] or [(ref.heading + 1) % 4]
        _, _, term = check_step(env, ref, moves[0], (ctx, t))
        assert not term, ctx
        if len(ref.body) > length:
            return
    raise AssertionError(f"{ctx}: never reached the food")


def test_moving_into_the_tail_cell(lib):
    # Grow to length 4, then circle a 2 x 2 block: from the third turn on, the
    # head enters the cell the tail leaves on that same step.
    for seed in range(50):
        env, ref = pair(lib, seed)
        greedy_to_food(env, ref, seed)
        # Three straight moves lay the 4-cell snake out in a line (when they fit).
        (hr, hc), d = ref.body[0], ref.heading
        dr, dc = MOVES[d]
        end = (hr + 4 * dr, hc + 4 * dc)
        turn = (d + 1) % 4  # turn right, circling clockwise
        tr, tc = MOVES[turn]
        if not (0 <= end[0] < G and 0 <= end[1] < G and 0 <= end[0] + tr < G
                and 0 <= end[1] + tc < G):
            continue
        moves = [d] * 3 + [(turn + k) % 4 for k in range(8)]
        ok = True
        for k, a in enumerate(moves):
            tail = ref.body[-1]
            _, reward, term = check_step(env, ref, a, (seed, k))
            if reward != 0.0 or term:  # ate the food on the way: try another seed
                ok = False
                break
            if k >= 5:  # the loop is closed: the head took the old tail's cell
                assert ref.body[0] == tail and head_of(env.obs) == tail
        if ok:
            return
    pytest.fail("no seed gave a clean 2 x 2 loop")


def hamiltonian_next():
    """Successor of each cell on a Hamiltonian cycle through the grid that
    passes (6, 4) -> (6, 5) -> (6, 6): even rows run right over columns
    1..11, odd rows left, column 0 carries the way back up."""
    nxt = {}
    for r in range(G):
        cols = range(1, G) if r % 2 == 0 else range(G - 1, 0, -1)
        cols = list(cols)
        for a, b in itertools.pairwise(cols):
            nxt[(r, a)] = (r, b)
        if r + 1 < G:
            nxt[(r, cols[-1])] = (r + 1, cols[-1])
    nxt[(G - 1, 1)] = (G - 1, 0)
    for r in range(G - 1, 0, -1):
        nxt[(r, 0)] = (r - 1, 0)
    nxt[(0, 0)] = (0, 1)
    assert len(nxt) == G * G and len(set(nxt.values())) == G * G
    return nxt


def test_win_by_filling_the_grid(lib):
    # Following a Hamiltonian cycle never hits the body, so the snake eats
    # every food and finally fills all 144 cells: terminated with +1.
    nxt = hamiltonian_next()
    env, ref = pair(lib, 2024)
    eaten = 0
    for t in range(G * G * G * G):
        (hr, hc), (nr, nc) = ref.body[0], nxt[ref.body[0]]
        action = MOVES.index((nr - hr, nc - hc))
        obs, reward, term = check_step(env, ref, action, t)
        eaten += reward == 1.0
        if term:
            break
    assert term and reward == 1.0 and eaten == G * G - 3
    assert ref.food is None and len(ref.body) == G * G
    cells = obs[::PX, ::PX]
    assert (cells == HEAD).sum() == 1 and (cells == BODY).sum() == G * G - 1
