"""Runtime env plugins (native/src/plugin.c, envd.native.registry.load_plugin):
the example plugin builds with the documented line and matches its reference;
every broken plugin is refused with a message naming the problem.

In-process loading runs in fresh interpreters (plugin_checks.run_check): a
loaded plugin stays in the process's registry, which other tests compare
with the built-ins."""
from __future__ import annotations

import subprocess
import sys

import pytest
from support import plugin_checks
from support.plugin_checks import EXAMPLE_SOURCE, VARIANTS_SOURCE, build_plugin, run_check


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return build_plugin(EXAMPLE_SOURCE, tmp_path_factory.mktemp("plugin") / "libguess_number.so")


def test_include_flag_prints_the_header_directory():
    out = subprocess.run([sys.executable, "-m", "envd.native", "--include"], capture_output=True,
                         text=True, check=True, cwd="/").stdout.strip()
    with open(f"{out}/envd.h") as header:
        assert "ENVD_PLUGIN_SYMBOL" in header.read()
    usage = subprocess.run([sys.executable, "-m", "envd.native"], capture_output=True, text=True,
                           cwd="/")
    assert usage.returncode == 2 and "--include" in usage.stdout


def test_example_links_nothing_of_envd(example):
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(example)],
                               capture_output=True, text=True, check=True).stdout
    assert "envd_" not in undefined, undefined


def test_example_matches_reference(example):
    run_check("example_matches_reference", str(example))


def test_example_async_recv_returns_info_fields(example):
    run_check("example_async_has_info", str(example))


def test_loading_twice_is_a_no_op(example, tmp_path):
    link = tmp_path / "link.so"
    link.symlink_to(example)
    run_check("loading_is_idempotent", str(example), str(link))


BROKEN = {
    # -D flags of plugin_variants.c -> what the error must say
    "missing": ((), "No such file"),
    "NO_ENTRY": (("NO_ENTRY",), "does not export envd_plugin()"),
    "NULL_TABLE": (("NULL_TABLE",), "envd_plugin() returned NULL"),
    "OTHER_ABI": (("OTHER_ABI",), "built for envd ABI 999 but this envd has ABI"),
    "NO_ENVS": (("NO_ENVS",), "a table without envs"),
    "ZERO_STATE": (("ZERO_STATE",), "env #0 (TestPlugin-v0) is invalid: state_size"),
    "DUPLICATE": (("DUPLICATE",), "defines env id 'TestPlugin-v0' twice"),
    "UNDEFINED": (("UNDEFINED",), "undefined symbol: envd_test_no_such_function"),
    "BUILTIN_ID": (('ENV_ID="CartPole-v1"',), "'CartPole-v1' is already registered (by builtin)"),
    "not_a_library": ((), "cannot load it"),
    "RESERVED_INFO": (('INFO_NAME="episode"',), "is invalid: info_fields: a field name is reserved"),
    "UNDERSCORE_INFO": (('INFO_NAME="_steps"',), "names starting with '_' are envd's own"),
    "BAD_RENDER": (("BAD_RENDER",), "is invalid: render: render_width and render_height"),
    # ABI 4 added values an older definition cannot have: refused with a rebuild hint
    "ABI3_AGENTS": (("ABI3_AGENTS",), "num_agents must be 1 in an ABI 2 or 3 definition; "
                                      "rebuild it against this envd's envd.h"),
    "ABI3_MULTI": (("ABI3_MULTI",), "action_space: MULTI_DISCRETE, MULTI_BINARY and INT8 "
                                    "need ABI 4; rebuild it"),
    "AGENTS_ZERO": (("AGENTS_ZERO",), "num_agents must be in 1..ENVD_MAX_AGENTS"),
    "BAD_NVEC": (("BAD_NVEC",), "action_space: a multi-discrete space needs every nvec >= 1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_plugin_is_refused(case, example, tmp_path):
    defines, expected = BROKEN[case]
    library = tmp_path / f"lib{case}.so"
    if case == "not_a_library":
        library.write_text("not an ELF file")
    elif case != "missing":
        build_plugin(VARIANTS_SOURCE, library, *defines)
    run_check("refused", str(library), expected, str(example))


def test_failing_write_info_is_reported_and_env_stays_usable(tmp_path):
    library = build_plugin(VARIANTS_SOURCE, tmp_path / "libinfo_fails.so", "INFO_FAILS")
    run_check("failing_info_is_reported", str(library))


def test_reference_is_not_trivial():
    """The reference really plays: bisection finds the number within 7 guesses."""
    ref = plugin_checks.GuessNumber(seed=3, penalty=0.0)
    ref.reset()
    for _ in range(7):
        obs, reward, term, trunc, bounds = ref.step((ref.low + ref.high) // 2)
        if term:
            break
    assert term and reward == 1.0 and bounds[0] == bounds[1] == ref.target


def test_env_failing_inside_async_batches_loses_no_env(tmp_path):
    library = build_plugin(VARIANTS_SOURCE, tmp_path / "libinfo_fails.so", "INFO_FAILS")
    run_check("async_failure_loses_no_env", str(library))


def test_a_rebuilt_plugin_is_refused_with_a_clear_reason(example, tmp_path):
    first = tmp_path / "libguess.so"
    first.write_bytes(example.read_bytes())
    rebuilt = build_plugin(EXAMPLE_SOURCE, tmp_path / "rebuilt.so")
    run_check("rebuilt_plugin_needs_new_process", str(first), str(rebuilt))


def test_a_refused_plugin_is_unloaded_so_its_fix_loads(tmp_path):
    library = build_plugin(VARIANTS_SOURCE, tmp_path / "libfix.so", 'ENV_ID="CartPole-v1"')
    fixed = build_plugin(VARIANTS_SOURCE, tmp_path / "fixed.so")
    run_check("refused_then_fixed_loads", str(library), str(fixed))


def test_envd_list_shows_the_envs_of_plugin_flags(example, tmp_path):
    broken = build_plugin(VARIANTS_SOURCE, tmp_path / "libother_abi.so", "OTHER_ABI")
    proc = subprocess.run([sys.executable, "-m", "envd", "--plugin", str(example),
                           "--plugin", str(broken), "list"],
                          capture_output=True, text=True, cwd="/")
    assert "GuessNumber-v0" in proc.stdout and "penalty (float" in proc.stdout
    assert "CartPole-v1" in proc.stdout
    assert proc.returncode == 1 and "built for envd ABI 999" in proc.stderr


def test_abi_2_plugin_loads_and_does_not_render(tmp_path):
    """ABI 3 only appended the render fields: an ABI 2 plugin still loads and
    steps, its render fields are never read, and asking it for frames is a
    clear error naming the env."""
    library = build_plugin(VARIANTS_SOURCE, tmp_path / "libabi2.so", "ABI_2")
    run_check("abi_2_loads_without_rendering", str(library))


def test_plugin_render_callback_draws_the_frames(tmp_path):
    library = build_plugin(VARIANTS_SOURCE, tmp_path / "librenders.so", "RENDERS")
    run_check("plugin_renders", str(library))
