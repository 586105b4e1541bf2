"""ABI 5 in-process (native/src/describe.c, vec.c, envd.native.registry):
spaces described from the params, seed before init and at seeded resets,
serial inits, envs that reset themselves and report their own episodes, and
the refusals.  Each check runs in a fresh interpreter (support.abi5_checks)."""
from __future__ import annotations

import pytest
from support.abi5_checks import SOURCE, run_check
from support.plugin_checks import EXAMPLE_SOURCE, build_plugin
from support.plugin_checks import run_check as plugin_check


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    return build_plugin(SOURCE, tmp_path_factory.mktemp("abi5") / "libabi5.so")


@pytest.mark.parametrize("threads", [0, 1, 2])
def test_described_seeded_self_resetting_env(plugin, threads):
    run_check("in_process", str(plugin), str(threads), timeout=300)


@pytest.fixture(scope="module")
def plugin_without_step_envs(tmp_path_factory):
    return build_plugin(SOURCE, tmp_path_factory.mktemp("abi5") / "libabi5_one.so",
                        "NO_STEP_ENVS")


def test_env_by_env_steps_as_step_envs(plugin_without_step_envs):
    """The same checks with only step: what step_envs does is step's."""
    run_check("in_process", str(plugin_without_step_envs), "0", timeout=300)


def test_step_envs_is_read_only_under_its_flag(tmp_path):
    """A definition whose step_envs bytes are set without ENVD_ENV_STEP_ENVS
    (what a host sees past the end of a definition built with an older ABI 5
    header) steps env by env: that step_envs aborts if called."""
    library = build_plugin(SOURCE, tmp_path / "libabi5_unflagged.so", "STEP_ENVS_UNFLAGGED")
    run_check("in_process", str(library), "2", timeout=300)


@pytest.mark.parametrize("variant", ["OBS_ROWS", "OBS_ROWS_PRIVATE"])
@pytest.mark.parametrize("threads", [0, 2])
def test_envs_bound_to_their_rows_step_as_copying_ones(variant, threads, tmp_path):
    """bind_obs (ENVD_ENV_OBS_ROWS): in-process, with or without
    ENVD_ENV_OBS_ROWS_PRIVATE, every env is bound once, after init and before
    its first reset, and is then given only its own rows, in steps, resets,
    step_envs runs and async batches (the plugin aborts otherwise); the
    whole in-process check passes as for an env that copies."""
    library = build_plugin(SOURCE, tmp_path / f"lib{variant}.so", variant)
    run_check("bound_rows", str(library), str(threads), "1", timeout=300)
    run_check("in_process", str(library), str(threads), timeout=300)


def test_bind_obs_is_read_only_under_its_flag(plugin):
    """The plain plugin sets bind_obs without ENVD_ENV_OBS_ROWS (what a host
    sees past the end of an older ABI 5 definition): never bound."""
    run_check("bound_rows", str(plugin), "2", "0", timeout=300)


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("variant", ["step_envs", "step"])
def test_a_failing_env_is_named_and_the_others_step(plugin, plugin_without_step_envs, variant,
                                                    threads):
    library = plugin if variant == "step_envs" else plugin_without_step_envs
    run_check("failing_env", str(library), str(threads), timeout=300)


def test_refusals_leave_the_process_usable(plugin):
    run_check("refusals", str(plugin))


def test_inits_of_a_serial_init_env_never_overlap(plugin):
    run_check("serial_init", str(plugin), timeout=300)


BROKEN = {
    "BAD_FLAGS": "flags: a bit this host does not know is set",
    "TIME_LIMIT": "max_episode_steps must be 0 for an env with ENVD_ENV_RESETS_ITSELF",
    "MANY_FIELDS": "num_episode_fields must be in 0..ENVD_MAX_EPISODE_FIELDS",
    "DESCRIBE_DEFAULT_FAILS": "describe fails at the default params",
    "DESCRIBE_BAD": "num_agents must be in 1..ENVD_MAX_AGENTS",
    "STEP_ENVS_NO_FLAG": "step_envs: only an env with ENVD_ENV_RESETS_ITSELF steps envs in a row",
    "STEP_ENVS_NULL": "flags: ENVD_ENV_STEP_ENVS is set but step_envs is NULL",
    "OBS_ROWS_NO_RESET": "bind_obs: only an env with ENVD_ENV_RESETS_ITSELF writes its rows",
    "OBS_ROWS_NULL": "flags: ENVD_ENV_OBS_ROWS is set but bind_obs is NULL",
    "OBS_PRIVATE_ALONE": "flags: ENVD_ENV_OBS_ROWS_PRIVATE needs ENVD_ENV_OBS_ROWS",
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_abi5_plugin_is_refused(case, tmp_path):
    good = build_plugin(EXAMPLE_SOURCE, tmp_path / "libguess_number.so")
    library = build_plugin(SOURCE, tmp_path / f"lib{case}.so", case)
    plugin_check("refused", str(library), BROKEN[case], str(good))


def test_the_serial_init_check_catches_overlapping_inits(tmp_path):
    """Without ENVD_ENV_SERIAL_INIT the same makes overlap their inits, which
    the plugin detects: so the check above can fail."""
    library = build_plugin(SOURCE, tmp_path / "libno_serial.so", "NO_SERIAL")
    run_check("serial_init", str(library), "expect overlap", timeout=300)


def test_envd_list_shows_the_description_at_the_defaults(plugin):
    import json
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "envd", "--plugin", str(plugin), "list"],
                          capture_output=True, text=True, cwd="/", check=True)
    text = proc.stdout[proc.stdout.index("Abi5Test-v0"):]
    assert "max_episode_steps none (the env resets itself)" in text
    assert "Box(float64, shape (9,))" in text and "MultiDiscrete([4 2])" in text
    assert "(spaces at the default parameters: they depend on them)" in text
    assert 'episode_return, episode_length, score (info["envd_log"])' in text
    proc = subprocess.run([sys.executable, "-m", "envd", "--plugin", str(plugin), "list",
                           "--json"], capture_output=True, text=True, cwd="/", check=True)
    env = {e["id"]: e for e in json.loads(proc.stdout)}["Abi5Test-v0"]
    assert env["describes"] and env["resets_itself"]
    assert env["episode_fields"] == ["episode_return", "episode_length", "score"]
