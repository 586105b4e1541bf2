"""cffi (API mode) build of envd's native core: ``envd.native._envd_native``,
and of the facts the Python side shares with it: ``envd._native_facts``.

setup.py hands this builder to setuptools through ``cffi_modules``, so
``pip install .`` compiles the C sources with the system compiler.  The cdef
declares only what Python calls: the headers mark it (``/* cffi:begin */``
... ``/* cffi:end */``) and cdef_from_headers.py turns the marked text into
cffi's declarations at build time; struct layouts, enum values and
constants come from the compiler (``...``), so they cannot drift from the C
side.

When setuptools runs this file (and when it runs as a script), it first
writes envd._native_facts (see write_facts): the error table, limits, the
doorbell's layout and the built-in env ids, printed by a small C program
(src/print_facts.c) compiled against the same headers, so that the Python
modules that mirror them (envd.errors, envd.protocol, envd.client.doorbell...)
import them from one generated source without loading native code.
"""
import hashlib
import importlib.util
import os
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from cffi import FFI

HERE = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    """native/<name>.py as a module: setuptools runs this file by path, not as
    a module of a package."""
    spec = importlib.util.spec_from_file_location(f"_envd_build_{name}", HERE / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / f'{name}.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cdef_from_headers = _load("cdef_from_headers")
build_warnings = _load("build_warnings")

# Every file of src/envs/ is a built-in env (listed once, in src/builtin_envs.h).
ENV_SOURCES = sorted(f"src/envs/{p.name}" for p in (HERE / "src" / "envs").glob("*.c"))
SOURCES = ["src/errors.c", "src/rng.c", "src/pool.c", "src/vec.c", "src/env_slot.c",
           "src/builtin_envs.c", "src/npy_f32_trig.c", *ENV_SOURCES,
           "src/plugin.c", "src/describe.c", "src/backend_pool.c", "src/backend_workers.c",
           "src/session.c", "src/engine.c",
           "src/doorbell.c", "src/batch_rows.c",
           "src/segment_guard.c", "src/raster.c"]

# Bit-exactness with numpy needs IEEE arithmetic as written: no fused
# multiply-add contraction and no fast-math reassociation.
CFLAGS = ["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-pthread"]

# What Python calls, generated from the headers' marked regions (see
# cdef_from_headers.py): a declaration added there needs no edit here.  The
# one line no header holds: the callback that the workers backend's inline
# mode calls into Python (native/hosted_session.py defines it).
HEADERS = cdef_from_headers.headers(HERE)
CDEF = (cdef_from_headers.generate(HERE)
        + 'extern "Python" int envd_hosted_run_inline(void *ctx);\n')

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "envd.native._envd_native",
    "".join(f'#include "{h.name}"\n' for h in HEADERS),
    # setuptools wants source paths relative to the project root (the cwd of
    # the build); this file may be executed from anywhere.
    sources=[os.path.relpath(HERE / s) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE / "include"), os.path.relpath(HERE / "src")],
    # a header's edit recompiles the sources too (setuptools compares these
    # with the built module; without them an in-tree rebuild kept stale code)
    depends=[os.path.relpath(h) for h in sorted(HERE.glob("include/*.h"))
             + sorted(HERE.glob("src/**/*.h"))],
    extra_compile_args=CFLAGS,
    extra_link_args=["-pthread"],
    libraries=["m", "dl"],
)


# ---- the generated Python facts -----------------------------------------------------
FACTS_MODULE = "_native_facts.py"
FACTS_DOC = '''"""Facts of envd's native core for its Python side: the error table, limits,
the doorbell's layout in a session's segment and the built-in env ids.

GENERATED at build time by native/build_ffi.py (write_facts) from what
native/src/print_facts.c, compiled against envd.h, builtin_envs.h, doorbell.h,
pool.h and vec.h, prints: do not edit, change the C headers and reinstall.
Pure Python, so the client imports it without loading native code;
tests/native/test_facts.py checks it against the compiled library.
"""
'''


def package_dir(package: str, root: Path) -> Path:
    """The folder of ``package`` in the source tree at root, as setuptools maps
    it (pyproject.toml's package-dir or packages.find): the folder build_py
    copies into the wheel and an editable install imports from."""
    from setuptools.dist import Distribution
    cwd = os.getcwd()
    try:  # setuptools reads pyproject.toml from the current directory
        os.chdir(root)
        dist = Distribution()
        dist.parse_config_files()
        build_py = dist.get_command_obj("build_py")
        build_py.ensure_finalized()
        return root / build_py.get_package_dir(package)
    finally:
        os.chdir(cwd)


def _inputs_digest() -> str:
    """A digest of everything the facts are computed from."""
    digest = hashlib.sha256()
    for path in sorted(HERE.glob("include/*.h")) + sorted(HERE.glob("src/**/*.[ch]")):
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def print_facts() -> list[list[str]]:
    """Compile src/print_facts.c with the library's sources and run it: its
    lines, split at tabs."""
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory(prefix="envd-facts-") as tmp:
        program = os.path.join(tmp, "print_facts")
        try:
            subprocess.run([*compiler, *CFLAGS, *build_warnings.warning_flags(), "-O0",
                            f"-I{HERE / 'include'}",
                            f"-I{HERE / 'src'}", str(HERE / "src/print_facts.c"),
                            *(str(HERE / s) for s in SOURCES),
                            "-o", program, "-lm", "-ldl", "-pthread"], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise RuntimeError(
                f"envd's build could not compile src/print_facts.c with {compiler[0]!r}: "
                f"{exc} (installing from source needs a C compiler, e.g. gcc, or set CC; "
                f"warnings are errors in envd's C: a newer compiler's new warning can be "
                f"let pass with {build_warnings.NO_WERROR}=1)"
            ) from None
        output = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in output.splitlines()]


def facts_source(lines: list[list[str]], digest: str) -> str:
    """The text of the facts module, from print_facts' lines."""
    out = [FACTS_DOC, f"# inputs sha256: {digest}", "",
           "# The integer constants of the headers, without their ENVD_ prefix."]
    errors, fields, env_ids = [], [], []
    for kind, name, *values in lines:
        if kind == "const":  # ENVD_VEC_MAX_ENVS -> VEC_MAX_ENVS
            out.append(f"{name.removeprefix('ENVD_')} = {int(values[0])}")
        elif kind == "error":
            errors.append(f"    {name!r}: ({int(values[0])}, {values[1]!r}),")
        elif kind == "field":
            fields.append(f"    {name!r}: ({int(values[0])}, {int(values[1])}),")
        elif kind == "env":
            env_ids.append(f"    {name!r},")
        else:
            raise ValueError(f"print_facts printed an unknown kind of fact: {kind!r}")
    out += ["", "#: ENVD_ERRNO_MAP of envd.h, in table order:",
            "#: name -> (code, envd_strerror's message)",
            "ERRORS = {", *errors, "}",
            "#: envd_doorbell_header_t (the doorbell, at DOORBELL_OFFSET of the header page):",
            "#: field -> (byte offset, size in bytes)",
            "DOORBELL_HEADER_FIELDS = {", *fields, "}",
            "#: ENVD_BUILTIN_ENVS of builtin_envs.h: the built-in env ids, in table order",
            "BUILTIN_ENV_IDS = (", *env_ids, ")", ""]
    return "\n".join(out)


def write_facts(root: Path) -> Path:
    """Write the facts module into the envd package's folder of the source tree
    at root (unless it is up to date) and return its path."""
    path = package_dir("envd", root) / FACTS_MODULE
    digest = _inputs_digest()
    if path.exists() and f"# inputs sha256: {digest}\n" in path.read_text():
        return path
    text = facts_source(print_facts(), digest)
    staged = path.with_name(f".{FACTS_MODULE}.{os.getpid()}")
    staged.write_text(text)
    os.replace(staged, path)
    return path


# setuptools (cffi_modules) executes this file as "__cffi__", in the project
# root; tests/support/sanitized_build.py and tests/native/test_facts.py import
# it under other names, which writes nothing.
if __name__ in ("__cffi__", "__main__"):
    write_facts(HERE.parent)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
