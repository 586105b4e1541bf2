"""Agents as rows (envd.h ABI 4, num_agents > 1): the Seek-v0 test plugin
(tests/native/multi_agent.c, 3 agents, MultiDiscrete actions) against its
plain-Python reference (support/multi_agent_checks.py), in-process.  Each
check runs in a fresh interpreter: a loaded plugin stays in the registry."""
from __future__ import annotations

import pytest
from support import multi_spaces_checks
from support.multi_agent_checks import SOURCE, run_check
from support.plugin_checks import build_plugin
from support.sanitized_build import reports_in, sanitized_env


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return str(build_plugin(SOURCE, tmp_path_factory.mktemp("agents") / "libseek.so"))


def test_agents_are_rows_of_the_vector_env(library):
    run_check("rows_and_spaces", library)


def test_matches_reference_for_thread_counts_and_chunks(library):
    run_check("matches_reference", library)


def test_per_env_kwargs_match_separately_made_envs(library):
    run_check("per_env_speed_matches_separate_envs", library)


def test_reset_seeds_and_masks_are_per_env(library):
    run_check("reset_mask_and_seeds_are_per_env", library)


def test_out_of_range_action_names_its_row(library):
    run_check("out_of_range_action_names_the_row", library)


def test_async_send_recv_in_whole_envs(library):
    run_check("async_matches_reference", library)


@pytest.mark.parametrize("kind", ["asan", "tsan"])
def test_multi_agent_and_multi_space_steps_under_sanitizers(library, kind, tmp_path):
    """The vec code that changed (agent rows, element-wise action checks,
    per-env params) on the ASan+UBSan and TSan builds of the extension, with
    the pool's threads and chunking: no report, same results."""
    env = sanitized_env(kind)
    stderr = run_check("matches_reference", library, env=env, timeout=600)
    spaces = str(build_plugin(multi_spaces_checks.SOURCE, tmp_path / "libmulti_spaces.so"))
    for check in ("matches_reference", "out_of_range_actions_are_refused",
                  "per_env_kwargs_match_separate_envs"):
        stderr += multi_spaces_checks.run_check(check, spaces, env=env, timeout=600)
    assert not reports_in(stderr), stderr[-8000:]


def test_sb3_adapter_sees_each_agent_end_once(library):
    run_check("sb3_sees_each_agent_end_once", library)


def test_env_failures_name_the_env_first_row(tmp_path):
    """Review finding: a recv's failure named the env (1) while a step's names
    its first row (3); both name the row now."""
    from support.multi_agent_checks import FAILING
    library = str(build_plugin(SOURCE, tmp_path / "libseekfail.so", FAILING))
    run_check("failures_name_rows", library)
