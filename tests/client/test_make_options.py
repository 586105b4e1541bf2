"""envd.make_options: each make option defined once.  Its table agrees with
the protocol's make fields, every option an env kind or an entry point does
not take is refused with that option's one message, and the bounds hold at
their edges (pure Python: no daemon, no native core)."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from envd import make_options as mo
from envd import protocol
from envd.errors import InvalidArgumentError


def test_the_wire_fields_are_the_protocols_make_fields():
    sent = {option.wire for option in mo.OPTIONS.values() if option.wire is not None}
    assert sent | {"env_id", "env_kwargs"} == set(protocol.MESSAGE_FIELDS["make"])
    assert all(option.wire == name for name, option in mo.OPTIONS.items() if option.wire)


@pytest.mark.parametrize("env_id,kind", [("CartPole-v1", mo.NATIVE), ("puffer:go", mo.PUFFER),
                                         ("py:CartPole-v1", mo.PYTHON), (lambda: None, mo.PYTHON),
                                         ("pz:mpe2.simple_spread_v3:parallel_env", mo.PETTINGZOO),
                                         (7, mo.NATIVE)])
def test_the_kind_of_an_id(env_id, kind):
    assert mo.kind_of(env_id) == kind


def test_the_registry_names_every_kind_and_what_builds_it_at_each_place():
    """Each kind has a distinct prefix (but the C kind's, which takes every
    other id), an in-process and a daemon builder in the modules that build
    there, and a refusal for each entry point that does not make it."""
    assert set(mo.KINDS) == {mo.NATIVE, mo.PUFFER, mo.PYTHON, mo.PETTINGZOO}
    prefixes = [kind.prefix for kind in mo.KINDS.values() if kind.prefix is not None]
    assert len(set(prefixes)) == len(prefixes) == len(mo.KINDS) - 1
    assert not any(a != b and a.startswith(b) for a in prefixes for b in prefixes)
    for kind in mo.KINDS.values():
        assert kind.prefix is None or mo.kind_of(kind.prefix + "x") == kind.name
        assert kind.builder.startswith("envd.native.")
        assert kind.daemon_builder.startswith("envd.server.make_builders:")
        assert kind.places <= {mo.IN_PROCESS, mo.DAEMON, mo.MULTI_DAEMON}
        assert kind.places == {mo.IN_PROCESS, mo.DAEMON, mo.MULTI_DAEMON} or kind.instead
        for place in {mo.IN_PROCESS, mo.DAEMON, mo.MULTI_DAEMON} - kind.places:
            with pytest.raises(InvalidArgumentError) as error:
                kind.refuse_place(place, "Some-v0")
            assert str(error.value) == f"Some-v0: {kind.instead}"
        for place in kind.places:
            kind.refuse_place(place, "Some-v0")
    # the C kinds take the same options (each env's spec says the rest)
    for place in (mo.IN_PROCESS, mo.DAEMON):
        assert mo.KINDS[mo.NATIVE].options(place) == mo.KINDS[mo.PUFFER].options(place)


def _refusals():
    """(kind, place, option) for every option a kind or place does not take."""
    for name, option in mo.OPTIONS.items():
        for kind in mo.KINDS:
            for place in (mo.IN_PROCESS, mo.DAEMON):
                if kind not in option.kinds or place not in option.places:
                    yield kind, place, name


@pytest.mark.parametrize("kind,place,name", list(_refusals()))
def test_an_option_not_taken_is_refused_naming_it(kind, place, name):
    option = mo.OPTIONS[name]
    with pytest.raises(InvalidArgumentError) as error:
        mo.refuse_unsupported(kind, place, {"seed": 1, name: 0}, "Some-v0")
    message = str(error.value)
    assert name in message
    assert (option.instead_in_daemon if place not in option.places else option.instead) in message


@pytest.mark.parametrize("kind", list(mo.KINDS))
@pytest.mark.parametrize("place", [mo.IN_PROCESS, mo.DAEMON])
def test_what_a_kind_takes_passes_and_none_is_never_refused(kind, place):
    taken = mo.KINDS[kind].options(place)
    mo.refuse_unsupported(kind, place, dict.fromkeys(taken, 1))
    mo.refuse_unsupported(kind, place, dict.fromkeys(mo.OPTIONS))
    assert mo.taken(kind, place, dict.fromkeys(mo.OPTIONS, 1)) == dict.fromkeys(taken, 1)


def test_every_kind_takes_every_autoreset_mode():
    assert mo.check_autoreset_mode(None) is None
    for mode in AutoresetMode:
        assert mo.check_autoreset_mode(mode.value) is mode
    with pytest.raises(InvalidArgumentError):
        mo.check_autoreset_mode("sometimes")


@pytest.mark.parametrize("value,threads,message", [
    (-1, None, r"max_threads=-1 is out of range; expected 0 <= max_threads"),
    (2**31, None, r"is out of range"),
    (3, 2, r"max_threads=3 is out of range: this daemon's pool has 2 threads \(--threads\), "
           r"so 0 <= max_threads <= 2"),
    (-1, 2, r"max_threads=-1 is out of range: this daemon's"),
    (1.0, 2, r"max_threads must be an int or None, got float"),
    (True, None, r"max_threads must be an int or None, got bool"),
    ("1", 4, r"max_threads must be an int"),
])
def test_max_threads_is_checked_once_against_the_daemons_pool(value, threads, message):
    with pytest.raises(InvalidArgumentError, match=message):
        mo.check_max_threads(value, threads)


def test_max_threads_in_range_passes_as_an_int():
    assert mo.check_max_threads(None, 2) is None
    assert mo.check_max_threads(0, 0) == 0
    assert mo.check_max_threads(np.int64(2), 2) == 2 and mo.check_max_threads(2**31 - 1) == 2**31 - 1
    with pytest.raises(InvalidArgumentError, match="the daemon at tcp://h:1: its pool has 1"):
        mo.check_max_threads(2, 1, "the daemon at tcp://h:1: its")


def test_transport_defaults_to_envd_transport_then_auto(monkeypatch):
    monkeypatch.delenv("ENVD_TRANSPORT", raising=False)
    assert mo.check_transport(None) == "auto"
    monkeypatch.setenv("ENVD_TRANSPORT", "")  # (set but empty: unset)
    assert mo.check_transport(None) == "auto"
    monkeypatch.setenv("ENVD_TRANSPORT", "inline")
    assert mo.check_transport(None) == "inline"
    assert [mo.check_transport(name) for name in mo.TRANSPORTS] == ["auto", "shm", "inline"]
    monkeypatch.setenv("ENVD_TRANSPORT", "carrier-pigeon")
    for bad in (None, "SHM", b"shm", 1, ["shm"]):
        with pytest.raises(InvalidArgumentError, match="transport must be one of auto, shm, "
                                                       "inline .or ENVD_TRANSPORT unset., got"):
            mo.check_transport(bad)


def test_fast_path_defaults_to_taken_unless_envd_fast_path_is_0(monkeypatch):
    monkeypatch.delenv("ENVD_FAST_PATH", raising=False)
    assert mo.check_fast_path(None) is None
    monkeypatch.setenv("ENVD_FAST_PATH", "1")
    assert mo.check_fast_path(None) is None
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    assert mo.check_fast_path(None) is False
    assert mo.check_fast_path(True) is True and mo.check_fast_path(False) is False
    assert mo.check_fast_path(np.bool_(True)) is True  # (a plain bool: it goes on the wire)
    for bad in (1, 0, "yes", np.array([True])):
        with pytest.raises(InvalidArgumentError, match="fast_path must be None, True or False"):
            mo.check_fast_path(bad)


def test_the_bounds_at_their_edges():
    assert mo.check_num_envs(1) == 1 and mo.check_num_envs(mo.MAX_NUM_ENVS) == mo.MAX_NUM_ENVS
    for bad in (0, mo.MAX_NUM_ENVS + 1, 2.0, True):
        with pytest.raises(InvalidArgumentError, match="num_envs"):
            mo.check_num_envs(bad)
    assert mo.check_batch_size(None, 4) is None and mo.check_batch_size(4, 4) == 4
    with pytest.raises(InvalidArgumentError, match="batch_size=5 is out of range"):
        mo.check_batch_size(5, 4)
    assert mo.check_max_episode_steps(mo.NATIVE, 0) == 0  # (a C env: no limit)
    with pytest.raises(InvalidArgumentError, match="max_episode_steps=0 is out of range"):
        mo.check_max_episode_steps(mo.PYTHON, 0)
    with pytest.raises(InvalidArgumentError, match="max_episode_steps"):
        mo.check_max_episode_steps(mo.NATIVE, 2**62 + 1)
    assert mo.check_num_workers(0, 4, mo.IN_PROCESS) == 0
    with pytest.raises(InvalidArgumentError, match="num_workers=0 is out of range"):
        mo.check_num_workers(0, 4, mo.DAEMON)  # (a daemon never steps on its loop)
    assert mo.check_info_bytes(mo.PYTHON, None) == mo.DEFAULT_INFO_BYTES
    with pytest.raises(InvalidArgumentError, match="info_bytes"):
        mo.check_info_bytes(mo.PYTHON, mo.MAX_INFO_BYTES + 1)
    assert mo.check_info_bytes(mo.PETTINGZOO, None) == mo.check_info_bytes(mo.PETTINGZOO, 0) == 0
    with pytest.raises(InvalidArgumentError, match="PettingZoo env's infos are not carried"):
        mo.check_info_bytes(mo.PETTINGZOO, 64)
    assert mo.check_num_threads(None, 3) == 3
    with pytest.raises(InvalidArgumentError, match="num_threads"):
        mo.check_num_threads(mo.MAX_THREADS + 1, 3)
    with pytest.raises(InvalidArgumentError, match="render_mode='human'"):
        mo.check_render_mode("human")


def test_a_multi_agent_env_is_refused_past_the_rows_a_vec_takes():
    mo.check_rows("Seek-v0", mo.MAX_NUM_ENVS // 3, 3)
    with pytest.raises(InvalidArgumentError, match="rows, more than the .* a vec takes; make "
                                                   f"at most {mo.MAX_NUM_ENVS // 3} envs"):
        mo.check_rows("Seek-v0", mo.MAX_NUM_ENVS // 3 + 1, 3)


def test_an_env_that_resets_itself_takes_neither_episode_option():
    assert mo.check_episode("Go", True, None, None, 99) == (AutoresetMode.NEXT_STEP, 0)
    with pytest.raises(InvalidArgumentError, match="make it without autoreset_mode and "
                                                   "max_episode_steps"):
        mo.check_episode("Go", True, AutoresetMode.SAME_STEP, 5, None)
    assert mo.check_episode("CartPole-v1", False, None, None, 500) == \
        (AutoresetMode.NEXT_STEP, 500)
    assert mo.check_episode("CartPole-v1", False, AutoresetMode.DISABLED, 0, 500) == \
        (AutoresetMode.DISABLED, 0)


def test_several_daemons_take_the_options_one_daemon_takes():
    """MultiClient.make hands its options to each daemon's Client.make: at
    MULTI_DAEMON an env kind takes (and refuses) exactly what it does at
    DAEMON, with DAEMON's refusal."""
    given = {"seed": 3, "max_threads": 1, "batch_size": 2, "transport": "shm"}
    for kind in mo.KINDS:
        assert mo.KINDS[kind].options(mo.MULTI_DAEMON) == mo.KINDS[kind].options(mo.DAEMON)
    assert mo.taken(mo.NATIVE, mo.MULTI_DAEMON, given) == given
    mo.refuse_unsupported(mo.NATIVE, mo.MULTI_DAEMON, given)
    for name in ("num_threads", "pin_cpus"):
        with pytest.raises(InvalidArgumentError, match=f"takes no {name}: the daemon"):
            mo.refuse_unsupported(mo.NATIVE, mo.MULTI_DAEMON, {name: 1})


def test_the_ocean_prefix_is_defined_once():
    """The id prefix of the Ocean envs is make_options.PUFFER_PREFIX; no other
    module of the package spells it as a constant of its own."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spelled = [str(path.relative_to(root))
               for folder in ("src/envd", "client", "server", "native")
               for path in sorted((root / folder).rglob("*.py"))
               if '= "puffer:"' in path.read_text()]
    assert spelled == ["src/envd/make_options.py"]


def test_the_hosted_kinds_are_the_python_ones():
    """EnvKind.hosted: the kinds whose envs are Python objects in worker
    processes (what SB3's adapter's env_method and get_attr reach)."""
    hosted = {"py:CartPole-v1": True, "pz:m:f": True, "CartPole-v1": False,
              "puffer:go": False, "envd/CartPole-v1": False}
    assert {env_id: mo.env_kind(env_id).hosted for env_id in hosted} == hosted
