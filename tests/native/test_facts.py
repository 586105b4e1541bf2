"""envd._native_facts, the Python mirror of the C core's shared facts that
native/build_ffi.py generates at build time: every value equals the compiled
library's (cffi's ``lib.ENVD_*``, ``ffi.offsetof``, ``envd_strerror``), the
error table is one table of distinct names, codes and messages, the modules
that used to copy the numbers by hand read them from it, and the client gets
them without loading native code."""
from __future__ import annotations

import importlib.util
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.builtin_envs import listed_builtins

from envd import _native_facts as facts
from envd import errors, make_options, protocol, shm
from envd.client import doorbell
from envd.native._envd_native import ffi, lib

ROOT = Path(__file__).resolve().parents[2]

#: the integer constants of the facts module: each is lib.ENVD_<name>
CONSTANTS = ["ABI_VERSION", "ABI_VERSION_MIN", "ERROR_MIN", "VEC_MAX_ENVS", "POOL_MAX_THREADS",
             "DOORBELL_OFFSET", "DOORBELL_STEP", "DOORBELL_SEND", "DOORBELL_RECV",
             "DOORBELL_SENDRECV", "DOORBELL_LAYOUT", "DOORBELL_SHUTTING_DOWN"]


def load_build_ffi():
    """native/build_ffi.py as a module (not as setuptools runs it: importing
    it under another name writes nothing)."""
    spec = importlib.util.spec_from_file_location("_envd_build_ffi_facts",
                                                  ROOT / "native" / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    cwd = os.getcwd()
    try:  # build_ffi.py makes its source paths relative to the cwd
        os.chdir(ROOT)
        spec.loader.exec_module(module)
    finally:
        os.chdir(cwd)
    return module


# ---- the generated values are the compiled library's ------------------------------------
@pytest.mark.parametrize("name", CONSTANTS)
def test_constant_equals_the_compiled_value(name):
    assert getattr(facts, name) == getattr(lib, f"ENVD_{name}")


def test_every_generated_constant_is_checked():
    generated = {name for name, value in vars(facts).items()
                 if name.isupper() and isinstance(value, int)}
    assert generated == set(CONSTANTS) | {"DOORBELL_HEADER_SIZE"}


def test_doorbell_layout_is_the_compiled_struct():
    struct = ffi.typeof("envd_doorbell_header_t")
    # every field but the padding that keeps the server's words off the client's line
    compiled = {name: (field.offset, ffi.sizeof(field.type)) for name, field in struct.fields
                if name != "client_pad"}
    assert compiled == facts.DOORBELL_HEADER_FIELDS
    for name in facts.DOORBELL_HEADER_FIELDS:
        assert facts.DOORBELL_HEADER_FIELDS[name][0] == ffi.offsetof("envd_doorbell_header_t", name)
    assert ffi.sizeof("envd_doorbell_header_t") == facts.DOORBELL_HEADER_SIZE


def test_doorbell_fits_in_the_header_page_with_client_and_server_words_apart():
    # doorbell.h: the client's and the server's words lie on separate cache lines.
    client = ("req_seq", "req_kind", "client_waiting", "req_count")
    fields = facts.DOORBELL_HEADER_FIELDS
    assert facts.DOORBELL_OFFSET % 64 == 0
    assert max(fields[f][0] + fields[f][1] for f in client) <= 64
    assert min(offset for name, (offset, _) in fields.items() if name not in client) >= 64
    # between the session id and the arrays (envd.shm's layout)
    assert shm._SESSION_OFFSET + shm._SESSION_LEN <= facts.DOORBELL_OFFSET
    assert facts.DOORBELL_OFFSET + facts.DOORBELL_HEADER_SIZE <= shm.HEADER_SIZE


def test_builtin_env_ids_are_the_compiled_table():
    compiled = [ffi.string(lib.envd_builtin_get(i).id).decode()
                for i in range(lib.envd_builtin_count())]
    assert list(facts.BUILTIN_ENV_IDS) == compiled
    assert sorted(compiled) == listed_builtins()  # no plugin loaded in this process


# ---- the error table ----------------------------------------------------------------------
def test_error_table_matches_the_library():
    for name, (code, message) in facts.ERRORS.items():
        assert getattr(lib, name) == code, name
        assert ffi.string(lib.envd_strerror(code)).decode() == message, name


def test_error_table_has_distinct_names_codes_and_messages():
    codes = [code for code, _ in facts.ERRORS.values()]
    messages = [message for _, message in facts.ERRORS.values()]
    assert len(set(codes)) == len(codes) and len(set(messages)) == len(messages)
    assert all(name.startswith("ENVD_") for name in facts.ERRORS)
    assert facts.ERRORS["ENVD_OK"] == (0, "success")
    assert sorted(codes) == list(range(facts.ERROR_MIN, 1)), "codes must be 0..ERROR_MIN"
    assert "unknown error code" not in messages
    assert ffi.string(lib.envd_strerror(facts.ERROR_MIN - 1)) == b"unknown error code"


def test_envd_errors_names_every_native_code_without_native_code():
    assert {name[len("ENVD_"):]: getattr(lib, name)
                                   for name in facts.ERRORS} == errors.NATIVE_CODES
    for name, (code, message) in facts.ERRORS.items():
        assert errors.native_strerror(code) == f"{message} ({name})"
    assert errors.native_strerror(facts.ERROR_MIN - 1) == \
        f"unknown error code ({facts.ERROR_MIN - 1})"


@pytest.mark.parametrize("name", [n for n in facts.ERRORS if n != "ENVD_OK"])
def test_wire_codes_carry_every_native_code(name):
    """A NativeError of every code crosses the wire with its code, and a
    refused step of every code becomes an error with a wire code."""
    from gymnasium import spaces

    from envd.vec_errors import step_error
    code = getattr(lib, name)
    reply = protocol.error_reply(1, errors.NativeError("it failed", code))
    back = protocol.error_from_reply(reply)
    assert type(back) is errors.NativeError and back.code == code
    buffers = {"actions": np.zeros(2, np.int64), "terminations": np.ones(2, bool),
               "truncations": np.zeros(2, bool)}
    exc = step_error("CartPole-v1", spaces.Discrete(2), code, 0, buffers)
    assert protocol.ERROR_CODES[exc.error_code] is type(exc)
    if isinstance(exc, errors.NativeError):
        assert exc.code == code
    if type(exc) is errors.NativeError and code != lib.ENVD_EENV:
        assert name in str(exc), "the fallback message names the code"


# ---- the modules that mirrored the numbers read them from the facts -----------------------
def test_python_mirrors_read_the_generated_facts():
    from envd import gymnasium_registry
    from envd.server import config
    assert protocol.DOORBELL_OFFSET == shm.DOORBELL_OFFSET == lib.ENVD_DOORBELL_OFFSET
    assert (doorbell.STEP, doorbell.SEND, doorbell.RECV, doorbell.SENDRECV) == \
        (lib.ENVD_DOORBELL_STEP, lib.ENVD_DOORBELL_SEND, lib.ENVD_DOORBELL_RECV, lib.ENVD_DOORBELL_SENDRECV)
    assert doorbell.SHUTTING_DOWN == lib.ENVD_DOORBELL_SHUTTING_DOWN
    assert make_options.MAX_NUM_ENVS == lib.ENVD_VEC_MAX_ENVS
    assert config.MAX_THREADS == make_options.MAX_THREADS == lib.ENVD_POOL_MAX_THREADS
    assert sorted(gymnasium_registry.BUILTIN_ENV_IDS) == sorted(facts.BUILTIN_ENV_IDS)


def test_client_doorbell_reads_and_writes_the_compiled_struct():
    """The client's Doorbell and the C struct agree field by field: what one
    side writes, the other reads."""
    memory = mmap.mmap(-1, shm.HEADER_SIZE)
    header = ffi.cast("envd_doorbell_header_t *", ffi.from_buffer(memory) + facts.DOORBELL_OFFSET)
    bell = doorbell.Doorbell(memory, facts.DOORBELL_OFFSET)
    bell.ring(doorbell.SEND, 7)
    assert (header.req_seq, header.req_kind, header.req_count) == (1, lib.ENVD_DOORBELL_SEND, 7)
    assert not bell.answered
    header.status, header.result, header.error_index = lib.ENVD_EBUSY, 5, 3
    header.done_seq = 1
    assert bell.wait(time.monotonic() + 60, lambda: None) == (lib.ENVD_EBUSY, 5, 3)
    header.closed = 1
    assert bell.closed
    del header, bell  # the views of memory go before it closes
    memory.close()


def test_importing_the_client_loads_no_native_code_but_the_facts():
    code = ("import sys, envd.client; "
            "assert 'envd._native_facts' in sys.modules; "
            "bad = [m for m in sys.modules if m.startswith('envd.native') or m == 'cffi']; "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr


# ---- the generator ---------------------------------------------------------------------------
def test_the_installed_module_is_what_the_build_writes_from_this_checkout():
    """Regenerating from the headers gives the installed text byte for byte
    (if not, the package was built from other headers: reinstall)."""
    build_ffi = load_build_ffi()
    text = build_ffi.facts_source(build_ffi.print_facts(), build_ffi._inputs_digest())
    assert Path(facts.__file__).read_text() == text, \
        "the installed envd._native_facts was built from other sources: reinstall (pip install .)"


def test_the_module_goes_into_the_envd_package_folder_setuptools_maps():
    build_ffi = load_build_ffi()
    folder = build_ffi.package_dir("envd", ROOT)
    # the ground floor of envd (its __init__, protocol and errors), not a folder above it
    assert all((folder / name).is_file() for name in ("__init__.py", "protocol.py", "errors.py"))
