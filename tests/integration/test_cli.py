"""The `envd` command line as a user meets it (src/envd/tools/cli.py, src/envd/__main__.py):
`envd list` and `envd list --json`, `python -m envd`, output into a closed
pipe, the --threads help and note, and "did you mean" through a daemon.

Every command runs as a subprocess from a temporary working directory (a
checkout's envd/ folder in the cwd would shadow the installed package).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.daemon import DEADLINE, DaemonProcess, wait_until
from support.plugin_checks import EXAMPLE_SOURCE, build_plugin

import envd
from envd.tools import cli


def _env() -> dict[str, str]:
    """This environment without ENVD_* settings of the machine running the tests."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}


def run_envd(cwd: Path, *args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """`python -m envd ARGS` from cwd."""
    return subprocess.run([sys.executable, "-m", "envd", *args], cwd=cwd, env=_env(),
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=DEADLINE * 2)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """The example plugin under a long path, so that `envd list` has to wrap it."""
    folder = tmp_path_factory.mktemp("plugin") / ("a-folder-with-a-long-name-" * 3)
    folder.mkdir()
    return build_plugin(EXAMPLE_SOURCE, folder / "libguess_number.so")


# ---- envd list --json ---------------------------------------------------------------
def _bound(value, sign: float) -> float:
    return sign * math.inf if value is None else value


def _bounds(described, shape: tuple[int, ...], sign: float) -> np.ndarray:
    """A Box bound of the JSON (a number or nested lists, null = unbounded) as an array."""
    if isinstance(described, list):
        flat = np.array(described, dtype=object).reshape(-1)
        values = np.array([_bound(v, sign) for v in flat], np.float64).reshape(shape)
    else:
        values = np.full(shape, _bound(described, sign), np.float64)
    return values


def _check_space(described: dict, space) -> None:
    if described["type"] == "Discrete":
        assert (described["n"], described["start"]) == (space.n, space.start)
        return
    assert described["type"] == "Box"
    assert described["dtype"] == space.dtype.name
    assert tuple(described["shape"]) == space.shape
    assert np.array_equal(_bounds(described["low"], space.shape, -1),
                          space.low.astype(np.float64))
    assert np.array_equal(_bounds(described["high"], space.shape, 1),
                          space.high.astype(np.float64))


def _check_description(described: dict, spec, plugin_path: str | None = None) -> None:
    assert described["id"] == spec.id
    assert described["source"] == ("plugin" if plugin_path else "builtin")
    assert described["plugin"] == plugin_path
    _check_space(described["observation_space"], spec.observation_space)
    _check_space(described["action_space"], spec.action_space)
    assert described["max_episode_steps"] == spec.max_episode_steps
    assert described["num_agents"] == spec.num_agents
    assert [p["name"] for p in described["params"]] == [p.name for p in spec.params]
    for p, param in zip(described["params"], spec.params):
        assert p["type"] == param.type and p["default"] == param.default
        assert type(p["default"]) is type(param.default)  # false stays a bool, 5 an int
        assert _bound(p["min"], -1) == param.min_value and _bound(p["max"], 1) == param.max_value
        assert p["doc"] == param.doc
    assert [(f["name"], f["dtype"], tuple(f["shape"])) for f in described["info_fields"]] == \
        [(f.name, f.dtype.name, f.shape) for f in spec.info_fields]
    if spec.render_shape is None:
        assert described["render"] is None
    else:
        assert described["render"] == {"modes": ["rgb_array"], "shape": list(spec.render_shape),
                                       "fps": spec.render_fps}


def test_list_json_parses_and_matches_list_envs(tmp_path):
    proc = run_envd(tmp_path, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout, parse_constant=pytest.fail)  # no NaN/Infinity tokens
    assert [d["id"] for d in described] == envd.list_envs()
    for d in described:
        _check_description(d, envd.native.get_spec(d["id"]))
    by_id = {d["id"]: d for d in described}
    # -inf/inf bounds are null, uniform bounds one number, integer dtypes ints
    assert by_id["CartPole-v1"]["observation_space"]["low"][1] is None
    assert by_id["Snake-v0"]["observation_space"]["low"] == 0
    assert by_id["Pendulum-v1"]["params"][0]["default"] == 10.0
    assert by_id["Acrobot-v1"]["render"] == {"modes": ["rgb_array"], "shape": [500, 500, 3],
                                             "fps": 15}


def test_list_json_names_the_plugin_of_its_envs(tmp_path, plugin):
    proc = run_envd(tmp_path, "--plugin", str(plugin), "list", "--json")
    assert proc.returncode == 0, proc.stderr
    described = {d["id"]: d for d in json.loads(proc.stdout)}
    guess = described["GuessNumber-v0"]
    assert guess["source"] == "plugin" and guess["plugin"] == str(plugin)
    assert [p["name"] for p in guess["params"]] == ["penalty"]
    assert guess["render"] is None  # its definition has no render callback
    assert described["CartPole-v1"]["source"] == "builtin"


# ---- envd list ----------------------------------------------------------------------
def test_list_lines_fit_100_columns_and_name_everything(tmp_path, plugin):
    proc = run_envd(tmp_path, "--plugin", str(plugin), "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    too_wide = [line for line in lines if len(line) > 100]
    assert not too_wide, too_wide
    headings = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert headings == sorted(envd.list_envs() + ["GuessNumber-v0"])
    text = " ".join(proc.stdout.split())  # wrapped lines joined again
    assert "Pendulum-v1 built-in, max_episode_steps 200" in text
    assert "g (float in [0, 1000], default 10.0): acceleration of gravity" in text
    assert "low [-4.8 -inf -0.418879 -inf] high [4.8 inf 0.418879 inf]" in text  # CartPole
    assert "Box(uint8, shape (84, 84)) in [0, 255]" in text  # Snake
    assert "info action_mask: uint8 (7,) per env" in text  # ConnectFour
    assert "render rgb_array, frames (400, 600, 3) uint8 at 50 fps" in text  # CartPole
    assert "GuessNumber-v0 plugin, max_episode_steps 20" in text
    # the path on its own line, cut only where it is too long for one
    assert f"\n  plugin       {plugin}\n" in re.sub(r"\n {15}", "", proc.stdout)


# ---- python -m envd -----------------------------------------------------------------
def test_python_m_envd_works_like_the_envd_command(tmp_path):
    version = run_envd(tmp_path, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"envd {envd.__version__}"
    script = shutil.which("envd", path=os.path.dirname(sys.executable)) or shutil.which("envd")
    assert script, "the envd console script is not installed"
    listed = subprocess.run([script, "list"], cwd=tmp_path, env=_env(), capture_output=True,
                            text=True, timeout=DEADLINE * 2)
    assert run_envd(tmp_path, "list").stdout == listed.stdout != ""
    usage = run_envd(tmp_path, "--no-such-flag")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: envd ")


# ---- output into a closed pipe ------------------------------------------------------
def _into_a_closed_pipe(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run `python -m envd ARGS` whose stdout is a pipe nobody reads any more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return run_envd(cwd, *args, stdout=write_end)
    finally:
        os.close(write_end)


def test_output_into_a_closed_pipe_exits_quietly(tmp_path, daemon):
    for args in (["status", "--json", "--endpoint", daemon.endpoint],
                 ["status", "--endpoint", daemon.endpoint], ["list"], ["list", "--json"],
                 ["keygen", "--out", str(tmp_path / "keys")]):
        proc = _into_a_closed_pipe(tmp_path, *args)
        assert proc.stderr == "", (args, proc.stderr)
        assert proc.returncode == 141, (args, proc.returncode)  # 128 + SIGPIPE, as `yes | head`
    assert daemon.proc.poll() is None  # nothing happened to the daemon


def test_status_json_into_head_has_no_traceback(tmp_path, daemon):
    shell = f"{sys.executable} -m envd status --json --endpoint {daemon.endpoint} | head -c 10"
    proc = subprocess.run(["sh", "-c", shell], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=DEADLINE * 2)
    assert proc.returncode == 0 and len(proc.stdout) == 10 and proc.stdout.startswith("{")
    assert proc.stderr == ""


# ---- --threads ----------------------------------------------------------------------
def _help_entry(flag: str, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "10000")  # one line per flag
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(["--help"])
    [entry] = [line for line in out.getvalue().splitlines()
               if line.strip().startswith(f"{flag} ")]
    return entry


def test_help_gives_one_default_for_threads(monkeypatch):
    entry = _help_entry("--threads", monkeypatch)
    assert entry.count("default") == 1, entry
    cpus = len(os.sched_getaffinity(0))
    assert f"default the number of usable CPUs, here {cpus})" in entry


def test_more_threads_than_cpus_logs_one_note(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    note = re.compile(rf"--threads {cpus + 2} is more than the {cpus} CPU\(s\) this daemon "
                      rf"may run on: at most {cpus} threads step at once")
    with DaemonProcess(tmp_path / "over", "--threads", str(cpus + 2)) as over:
        wait_until(lambda: "serving" in over.log(), what="the startup line")
        assert len([line for line in over.log().splitlines() if note.search(line)]) == 1, \
            over.log()
    with DaemonProcess(tmp_path / "fits", "--threads", str(cpus)) as fits:
        wait_until(lambda: "serving" in fits.log(), what="the startup line")
        assert "is more than the" not in fits.log()


# ---- did you mean, through the daemon ------------------------------------------------
def test_did_you_mean_through_the_daemon(daemon):
    with daemon.connect() as client:
        with pytest.raises(envd.UnknownEnvError) as err:
            client.make("cartpole-v1", 2)
        assert str(err.value).startswith(
            "unknown env id 'cartpole-v1' (did you mean 'CartPole-v1'?); known ids: ")
        with pytest.raises(envd.InvalidArgumentError) as err:
            client.make("Pendulum-v1", 2, gg=9.81)
        assert "Pendulum-v1 has no parameter 'gg' (did you mean 'g'?); its parameters are: g " \
            "(float in [0, 1000], default 10.0)" in str(err.value)
        with pytest.raises(envd.InvalidArgumentError) as err:
            client.make("CartPole-v1", 2, sed=0)
        assert "has no parameter 'sed' (did you mean make's argument 'seed'?)" in str(err.value)
        with client.make("CartPole-v1", 2, seed=0) as env:  # the daemon and client go on
            assert env.reset()[0].shape == (2, 4)


def test_list_describes_multi_spaces_and_agents(tmp_path):
    """A plugin with MultiDiscrete/MultiBinary spaces (ABI 4) and one with 3
    agents per env: `envd list` and `--json` describe them (no traceback)."""
    from support.multi_agent_checks import SOURCE as SEEK_SOURCE
    from support.multi_spaces_checks import SOURCE as SPACES_SOURCE
    from support.plugin_checks import build_plugin
    spaces_lib = build_plugin(SPACES_SOURCE, tmp_path / "libmulti_spaces.so")
    seek_lib = build_plugin(SEEK_SOURCE, tmp_path / "libseek.so")
    flags = ("--plugin", str(spaces_lib), "--plugin", str(seek_lib))
    proc = run_envd(tmp_path, *flags, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    described = {d["id"]: d for d in json.loads(proc.stdout)}
    assert described["Lights-v0"]["action_space"] == {
        "type": "MultiDiscrete", "dtype": "int64", "nvec": [4, 3], "start": [0, -1]}
    assert described["Lights-v0"]["observation_space"] == {"type": "MultiBinary", "shape": [4]}
    assert described["Switches-v0"]["observation_space"]["nvec"] == [5]
    assert described["Seek-v0"]["num_agents"] == 3
    text = run_envd(tmp_path, *flags, "list")
    assert text.returncode == 0, text.stderr
    assert "MultiDiscrete([4 3], start=[ 0 -1])" in text.stdout
    assert "3 agents per env" in text.stdout
