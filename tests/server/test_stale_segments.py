"""The startup sweep of dead daemons' segments (server/stale_segments.py) and
--shm-namespace: a daemon sweeps only its own namespace's dead daemons (no
namespace: only those without one), never a live daemon's segments, in a
private folder standing for /dev/shm."""
from __future__ import annotations

import os

import pytest

from envd.server.config import Config
from envd.server.stale_segments import Instance, check_namespace, remove_stale_segments


def _segment(folder, instance: str, session: str = "0123abcd") -> str:
    name = f"envd-{instance}-{session}"
    (folder / name).write_bytes(b"\0" * 64)
    return name


def _dead_lock(folder, instance: str) -> str:
    name = f".envd-{instance}.lock"
    (folder / name).write_bytes(b"")  # nobody holds it: its daemon is gone
    return name


def test_each_namespace_sweeps_its_own_dead_daemons_only(tmp_path):
    live = Instance(shm_dir=str(tmp_path))
    live_alpha = Instance(shm_dir=str(tmp_path), namespace="alpha")
    try:
        assert live_alpha.name.startswith("alpha-")
        kept = {_segment(tmp_path, live.name), _segment(tmp_path, live_alpha.name),
                f".envd-{live.name}.lock", f".envd-{live_alpha.name}.lock"}
        dead = {namespace: [_segment(tmp_path, instance), _dead_lock(tmp_path, instance),
                            _segment(tmp_path, f"{prefix}999998-0badf00d")]
                for namespace, prefix in (("", ""), ("alpha", "alpha-"), ("alpha2", "alpha2-"))
                for instance in [f"{prefix}999999-deadbeef"]}
        names = set(os.listdir(tmp_path))

        removed = remove_stale_segments(str(tmp_path), namespace="alpha")
        assert sorted(removed) == sorted(n for n in dead["alpha"] if not n.startswith("."))
        assert set(os.listdir(tmp_path)) == names - set(dead["alpha"])

        removed = remove_stale_segments(str(tmp_path))
        assert sorted(removed) == sorted(n for n in dead[""] if not n.startswith("."))
        assert set(os.listdir(tmp_path)) == kept | set(dead["alpha2"])

        remove_stale_segments(str(tmp_path), namespace="alpha2")
        assert set(os.listdir(tmp_path)) == kept
    finally:
        for instance in (live, live_alpha):
            instance.remove_own_segments()
            instance.release()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("namespace", ["", "a", "t0", "z" * 16, "abc123"])
def test_a_namespace_is_a_lowercase_name_of_at_most_16(namespace):
    assert check_namespace(namespace) == namespace
    assert Config(shm_namespace=namespace).shm_namespace == namespace
    assert Config().shm_namespace is None


@pytest.mark.parametrize("namespace", ["A", "1a", "a-b", "a" * 17, "a/b", "a.b", " a", "é"])
def test_other_namespaces_are_refused_naming_the_flag(namespace):
    with pytest.raises(ValueError, match=r"--shm-namespace \(ENVD_SHM_NAMESPACE\)"):
        Config(shm_namespace=namespace)
    with pytest.raises(ValueError):
        Instance(namespace=namespace)
