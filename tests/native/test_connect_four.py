"""ConnectFour-v0 (native/src/envs/connect_four.c) against independent references.

- The rules: PettingZoo's connect_four_v3 (with its TerminateIllegalWrapper),
  replaying the agent's moves as player_0 and the built-in opponent's moves
  (read from our observation) as player_1.  pettingzoo is a test
  dependency; pygame, which it imports for rendering, is not needed.
- The opponent: a plain Python negamax of the value function documented at the
  top of connect_four.c (no pruning, no shortcuts), and numpy's
  default_rng(seed) for the tie-break (envd's RNG reproduces it bit for bit):
  the opponent draws random() once per move and picks
  ties[floor(random() * len(ties))], ties in increasing column order.

One C instance is driven directly with cbuild.SingleEnv; the vectorised env
through envd.make.
"""
from __future__ import annotations

import importlib
import sys
import types

import cbuild
import numpy as np
import pytest

import envd
from envd.errors import InvalidArgumentError

ROWS, COLS = 6, 7
WIN = 1000
SYMBOL = "envd_builtin_connect_four"
ENV_ID = "ConnectFour-v0"
# connect_four_v3's own module (importing connect_four_v3 warns that it is deprecated)
PZ_MODULE = "pettingzoo.classic.connect_four.connect_four"


@pytest.fixture(scope="module")
def lib():
    return cbuild.load(["rng.c", "raster.c", "envs/connect_four.c"])


def make_single(lib, depth=None):
    return cbuild.SingleEnv(lib, SYMBOL, None if depth is None else {"depth": depth})


# ---- the Python reference: board and negamax ------------------------------------------
# A board is a list of 7 columns, each the list of its pieces from the bottom
# (1 = the agent, 2 = the opponent).
def board_from_obs(obs: np.ndarray) -> list[list[int]]:
    """Columns from an observation: PettingZoo's layout, row 0 = the top row."""
    assert obs.shape == (ROWS, COLS, 2) and obs.dtype == np.uint8
    assert not np.any(obs[:, :, 0] & obs[:, :, 1])
    cols = []
    for c in range(COLS):
        col = []
        for r in range(ROWS - 1, -1, -1):
            piece = 1 if obs[r, c, 0] else 2 if obs[r, c, 1] else 0
            if piece == 0:
                break
            col.append(piece)
        assert not obs[:ROWS - len(col), c].any(), "a floating piece"
        cols.append(col)
    return cols


def cell(cols, c, r):
    return cols[c][r] if 0 <= c < COLS and 0 <= r < len(cols[c]) else 0


def last_move_wins(cols, c) -> bool:
    """Does the top piece of column c make four in a row?"""
    r = len(cols[c]) - 1
    p = cols[c][r]
    for dc, dr in ((1, 0), (0, 1), (1, 1), (1, -1)):
        n = 1
        for sign in (1, -1):
            k = 1
            while cell(cols, c + sign * k * dc, r + sign * k * dr) == p:
                n += 1
                k += 1
        if n >= 4:
            return True
    return False


def legal_columns(cols) -> list[int]:
    return [c for c in range(COLS) if len(cols[c]) < ROWS]


def value(cols, player: int, d: int, prev_won: bool) -> int:
    """The value of the position for `player` (to move), d plies left, as the
    header of connect_four.c defines it."""
    if prev_won:
        return -(WIN + d)
    if all(len(col) == ROWS for col in cols):
        return 0
    if d == 0:
        return 0
    best = None
    for c in legal_columns(cols):
        cols[c].append(player)
        v = -value(cols, 3 - player, d - 1, last_move_wins(cols, c))
        cols[c].pop()
        best = v if best is None else max(best, v)
    return best


def root_scores(cols, depth: int) -> dict[int, int]:
    """The opponent's (player 2's) score of each legal column."""
    scores = {}
    for c in legal_columns(cols):
        if depth == 0:
            scores[c] = 0
        else:
            cols[c].append(2)
            scores[c] = -value(cols, 1, depth - 1, last_move_wins(cols, c))
            cols[c].pop()
    return scores


def optimal_columns(cols, depth: int) -> list[int]:
    scores = root_scores(cols, depth)
    best = max(scores.values())
    return sorted(c for c, s in scores.items() if s == best)


def predicted_pick(ties: list[int], rng: np.random.Generator) -> int:
    return ties[int(rng.random() * len(ties))]


def opponent_column(before: np.ndarray, after: np.ndarray) -> int | None:
    """The column of the one opponent piece added between two observations."""
    new = np.argwhere(after[:, :, 1] & ~before[:, :, 1])
    assert len(new) <= 1
    return int(new[0][1]) if len(new) else None


def agent_action(rng: np.random.Generator, obs: np.ndarray, p_any: float) -> int:
    """A random legal column, or with probability p_any any column (maybe full)."""
    legal = np.flatnonzero(obs[0, :, 0] + obs[0, :, 1] == 0)
    if rng.random() < p_any or len(legal) == 0:
        return int(rng.integers(0, COLS))
    return int(rng.choice(legal))


def careful_action(rng: np.random.Generator, obs: np.ndarray) -> int:
    """A legal column that usually blocks the opponent's immediate win and does
    not hand it one: games last longer, so the search sees fuller boards."""
    cols = board_from_obs(obs)
    legal = legal_columns(cols)

    def wins_for(player, c):
        cols[c].append(player)
        won = last_move_wins(cols, c)
        cols[c].pop()
        return won

    blocks = [c for c in legal if wins_for(2, c)]
    if blocks and rng.random() < 0.9:
        return int(rng.choice(blocks))
    safe = []
    for c in legal:
        cols[c].append(1)
        if len(cols[c]) == ROWS or not wins_for(2, c):
            safe.append(c)
        cols[c].pop()
    if safe and rng.random() < 0.9:
        return int(rng.choice(safe))
    return int(rng.choice(legal))


# ---- the definition ---------------------------------------------------------------------
def test_definition(lib):
    d = cbuild.EnvDef.in_dll(lib, SYMBOL)
    assert d.id == ENV_ID.encode()
    obs = d.observation_space
    assert (obs.kind, obs.dtype, obs.ndim) == (0, 4, 3)
    assert tuple(obs.shape[:3]) == (ROWS, COLS, 2)
    assert all(obs.low[i] == 0.0 and obs.high[i] == 1.0 for i in range(ROWS * COLS * 2))
    assert (d.action_space.kind, d.action_space.n, d.action_space.start) == (1, COLS, 0)
    assert d.max_episode_steps == 0
    assert d.num_info_fields == 1
    f = d.info_fields[0]
    assert (f.name, f.dtype, f.ndim, f.shape[0]) == (b"action_mask", 4, 1, COLS)
    assert d.num_params == 1 and d.params[0].name == b"depth" and d.params[0].type == 1

    spec = envd.native.get_spec(ENV_ID)
    assert spec.max_episode_steps is None
    assert spec.observation_space.shape == (ROWS, COLS, 2)
    assert spec.observation_space.dtype == np.uint8
    assert spec.action_space.n == COLS


# ---- 1. the rules, against PettingZoo ----------------------------------------------------
def import_pettingzoo_connect_four():
    """connect_four_v3's module (env() adds TerminateIllegalWrapper).  It imports
    pygame at module level, for rendering only; without pygame, import it
    against a stand-in module that is removed again."""
    try:
        import pygame  # noqa: F401
    except ImportError:
        sys.modules["pygame"] = types.ModuleType("pygame")
        try:
            return importlib.import_module(PZ_MODULE)
        finally:
            del sys.modules["pygame"]
    return importlib.import_module(PZ_MODULE)


def pz_step(pz, action) -> float:
    """One AEC step; player_0's reward from it."""
    pz.observe(pz.agent_selection)  # TerminateIllegalWrapper reads the mask of the last observe
    pz.step(action)
    return float(pz.rewards["player_0"])


@pytest.mark.parametrize("depth", [0, 2, 5])
def test_rules_match_pettingzoo(lib, depth):
    connect_four_v3 = import_pettingzoo_connect_four()
    env = make_single(lib, depth)
    rng = np.random.default_rng(1000 + depth)
    outcomes = set()
    for game in range(60 if depth < 5 else 25):
        p_any = 0.15  # illegal moves in two games out of three
        pz = connect_four_v3.env()
        pz.reset(seed=game)
        obs = env.reset(seed=game)
        assert not obs.any()
        assert np.array_equal(obs, pz.observe("player_0")["observation"])
        for move in range(30):
            action = careful_action(rng, obs) if game % 3 == 0 else agent_action(rng, obs, p_any)
            new_obs, reward, term, trunc = env.step(action)
            want_reward = pz_step(pz, action)
            if not pz.terminations["player_0"]:
                opp = opponent_column(obs, new_obs)
                assert opp is not None, (game, move)
                assert pz.agent_selection == "player_1"
                want_reward += pz_step(pz, opp)
            else:
                assert opponent_column(obs, new_obs) is None
            ctx = (depth, game, move, action)
            pz_obs = pz.observe("player_0")
            assert np.array_equal(new_obs, pz_obs["observation"]), ctx
            assert reward == want_reward, ctx
            assert term == pz.terminations["player_0"], ctx
            assert not trunc
            if not term:
                assert pz.agent_selection == "player_0"
                assert np.array_equal(env.info()["action_mask"], pz_obs["action_mask"]), ctx
            obs = new_obs
            if term:
                outcomes.add(reward)
                break
        else:
            pytest.fail("a game lasted more than 21 agent moves")
    assert -1.0 in outcomes and (depth > 0 or 1.0 in outcomes), outcomes


def find_draw(env, seed: int, rng: np.random.Generator, budget: int = 20_000):
    """Agent moves that draw against the opponent of this seed, by depth-first
    search over the agent's legal moves (restoring the env, RNG included,
    between tries): the opponent's replies depend only on the moves before."""
    env.reset(seed=seed)
    steps = 0

    def search(obs, path):
        nonlocal steps
        snap = env.snapshot()
        legal = np.flatnonzero(obs[0, :, 0] + obs[0, :, 1] == 0)
        for action in rng.permutation(legal):
            if steps >= budget:
                return None
            env.restore(snap)
            new_obs, reward, term, _ = env.step(int(action))
            steps += 1
            if term:
                if reward == 0.0:
                    return path + [int(action)]
                continue
            found = search(new_obs, path + [int(action)])
            if found:
                return found
        return None

    return search(env.reset(seed=seed), [])


def test_draw_matches_pettingzoo(lib):
    """Games that fill the board: the opponent makes the 42nd ply."""
    connect_four_v3 = import_pettingzoo_connect_four()
    env = make_single(lib, depth=0)
    rng = np.random.default_rng(7)
    draws = 0
    for seed in range(20):
        moves = find_draw(env, seed, rng)
        if moves is None:
            continue
        pz = connect_four_v3.env()
        pz.reset()
        obs = env.reset(seed=seed)
        for k, action in enumerate(moves):
            new_obs, reward, term, _ = env.step(action)
            want = pz_step(pz, action)
            if not pz.terminations["player_0"]:
                want += pz_step(pz, opponent_column(obs, new_obs))
            assert np.array_equal(new_obs, pz.observe("player_0")["observation"])
            assert (reward, term) == (want, pz.terminations["player_0"])
            assert term == (k == len(moves) - 1)
            obs = new_obs
        assert len(moves) == 21 and obs.sum() == ROWS * COLS and reward == 0.0
        draws += 1
        if draws == 3:
            return
    pytest.fail(f"only {draws} draws found")


def test_illegal_move(lib):
    """A full column: -1, terminated, board unchanged; a step after the end
    changes nothing (reward 0, terminated)."""
    env = make_single(lib, depth=0)
    rng = np.random.default_rng(8)
    for game in range(100):
        obs = env.reset(seed=game)
        term = False
        while not term and not obs[0, :, :].any():  # until some column is full
            obs, _, term, _ = env.step(agent_action(rng, obs, 0.0))
        if term:
            continue
        full = int(np.flatnonzero(obs[0, :, 0] | obs[0, :, 1])[0])
        before = obs.copy()
        obs, reward, term, trunc = env.step(full)
        assert (reward, term, trunc) == (-1.0, True, False)
        assert np.array_equal(obs, before)
        for col in range(COLS):
            obs, reward, term, trunc = env.step(col)
            assert (reward, term, trunc) == (0.0, True, False)
            assert np.array_equal(obs, before)
        return
    pytest.fail("no full column in 100 games")


# ---- 2. the opponent's choice, against a plain negamax ------------------------------------
@pytest.mark.parametrize("depth,games", [(0, 30), (1, 40), (2, 40), (3, 40), (4, 24)])
def test_opponent_plays_an_optimal_column(lib, depth, games):
    env = make_single(lib, depth)
    rng = np.random.default_rng(2000 + depth)
    checked = strict = 0
    for game in range(games):
        seed = 10_000 * depth + game
        draws = np.random.default_rng(seed)  # the env's RNG, drawn once per opponent move
        obs = env.reset(seed=seed)
        while True:
            action = careful_action(rng, obs) if game % 2 else agent_action(rng, obs, 0.0)
            cols = board_from_obs(obs)
            cols[action].append(1)
            new_obs, reward, term, _ = env.step(action)
            opp = opponent_column(obs, new_obs)
            if last_move_wins(cols, action) or not legal_columns(cols):
                assert opp is None and term
                break
            scores = root_scores(cols, depth)
            best = max(scores.values())
            ctx = (depth, seed, cols, scores, opp)
            assert opp in scores and scores[opp] == best, ctx
            ties = sorted(c for c, s in scores.items() if s == best)
            assert opp == predicted_pick(ties, draws), ctx
            checked += 1
            strict += len(ties) < len(scores)
            cols[opp].append(2)
            assert board_from_obs(new_obs) == cols
            obs = new_obs
            if term:
                assert reward == (-1.0 if last_move_wins(cols, opp) else 0.0)
                break
            assert reward == 0.0
    assert checked > 5 * games
    if depth >= 1:
        assert strict > 0  # the search did decide something


def test_opponent_default_depth_is_optimal(lib):
    """The default depth, through whole games (the reference is the slow part)."""
    depth = int(cbuild.EnvDef.in_dll(lib, SYMBOL).params[0].default_value)
    env = make_single(lib)
    rng = np.random.default_rng(5)
    checked = 0
    for seed in range(2):
        obs = env.reset(seed=seed)
        draws = np.random.default_rng(seed)
        term = False
        while not term:
            action = careful_action(rng, obs)
            cols = board_from_obs(obs)
            cols[action].append(1)
            new_obs, _, term, _ = env.step(action)
            opp = opponent_column(obs, new_obs)
            if opp is not None:
                ties = optimal_columns(cols, depth)
                assert opp == predicted_pick(ties, draws), (cols, ties, opp)
                checked += 1
            obs = new_obs
    assert checked >= 6


# ---- 3. tie-breaking with the env's RNG ---------------------------------------------------
@pytest.mark.parametrize("depth", [0, 2])
def test_tie_break_from_the_opening(lib, depth):
    """After the agent's first move in column 3 every column ties (nobody can win
    within two plies), so the opponent's column is the seed's draw."""
    env = make_single(lib, depth)
    picks = {}
    for seed in range(120):
        env.reset(seed=seed)
        obs, *_ = env.step(3)
        picks[seed] = opponent_column(np.zeros_like(obs), obs)
        env.reset(seed=seed)
        obs, *_ = env.step(3)
        assert opponent_column(np.zeros_like(obs), obs) == picks[seed]  # same seed, same column
        assert picks[seed] == predicted_pick(list(range(COLS)), np.random.default_rng(seed))
    assert set(picks.values()) == set(range(COLS))


def test_tie_break_among_a_subset(lib):
    """Positions where some but not all legal columns are optimal: reseeding the
    RNG before the same step picks every optimal column and nothing else."""
    env = make_single(lib, depth=2)
    rng = np.random.default_rng(3)
    found = 0
    for game in range(200):
        obs = env.reset(seed=game)
        while True:
            action = agent_action(rng, obs, 0.0)
            cols = board_from_obs(obs)
            cols[action].append(1)
            if last_move_wins(cols, action) or not legal_columns(cols):
                break
            ties = optimal_columns(cols, 2)
            if 2 <= len(ties) < len(legal_columns(cols)):
                snap = env.snapshot()
                seen = set()
                for seed in range(40):
                    env.restore(snap)
                    env.seed_rng(seed)
                    new_obs, *_ = env.step(action)
                    pick = opponent_column(obs, new_obs)
                    assert pick == predicted_pick(ties, np.random.default_rng(seed)), (cols, ties)
                    seen.add(pick)
                assert seen == set(ties), (cols, ties)
                env.restore(snap)
                found += 1
            new_obs, _, term, _ = env.step(action)
            obs = new_obs
            if term:
                break
        if found >= 8:
            return
    pytest.fail(f"only {found} positions with a strict subset of optimal columns")


# ---- 4. write_info: the action mask --------------------------------------------------------
def test_action_mask(lib):
    env = make_single(lib, depth=1)
    rng = np.random.default_rng(4)
    full_seen = 0
    for game in range(150):
        obs = env.reset(seed=game)
        mask = env.info()["action_mask"]
        assert mask.dtype == np.uint8 and np.array_equal(mask, np.ones(COLS, np.uint8))
        term = False
        while not term:
            obs, _, term, _ = env.step(agent_action(rng, obs, 0.1))
            mask = env.info()["action_mask"]
            want = ((obs[0, :, 0] == 0) & (obs[0, :, 1] == 0)).astype(np.uint8)
            assert np.array_equal(mask, want), (obs, mask)
            full_seen += int((mask == 0).sum())
    assert full_seen > 50


def batch_mask(obs: np.ndarray) -> np.ndarray:
    """Per env, 1 where the top cell of the column is empty (from the planes)."""
    return ((obs[:, 0, :, 0] == 0) & (obs[:, 0, :, 1] == 0)).astype(np.uint8)


def test_action_mask_in_info_of_make_step_and_recv():
    """The host publishes write_info's mask as info["action_mask"], one row per
    env, after reset, every step (autoresets included) and every recv."""
    rng = np.random.default_rng(2)
    full_columns = 0
    with envd.make(ENV_ID, 16, seed=3, num_threads=2, depth=1) as env:
        obs, info = env.reset()
        assert info["action_mask"].shape == (16, COLS) and info["action_mask"].all()
        for _ in range(60):
            obs, _, _, _, info = env.step(rng.integers(0, COLS, 16))
            assert np.array_equal(info["action_mask"], batch_mask(obs))
            full_columns += int((info["action_mask"] == 0).sum())
    with envd.make(ENV_ID, 16, seed=3, num_threads=2, depth=1, batch_size=8) as env:
        env.async_reset()
        for _ in range(60):
            obs, _, _, _, info = env.recv()
            assert np.array_equal(info["action_mask"], batch_mask(obs))
            full_columns += int((info["action_mask"] == 0).sum())
            env.send(rng.integers(0, COLS, 8), info["env_id"])
    assert full_columns > 20  # the masks were not all ones


# ---- 5. the depth parameter through make ---------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 11, 2.5, 3.0, "3", True, None])
def test_depth_rejected(bad):
    with pytest.raises(InvalidArgumentError, match="depth"):
        envd.make(ENV_ID, 2, seed=0, depth=bad)


@pytest.mark.parametrize("depth", [0, 10])
def test_depth_bounds_accepted(depth):
    with envd.make(ENV_ID, 2, seed=0, num_threads=0, depth=depth) as env:
        obs, _ = env.reset()
        assert obs.shape == (2, ROWS, COLS, 2) and not obs.any()
        obs, reward, term, trunc, _ = env.step(np.array([3, 3]))
        assert obs.sum() == 4 and not term.any() and not trunc.any()


# ---- the vectorised env ----------------------------------------------------------------------
def test_vector_env_matches_single_instances(lib):
    """envd.make seeds env i with seed + i and autoresets on the next step
    (a reset that continues the env's RNG): the same as one C instance each."""
    n, seed, depth = 8, 40, 3
    singles = [make_single(lib, depth) for _ in range(n)]
    rng = np.random.default_rng(6)
    with envd.make(ENV_ID, n, seed=seed, num_threads=0, depth=depth) as env:
        obs, _ = env.reset()
        want_obs = np.stack([s.reset(seed=seed + i) for i, s in enumerate(singles)])
        assert np.array_equal(obs, want_obs)
        done = np.zeros(n, bool)
        for _ in range(150):
            actions = np.array([agent_action(rng, o, 0.05) for o in obs])
            obs, rewards, terms, truncs, _ = env.step(actions)
            for i, s in enumerate(singles):
                if done[i]:
                    want = (s.reset(), 0.0, False, False)
                else:
                    want = s.step(actions[i])
                assert np.array_equal(obs[i], want[0])
                assert (rewards[i], terms[i], truncs[i]) == want[1:]
            done = terms | truncs


# ---- 6. bit-identical across thread counts ---------------------------------------------------
def run_threads(num_threads: int, steps: int = 200):
    rng = np.random.default_rng(9)
    out = []
    with envd.make(ENV_ID, 64, seed=1, num_threads=num_threads) as env:
        obs, _ = env.reset()
        out.append(obs.copy())
        for _ in range(steps):
            obs, rewards, terms, truncs, _ = env.step(rng.integers(0, COLS, 64))
            out += [obs.copy(), rewards.copy(), terms.copy(), truncs.copy()]
    return out


def test_threads_bit_identical():
    serial, threaded = run_threads(0), run_threads(2)
    assert len(serial) == len(threaded)
    for a, b in zip(serial, threaded):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
