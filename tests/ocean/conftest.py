"""Fixtures of the Ocean tests: PufferLib's tree and envd's builds of it.

The source is $ENVD_OCEAN_SOURCE (a PufferLib tree or the pinned sdist: CI
points it at a copy it fetched once), else the pinned sdist from the package
index, fetched once into the tests' private cache.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import puffer_reference

from envd.native import ocean_build


@pytest.fixture(scope="session")
def puffer_tree() -> Path:
    return puffer_reference.source_tree()


@pytest.fixture(scope="session")
def ocean_builds(puffer_tree):
    """env -> its plugin library, built once per session (and cached)."""
    cache = puffer_reference.test_cache()
    built = {}

    def get(env: str, extra_flags: tuple[str, ...] = ()) -> Path:
        key = (env, extra_flags)
        if key not in built:
            built[key] = ocean_build.build_env(env, puffer_tree, cache, extra_flags,
                                               record=not extra_flags).library
        return built[key]

    return get
