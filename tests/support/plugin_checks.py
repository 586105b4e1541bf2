"""Plugin checks, and an independent Python reference of the example plugin.

Loading a plugin changes the process's env registry for good, and other tests
compare that registry with the built-ins; so test_plugins.py runs each
in-process check here in a fresh interpreter (run_check), while the daemon
tests use the reference directly.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from support.fresh_interpreter import checker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SOURCE = ROOT / "examples" / "plugins" / "guess_number.c"
VARIANTS_SOURCE = ROOT / "tests" / "native" / "plugin_variants.c"
# The build line documented in examples/plugins/guess_number.c and docs/writing-envs.md.
BUILD_LINE = 'cc -shared -fPIC -O2 -I "$({python} -m envd.native --include)" {source} -o {out}'


def build_plugin(source: Path, out: Path, *defines: str) -> Path:
    """Compile a plugin with the documented one-line build (plus -D defines)."""
    line = BUILD_LINE.format(python=sys.executable, source=source, out=out)
    line += "".join(f" '-D{d}'" for d in defines) + " -Wall -Wextra -Werror"
    # from "/", as a plugin author's build runs: anywhere but the checkout
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, f"{line}\n{proc.stderr}"
    return out


#: run plugin_checks.<name>(*args) in a fresh interpreter (support/fresh_interpreter.py)
run_check = checker("plugin_checks")


class GuessNumber:
    """GuessNumber-v0 written from its description in guess_number.c."""

    RANGE = 100
    TIME_LIMIT = 20

    def __init__(self, seed: int, penalty: float):
        self.rng = np.random.default_rng(seed)
        self.penalty = penalty
        self.needs_reset = False

    def reset(self) -> tuple[float, list[int]]:
        self.target = int(self.rng.random() * self.RANGE)
        self.low, self.high, self.steps = 0, self.RANGE - 1, 0
        self.needs_reset = False
        return 0.0, [self.low, self.high]

    def step(self, guess: int) -> tuple[float, float, bool, bool, list[int]]:
        """One step of the vec semantics (next_step autoreset, time limit 20)."""
        if self.needs_reset:
            obs, bounds = self.reset()
            return obs, 0.0, False, False, bounds
        self.steps += 1
        if guess == self.target:
            obs, reward, term = 0.0, 1.0, True
            self.low = self.high = guess
        else:
            obs, reward, term = (-1.0 if self.target < guess else 1.0), -self.penalty, False
            if self.target < guess:
                self.high = min(self.high, guess - 1)
            else:
                self.low = max(self.low, guess + 1)
        trunc = self.steps >= self.TIME_LIMIT
        self.needs_reset = term or trunc
        return obs, reward, term, trunc, [self.low, self.high]


def guesses(refs: list[GuessNumber], rng: np.random.Generator) -> np.ndarray:
    """Half the envs bisect their interval (so episodes end by success), the
    other half guess at random (so some run into the time limit)."""
    bisect = np.array([(r.low + r.high) // 2 for r in refs])
    random = rng.integers(0, GuessNumber.RANGE, len(refs))
    return np.where(np.arange(len(refs)) % 2 == 0, bisect, random).astype(np.int64)


def check_against_reference(env, seed: int, penalty: float, steps: int = 120) -> int:
    """Step env (a fresh GuessNumber-v0 VecEnv made with seed and penalty)
    beside the reference; return the number of episodes that ended."""
    refs = [GuessNumber(seed + i, penalty) for i in range(env.num_envs)]
    obs, info = env.reset()
    first = [r.reset() for r in refs]
    assert obs[:, 0].tolist() == [o for o, _ in first]
    assert info["bounds"].tolist() == [b for _, b in first]
    rng = np.random.default_rng(seed)
    ended = 0
    for _ in range(steps):
        actions = guesses(refs, rng)
        obs, rewards, terms, truncs, info = env.step(actions)
        expected = [r.step(int(a)) for r, a in zip(refs, actions)]
        assert obs[:, 0].tolist() == [e[0] for e in expected]
        assert rewards.tolist() == [float(np.float32(e[1])) for e in expected]
        assert terms.tolist() == [e[2] for e in expected]
        assert truncs.tolist() == [e[3] for e in expected]
        assert info["bounds"].tolist() == [e[4] for e in expected]
        ended += int((terms | truncs).sum())
    return ended


# ---- checks run by test_plugins.py in a fresh interpreter ---------------------------
def example_matches_reference(library: str) -> None:
    import envd
    for threads in (0, 2):
        with envd.make("GuessNumber-v0", 16, seed=7, num_threads=threads, plugin=library,
                       penalty=0.25) as env:
            ended = check_against_reference(env, 7, 0.25)
            assert ended > 16, ended  # episodes ended by success and by the time limit


def example_async_has_info(library: str) -> None:
    """recv returns each batch's own rows of the info field."""
    import envd
    envd.load_plugin(library)
    with envd.make("GuessNumber-v0", 8, seed=1, batch_size=4) as env:
        refs = [GuessNumber(1 + i, 0.0) for i in range(8)]
        expected = {i: refs[i].reset()[1] for i in range(8)}
        env.async_reset()
        for _ in range(30):
            obs, rewards, terms, truncs, info = env.recv()
            ids = info["env_id"]
            assert info["bounds"].shape == (4, 2)
            assert info["bounds"].tolist() == [expected[i] for i in ids]
            actions = guesses([refs[i] for i in ids], np.random.default_rng(0))
            for i, a in zip(ids, actions):
                expected[i] = refs[i].step(int(a))[4]
            env.send(actions, ids)


def loading_is_idempotent(library: str, link: str) -> None:
    import envd
    before = envd.list_envs()
    assert envd.load_plugin(library) == ["GuessNumber-v0"]
    assert envd.load_plugin(library) == ["GuessNumber-v0"]
    assert envd.load_plugin(link) == ["GuessNumber-v0"]  # another path, the same file
    assert envd.list_envs() == sorted([*before, "GuessNumber-v0"])
    spec = envd.native.get_spec("GuessNumber-v0")
    assert spec.origin == os.path.abspath(library)
    assert [(f.name, f.shape, f.dtype.name) for f in spec.info_fields] == [("bounds", (2,), "int64")]
    assert [p.name for p in spec.params] == ["penalty"]


def refused(library: str, expected: str, good_library: str) -> None:
    """Loading library raises PluginError containing expected and registers
    nothing; the process then still loads a good plugin and steps it."""
    import envd
    before = envd.list_envs()
    try:
        envd.load_plugin(library)
    except envd.PluginError as e:
        assert expected in str(e), f"{expected!r} not in {str(e)!r}"
        assert library in str(e)
    else:
        raise AssertionError(f"{library} was loaded")
    assert envd.list_envs() == before
    with envd.make("GuessNumber-v0", 2, seed=0, plugin=good_library) as env:
        env.reset()
        env.step(np.zeros(2, np.int64))


def failing_info_is_reported(library: str) -> None:
    import envd
    envd.load_plugin(library)
    with envd.make("TestPlugin-v0", 4, seed=0) as env:
        _, info = env.reset()
        assert info["steps"].tolist() == [0, 0, 0, 0] and info["steps"].dtype == np.int32
        for k in (1, 2):
            assert env.step(np.zeros(4, np.int64))[4]["steps"].tolist() == [k] * 4
        try:
            env.step(np.zeros(4, np.int64))
        except envd.NativeError as e:
            assert "write_info" in str(e), str(e)
        else:
            raise AssertionError("a failing write_info was not reported")
        env.reset()  # the env stays usable
        assert env.step(np.zeros(4, np.int64))[4]["steps"].tolist() == [1] * 4


def async_failure_loses_no_env(library: str) -> None:
    import envd
    envd.load_plugin(library)
    with envd.make("TestPlugin-v0", 6, seed=0, batch_size=2, num_threads=2) as env:
        check_async_failure(env)


def check_async_failure(env) -> None:
    """env: TestPlugin-v0 of plugin_variants.c built with INFO_FAILS, 6 envs,
    batch_size 2.  An env failing inside an async batch (write_info fails from
    its third step on) raises NativeError from the send or recv that notices
    it, and every env is still returned exactly once per send."""
    import envd
    sent = np.zeros(6, np.int64)
    received = np.zeros(6, np.int64)
    env.async_reset()
    sent += 1  # the reset counts as one send of every env
    errors = []
    for _ in range(40):
        try:
            _, _, _, _, info = env.recv()
        except envd.NativeError as e:
            errors.append(str(e))
            continue
        ids = info["env_id"]
        received[ids] += 1
        try:
            env.send(np.zeros(len(ids), np.int64), ids)
        except envd.NativeError as e:  # an inline batch fails at once
            errors.append(str(e))
        sent[ids] += 1
    while True:  # drain what is in flight or ready
        try:
            _, _, _, _, info = env.recv()
        except envd.NativeError as e:
            errors.append(str(e))
            continue
        except envd.EnvStateError:
            break  # nothing left
        received[info["env_id"]] += 1
    assert received.tolist() == sent.tolist(), (sent, received)
    assert errors and all("write_info callback" in e for e in errors), errors
    env.reset()  # back to sync mode: the env is usable
    env.step(np.zeros(6, np.int64))


def rebuilt_plugin_needs_new_process(library: str, rebuilt: str) -> None:
    import envd
    envd.load_plugin(library)
    os.replace(rebuilt, library)  # a rebuild: a new file at the same path
    try:
        envd.load_plugin(library)
    except envd.PluginError as e:
        assert "an earlier build of this file is loaded" in str(e), str(e)
        assert "new process" in str(e), str(e)
    else:
        raise AssertionError("a rebuilt plugin was loaded over the old one")


def refused_then_fixed_loads(library: str, fixed: str) -> None:
    """A plugin refused by the registry (its id is taken) is unloaded again,
    so a corrected build at the same path loads in the same process."""
    import envd
    try:
        envd.load_plugin(library)
    except envd.PluginError as e:
        assert "already registered (by builtin)" in str(e), str(e)
    else:
        raise AssertionError("a plugin redefining CartPole-v1 was loaded")
    os.replace(fixed, library)
    assert envd.load_plugin(library) == ["TestPlugin-v0"]
    with envd.make("TestPlugin-v0", 2, seed=0) as env:
        env.reset()
        assert env.step(np.zeros(2, np.int64))[0][:, 0].tolist() == [1.0, 1.0]


def gymnasium_ids_of_plugin(library: str) -> None:
    """A plugin's ids join gymnasium's registry (envd/<id>) when it is loaded,
    and gymnasium.make_vec then makes its envs."""
    import gymnasium

    import envd
    assert "envd/GuessNumber-v0" not in gymnasium.registry
    assert envd.load_plugin(library) == ["GuessNumber-v0"]
    assert "envd/GuessNumber-v0" in gymnasium.registry
    with gymnasium.make_vec("envd/GuessNumber-v0", num_envs=8, seed=7, penalty=0.25) as env:
        assert isinstance(env, envd.VecEnv)
        assert check_against_reference(env, 7, 0.25) > 8


def abi_2_loads_without_rendering(library: str) -> None:
    import envd
    from envd.native import get_spec
    assert envd.load_plugin(library) == ["TestPlugin-v0"]
    spec = get_spec("TestPlugin-v0")
    assert spec.render_shape is None and spec.render_modes == []
    with envd.make("TestPlugin-v0", 2, seed=0) as env:
        env.reset()
        assert env.step(np.zeros(2, np.int64))[0][:, 0].tolist() == [1.0, 1.0]
        assert env.render_mode is None and env.metadata["render_modes"] == []
    try:
        envd.make("TestPlugin-v0", 2, render_mode="rgb_array")
    except envd.InvalidArgumentError as e:
        assert "TestPlugin-v0 does not render" in str(e), str(e)
    else:
        raise AssertionError("an ABI 2 env was made with render_mode='rgb_array'")


def plugin_renders(library: str) -> None:
    import envd
    envd.load_plugin(library)
    with envd.make("TestPlugin-v0", 3, seed=0, render_mode="rgb_array") as env:
        assert env.metadata["render_fps"] == 5
        env.reset()
        env.step(np.zeros(3, np.int64))
        env.step(np.zeros(3, np.int64))
        frames = env.render()
        assert isinstance(frames, tuple) and len(frames) == 3
        for frame in frames:
            assert frame.shape == (2, 4, 3) and frame.dtype == np.uint8
            assert (frame == np.array([2, 2, 3], np.uint8)).all()
