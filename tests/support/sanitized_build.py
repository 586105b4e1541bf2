"""A sanitizer build (ASan+UBSan or TSan) of the extension envd.native._envd_native,
and the environment that runs a daemon on it.

The build uses native/build_ffi.py's cdef, sources and flags, adds the
sanitizer flags, and compiles outside the tree into a cache under /tmp keyed
by a hash of native/'s C sources and headers, build_ffi.py and the flags (so a
rerun costs nothing; an edited C file rebuilds).  The checkout's
native/_envd_native*.so is never touched.

To run on it, a Python process needs:

* the sanitizer runtime preloaded (LD_PRELOAD): the interpreter itself is not
  instrumented, so the runtime must be the first library in the process;
* the import of envd.native._envd_native redirected to the sanitized file:
  OVERLAY/sitecustomize.py (on PYTHONPATH) puts a finder first on
  sys.meta_path that answers that one module name from ENVD_NATIVE_OVERRIDE;
  every other module (envd, numpy, zmq, uvloop) imports as usual.

sanitized_env(kind) returns that environment for a subprocess (e.g.
tests/support/daemon.DaemonProcess(..., env=sanitized_env("asan"))).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
MODULE = "envd.native._envd_native"

#: Strings that mark a sanitizer report in a process's output.
SANITIZER_REPORTS = ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
                     "ERROR: LeakSanitizer", "runtime error:", "ThreadSanitizer: ",
                     "AddressSanitizer: ", "UndefinedBehaviorSanitizer")

SUPPRESSIONS = ROOT / "tests" / "sanitizer_suppressions"

# kind -> (extra compile flags, extra link flags, runtime library, environment)
SANITIZERS = {
    "asan": (["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer", "-g", "-O1"],
             ["-fsanitize=address,undefined"], "libasan.so",
             # CPython, numpy and zmq keep memory until exit by design: no leak
             # checking of the whole interpreter (the C stress programs, which
             # own every allocation, run with detect_leaks=1 in tests/native).
             {"ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:"
                              "exitcode=99:print_summary=1",
              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}),
    "tsan": (["-fsanitize=thread", "-g", "-O1"], ["-fsanitize=thread"], "libtsan.so",
             {"TSAN_OPTIONS": f"halt_on_error=1:exitcode=99:report_signal_unsafe=0:"
                              f"second_deadlock_stack=1:"
                              f"suppressions={SUPPRESSIONS / 'tsan.supp'}"}),
}

_BUILD_DIR = Path(tempfile.gettempdir()) / f"envd-sanitized-{os.getuid()}"
OVERLAY = ROOT / "tests" / "sanitizer_overlay"


def _build_ffi():
    spec = importlib.util.spec_from_file_location("_envd_build_ffi", NATIVE / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    cwd = os.getcwd()
    try:  # build_ffi.py makes its paths relative to the cwd
        os.chdir(ROOT)
        spec.loader.exec_module(module)
    finally:
        os.chdir(cwd)
    return module


def runtime(kind: str) -> str:
    """The path of the gcc sanitizer runtime to preload."""
    name = SANITIZERS[kind][2]
    path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise RuntimeError(f"gcc has no {name}")
    return os.path.realpath(path)


def build(kind: str) -> Path:
    """Compile the extension with `kind`'s sanitizer; return the .so (cached)."""
    cflags, ldflags, _, _ = SANITIZERS[kind]
    key = hashlib.sha256()
    for p in sorted(NATIVE.rglob("*.[ch]")) + [NATIVE / "build_ffi.py",
                                                NATIVE / "cdef_from_headers.py", Path(__file__)]:
        key.update(str(p.relative_to(NATIVE.parent)).encode())
        key.update(p.read_bytes())
    key.update(" ".join(cflags + ldflags + [sys.version]).encode())
    _BUILD_DIR.mkdir(mode=0o700, exist_ok=True)
    out = _BUILD_DIR / f"_envd_native-{kind}-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    from cffi import FFI

    bf = _build_ffi()
    ffi = FFI()
    ffi.cdef(bf.CDEF)
    # -O2 in CFLAGS is overridden by the later -O1 of the sanitizer flags
    ffi.set_source(MODULE, bf.ffibuilder._assigned_source[1],
                   sources=[str(NATIVE / s) for s in bf.SOURCES],
                   include_dirs=[str(NATIVE / "include"), str(NATIVE / "src")],
                   extra_compile_args=bf.CFLAGS + cflags,
                   extra_link_args=["-pthread"] + ldflags,
                   libraries=["m", "dl"])
    tmp = Path(tempfile.mkdtemp(prefix=f"build-{kind}-", dir=_BUILD_DIR))
    try:
        built = Path(ffi.compile(tmpdir=str(tmp), verbose=False))
        staged = out.with_suffix(f".tmp{os.getpid()}")
        shutil.copyfile(built, staged)
        staged.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def sanitized_env(kind: str) -> dict[str, str]:
    """Environment variables that run a Python subprocess on the `kind` build."""
    so = build(kind)
    env = dict(SANITIZERS[kind][3])
    env["LD_PRELOAD"] = runtime(kind)
    env["ENVD_NATIVE_OVERRIDE"] = str(so)
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = str(OVERLAY) + (os.pathsep + path if path else "")
    return env


def reports_in(text: str) -> list[str]:
    """The lines of text that look like a sanitizer report."""
    return [line for line in text.splitlines() if any(s in line for s in SANITIZER_REPORTS)]


if __name__ == "__main__":  # python tests/support/sanitized_build.py asan|tsan: build, print env
    for kind in sys.argv[1:] or ["asan", "tsan"]:
        print(kind, build(kind))
        for k, v in sanitized_env(kind).items():
            print(f"  {k}={v}")
