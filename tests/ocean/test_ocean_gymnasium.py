"""gymnasium.make_vec("envd/puffer:<env>", ...) with no id loaded first: in
process (the user's build), through a daemon (endpoint=), and the errors of
an env not built or unknown."""
from __future__ import annotations

import os
import subprocess
import sys

import gymnasium
import numpy as np
import puffer_reference
import pytest
from support.daemon import DaemonProcess, segments_of

import envd

#: A fresh process: import envd (no Ocean env loaded), make_vec, step with
#: seeded actions; prints the observations' hex digest.
_FRESH = """
import hashlib, sys, numpy as np, gymnasium, envd
assert "envd/puffer:breakout" in gymnasium.registry
assert "envd.native" not in sys.modules  # registered without the native core
env_id, endpoint = sys.argv[1], (sys.argv[2] or None)
env = gymnasium.make_vec(env_id, num_envs=3, seed=4, frameskip=2, endpoint=endpoint)
digest = hashlib.sha256(env.reset()[0].tobytes())
for a in np.random.default_rng(0).integers(0, 3, size=(50, 3)):
    digest.update(env.step(a)[0].tobytes())
env.close()
print(digest.hexdigest())
"""


def _fresh(env_id: str, endpoint: str = "", **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _FRESH, env_id, endpoint], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env}, cwd="/")


def _expected() -> str:
    import hashlib
    with envd.make("puffer:breakout", 3, seed=4, frameskip=2) as env:
        digest = hashlib.sha256(env.reset()[0].tobytes())
        for a in np.random.default_rng(0).integers(0, 3, size=(50, 3)):
            digest.update(env.step(a)[0].tobytes())
    return digest.hexdigest()


@pytest.fixture
def ocean_cache(ocean_builds, monkeypatch):
    ocean_builds("breakout")
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))
    return str(puffer_reference.test_cache())


@pytest.mark.parametrize("env_id", ["envd/puffer:breakout", "envd:puffer:breakout"])
def test_make_vec_in_process_without_loading(ocean_cache, env_id):
    run = _fresh(env_id)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == _expected()


def test_make_vec_through_a_daemon(ocean_cache, tmp_path):
    """endpoint=: the daemon's build; this process has an empty cache."""
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    with DaemonProcess(tmp_path / "daemon", "--ocean", "breakout",
                       "--ocean-cache", ocean_cache) as proc:
        run = _fresh("envd/puffer:breakout", proc.endpoint, ENVD_OCEAN_CACHE=str(empty))
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == _expected()


def test_not_built_names_the_build_command(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    run = _fresh("envd/puffer:breakout", ENVD_OCEAN_CACHE=str(empty))
    assert run.returncode != 0
    assert "UnknownEnvError" in run.stderr and "envd ocean build breakout" in run.stderr


def test_unknown_ocean_id_and_single_env():
    with pytest.raises(gymnasium.error.Error, match="envd/puffer:go"):
        gymnasium.make_vec("envd/puffer:nosuch", num_envs=1)
    # gymnasium.make wraps one env that the caller resets; an Ocean env resets itself
    with pytest.raises(envd.InvalidArgumentError, match="resets itself"):
        gymnasium.make("envd/puffer:breakout")
