"""MultiDiscrete and MultiBinary spaces in the native ABI (envd.h ABI 4) and
per-env make kwargs, on the test plugin tests/native/multi_spaces.c against
its plain-Python reference (support/multi_spaces_checks.py).  Each check runs
in a fresh interpreter: a loaded plugin stays in the process's registry."""
from __future__ import annotations

import pytest
from support.multi_spaces_checks import SOURCE, run_check
from support.plugin_checks import build_plugin


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return str(build_plugin(SOURCE, tmp_path_factory.mktemp("multi") / "libmulti_spaces.so"))


def test_spaces_are_gymnasium_spaces(library):
    run_check("spaces_are_gymnasium_spaces", library)


def test_matches_reference_for_thread_counts(library):
    run_check("matches_reference", library)


def test_per_env_kwargs_match_separately_made_envs(library):
    run_check("per_env_kwargs_match_separate_envs", library)


def test_out_of_range_actions_are_refused_and_nothing_moves(library):
    run_check("out_of_range_actions_are_refused", library)


def test_kwarg_lists_of_the_wrong_length_or_range_are_refused(library):
    run_check("kwarg_lists_are_refused", library)
