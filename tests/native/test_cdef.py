"""The cffi declarations generated from the C headers (native/cdef_from_headers.py,
run by native/build_ffi.py at build time).

Read against what the compiled module exposes: every function, constant and
enum value a header marks for Python is on ``lib`` with the header's own
signature (the headers are read here with a few regular expressions, not with
the generator), every native name the package's Python uses is declared, the
X-macro error table is expanded, and a declaration added to a marked region
reaches the cdef with no other edit."""
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import cbuild
import pytest
from cffi import FFI

from envd.native._envd_native import ffi, lib

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
PACKAGE_DIRS = [NATIVE, ROOT / "src" / "envd", ROOT / "client", ROOT / "server"]


def load_generator():
    spec = importlib.util.spec_from_file_location("_envd_cdef_from_headers",
                                                  NATIVE / "cdef_from_headers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def marked_text() -> dict[str, str]:
    """Each header's marked regions, comments removed (independent of the
    generator: split at the marker lines)."""
    out = {}
    for path in sorted(NATIVE.glob("include/*.h")) + sorted(NATIVE.glob("src/*.h")):
        regions = re.findall(r"^/\* cffi:begin \*/\n(.*?)^/\* cffi:end \*/$", path.read_text(),
                             re.S | re.M)
        if regions:
            text = re.sub(r"/\*.*?\*/", " ", "\n".join(regions), flags=re.S)
            out[path.name] = text.replace("\\\n", " ")
    return out


MARKED = marked_text()
ALL_MARKED = "\n".join(MARKED.values())
# envd_name(...); at the start of a line, after its return type (no function
# pointer parameters in the marked regions)
PROTOTYPES = re.findall(r"^([A-Za-z_][\w \*]*?)\b(envd_\w+)\(([^;{]*)\);", ALL_MARKED, re.M)


def test_the_headers_mark_what_python_sees():
    assert {"envd.h", "vec.h", "session.h", "backend_workers.h", "doorbell.h"} <= set(MARKED)
    assert len(PROTOTYPES) >= 100
    functions = {n for n in dir(lib) if not isinstance(getattr(lib, n), int)}
    # every function of the module is a marked one, but the one callback into Python
    assert functions - {p[1] for p in PROTOTYPES} == {"envd_hosted_run_inline"}


def _param_type(param: str) -> str:
    """A parameter's type: the declaration without its name."""
    param = param.strip()
    if param == "void":
        return ""
    return re.sub(r"\b\w+$", "", param).strip()


@pytest.mark.parametrize("result, name, params", PROTOTYPES, ids=[p[1] for p in PROTOTYPES])
def test_every_marked_function_is_compiled_with_its_header_signature(result, name, params):
    assert hasattr(lib, name), f"{name} is marked for Python but not on the compiled module"
    compiled = ffi.typeof(getattr(lib, name))
    types = [t for t in (_param_type(p) for p in params.split(",")) if t]
    assert compiled.result is ffi.typeof(result.strip())
    assert compiled.args == tuple(ffi.typeof(t) for t in types), name


def test_the_compiled_constants_are_the_marked_ones():
    """lib's integers are exactly the marked #defines (string constants left
    out), enum members and the error table's rows."""
    defines = re.findall(r"^\s*#\s*define\s+(ENVD_\w+)\s+([^\n]+)", ALL_MARKED, re.M)
    names = [n for n, value in defines if not value.strip().startswith('"')]
    enum_bodies = re.findall(r"\benum\b[^{;]*\{([^}]*)\}", ALL_MARKED)
    members = [m.split("=")[0].strip() for body in enum_bodies for m in body.split(",")]
    names += [m for m in members if re.fullmatch(r"ENVD_\w+", m)]
    assert len(names) > 40
    compiled = {n for n in dir(lib) if isinstance(getattr(lib, n), int)}
    assert compiled == set(names) | set(cbuild.ERROR_CODES)


def test_the_error_table_is_expanded():
    """ENVD_ERRNO_MAP's rows (cbuild reads them off envd.h) are the compiled
    module's constants, with the table's values."""
    assert len(cbuild.ERROR_CODES) >= 10
    for name, value in cbuild.ERROR_CODES.items():
        assert getattr(lib, name) == value, name
    assert "ENVD_ERRNO_MAP" not in gen.generate(NATIVE)
    assert "ENVD_ERROR_ENUM_ENTRY" not in gen.generate(NATIVE)


def _package_sources() -> str:
    """The package's Python, but the modules that load an Ocean unit's own
    library with ctypes (its lib.envd_ocean_* are the unit's, not envd's)."""
    return "\n".join(p.read_text() for d in PACKAGE_DIRS for p in sorted(d.rglob("*.py"))
                     if "ocean" not in p.name)


def test_every_native_name_the_package_uses_is_declared():
    source = _package_sources()
    names = set(re.findall(r"\blib\.((?:envd|ENVD)_\w+)", source))
    assert len(names) > 100
    assert sorted(n for n in names if not hasattr(lib, n)) == []
    types = set(re.findall(r'ffi\.\w+\("(?:const )?(envd_\w+_t)\b', source))
    assert len(types) >= 10
    for t in types:
        ffi.typeof(t)  # raises for an undeclared type


def test_the_generated_cdef_is_the_builds(monkeypatch):
    """build_ffi.py hands cffi the generator's text (plus its one callback
    declaration), and includes every marked header in the wrapper."""
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("_envd_build_ffi_cdef", NATIVE / "build_ffi.py")
    build_ffi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_ffi)
    assert build_ffi.CDEF.startswith(gen.generate(NATIVE))
    preamble = build_ffi.ffibuilder._assigned_source[1]
    for name in MARKED:
        assert f'#include "{name}"' in preamble


# ---- the generator on headers of its own ------------------------------------------------
def _copy_headers(tmp_path: Path) -> Path:
    native = tmp_path / "native"
    for sub in ("include", "src"):
        (native / sub).mkdir(parents=True)
        for h in (NATIVE / sub).glob("*.h"):
            shutil.copy(h, native / sub / h.name)
    return native


def test_a_declaration_added_to_a_marked_region_reaches_the_cdef(tmp_path):
    native = _copy_headers(tmp_path)
    session = native / "src" / "session.h"
    text = session.read_text()
    end = text.index("/* cffi:end */")
    session.write_text(text[:end] + "int envd_session_new_call(envd_session_t *s, int64_t n);\n"
                       + text[end:])
    (native / "src" / "extra.h").write_text(
        '#include "session.h"\n'
        "/* cffi:begin */\n"
        "#define ENVD_EXTRA_TABLE(X) X(ENVD_EXTRA_A, 1) \\\n    X(ENVD_EXTRA_B, 2)\n"
        "enum envd_extra {\n#define ENTRY(name, value) name = value,\n"
        "    ENVD_EXTRA_TABLE(ENTRY)\n#undef ENTRY\n};\n"
        "#define ENVD_EXTRA_LIMIT (1u << 3) /* a comment */\n"
        '#define ENVD_EXTRA_NAME "text"\n'
        "typedef struct envd_extra_s {\n    _Atomic uint32_t word;\n"
        "    char text[ENVD_EXTRA_LIMIT];\n} __attribute__((aligned(64))) envd_extra_t;\n"
        "int envd_extra_get(envd_extra_t *extra, envd_session_t *session);\n"
        "/* cffi:end */\n"
        "int envd_extra_c_only(void);\n")
    cdef = gen.generate(native)
    assert "envd_session_new_call(envd_session_t *s, int64_t n);" in cdef
    assert "enum envd_extra { ENVD_EXTRA_A, ENVD_EXTRA_B, ... };" in cdef
    assert "#define ENVD_EXTRA_LIMIT ..." in cdef
    assert "ENVD_EXTRA_NAME" not in cdef and "envd_extra_c_only" not in cdef
    assert "_Atomic" not in cdef and "__attribute__" not in cdef
    assert "char text[...];" in cdef
    # extra.h comes after session.h, which it includes
    assert cdef.index("/* src/session.h */") < cdef.index("/* src/extra.h */")
    parsed = FFI()
    parsed.cdef(cdef)  # cffi takes it
    declarations = parsed._parser._declarations
    assert "function envd_session_new_call" in declarations
    assert "function envd_extra_get" in declarations
    assert "typedef envd_extra_t" in declarations


@pytest.mark.parametrize("header, problem", [
    ("/* cffi:begin */\nint envd_a(void);\n", "without"),
    ("/* cffi:end */\n", "without a"),
    ("/* cffi:begin */\n/* cffi:begin */\n/* cffi:end */\n", "inside a marked region"),
    ("/* cffi:begin */\nstatic inline int envd_b(void) { return 0; }\n/* cffi:end */\n",
     "static"),
    ("/* cffi:begin */\n#ifdef __cplusplus\nint envd_c(void);\n#endif\n/* cffi:end */\n",
     "every branch"),
    ("/* cffi: begin */\nint envd_d(void);\n/* cffi:end */\n", "is not a marker"),
    ("/*cffi:END*/\n", "is not a marker"),
])
def test_a_bad_marking_is_refused_with_the_header_named(tmp_path, header, problem):
    native = _copy_headers(tmp_path)
    (native / "src" / "bad.h").write_text(header)
    with pytest.raises(ValueError, match=problem) as err:
        gen.generate(native)
    assert "bad.h" in str(err.value)
