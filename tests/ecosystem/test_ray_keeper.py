"""The Ray keeper (envd.integrations._ray_keeper) sweeps the segments of its
daemon's shared-memory namespace when the daemon exits non-zero: the one the
daemon reads from its flags, ENVD_SHM_NAMESPACE or its --config file (a
daemon of namespace N names its segments N-<pid>-<nonce>, which a sweep of
no namespace never looks at)."""
from __future__ import annotations

import os
import sys

import pytest

from envd.integrations import _ray_keeper
from envd.server import stale_segments

DAEMON = [sys.executable, "-m", "envd"]


def test_the_namespace_is_read_as_the_daemon_reads_it(tmp_path):
    assert _ray_keeper.shm_namespace([*DAEMON, "--shm-namespace", "ray1"], {}) == "ray1"
    assert _ray_keeper.shm_namespace([*DAEMON, "--threads", "2"],
                                     {"ENVD_SHM_NAMESPACE": "ray2"}) == "ray2"
    assert _ray_keeper.shm_namespace([*DAEMON, "--shm-namespace", "ray1"],
                                     {"ENVD_SHM_NAMESPACE": "ray2"}) == "ray1"  # (the flag wins)
    config = tmp_path / "envd.toml"
    config.write_text('shm-namespace = "ray3"\n')
    config.chmod(0o600)
    assert _ray_keeper.shm_namespace([*DAEMON, "--config", str(config)], {}) == "ray3"
    assert _ray_keeper.shm_namespace(["envd", "--shm-namespace", "ray4"], {}) == "ray4"
    assert _ray_keeper.shm_namespace([*DAEMON, "--ocean", "cartpole"], {}) == ""


@pytest.mark.parametrize("argv", [
    [*DAEMON, "--shm-namespace", "Bad-Name"],     # refused by the daemon: no segment made
    [*DAEMON, "--shm-namespace", "ray1", "--threads", "many"],
    [*DAEMON, "--config", "/nonexistent/envd.toml"],
])
def test_settings_the_daemon_refuses_give_no_namespace(argv):
    assert _ray_keeper.shm_namespace(argv, {}) == ""


def test_a_daemon_that_exits_non_zero_has_its_namespace_swept(tmp_path, monkeypatch):
    """The keeper itself: its daemon (refusing an unknown flag) exits 2, and
    the sweep looks at the daemon's namespace."""
    swept: list[str] = []
    monkeypatch.setattr(stale_segments, "remove_stale_segments",
                        lambda namespace="": swept.append(namespace) or [])
    monkeypatch.setenv("ENVD_SHM_NAMESPACE", "rayenv")
    _ray_keeper._keep(os.getpid(), str(tmp_path), [*DAEMON, "--no-such-flag"])
    assert (tmp_path / "status").read_text() == "2"
    assert swept == ["rayenv"]
