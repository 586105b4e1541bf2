"""Build PufferLib's Ocean envs as envd ABI 5 plugins (``envd ocean build``).

Each env's own ``binding.c`` and ``<env>.h`` are compiled unmodified, in a
build tree of their own inside the cache: the env's folder copied to
``ocean/<env>/``, envd's ``env_binding.h`` at ``ocean/env_binding.h`` (where
binding.c's ``#include "../env_binding.h"`` resolves), and envd's glue, the
env's manifest, ``envd.h`` and a ``Python.h`` stand-in in ``envd_ocean/``.
Every unit is compiled with ``-include ocean_random.h`` (per-env glibc random
streams and clocks).  The flags are PufferLib's for its C extensions (its
setup.py: -O2, -fwrapv, -DNDEBUG from Python's own CFLAGS, -DPLATFORM_DESKTOP,
its -Wno list), never -march=native nor -ffast-math: the trajectories are
compared bit for bit with PufferLib's own build; envd adds only flags that
place code (PLACEMENT_FLAGS).  raylib is linked only where needed: the glue
never renders, so the linker drops the render code (--gc-sections) and
--no-undefined proves no raylib symbol is left; a unit
whose c_close still asks raylib (IsWindowReady) gets the sdist's static
libraylib.a, as PufferLib links it.

The cache (default ``$XDG_CACHE_HOME/envd/ocean``) is a folder of the user's
own, mode 0700: it is refused when another user owns it or others may write
it, because the daemon loads libraries from it.  Builds are keyed by the
env's source files, envd's glue and manifest, envd.h, the compiler's version
and the flags, and are made under a file lock, so concurrent builds wait for
each other and reuse the result.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envd.errors import EnvdError
from envd.native import ocean_source

GLUE_DIR = Path(__file__).resolve().parent / "ocean"
GLUE_FILES = ("env_binding.h", "ocean_python.h", "ocean_layout.h", "ocean_random.h",
              "ocean_glue.h", "python/Python.h")
CACHE_ENV = "ENVD_OCEAN_CACHE"
CC_ENV = "CC"

# PufferLib 3.0.0's setup.py (Linux, not DEBUG) on top of Python's CFLAGS
# (-DNDEBUG -fwrapv); -Wno-error= keeps newer compilers' default errors
# warnings, as PufferLib's macOS flags do.
PUFFER_FLAGS = ("-O2", "-fwrapv", "-DNDEBUG", "-DPLATFORM_DESKTOP",
                "-Wno-alloc-size-larger-than", "-Wno-implicit-function-declaration",
                "-Wno-error=int-conversion", "-Wno-error=incompatible-pointer-types",
                "-Wno-error=implicit-function-declaration", "-fmax-errors=3")
GLUE_FLAGS = ("-fPIC", "-ffunction-sections", "-fdata-sections")
# Code placement only (no flag here changes a float; the trajectory tests
# compare bit for bit), each kept where the compiler accepts it
# (placement_flags):
# - loops aligned to 32 bytes, so that a short inner loop never straddles a
#   64-byte fetch block: where the glue's code moved breakout's brick loop in
#   compute_observations across one, envd's step cost 11% more CPU than
#   PufferLib's at N=64 with the same instructions (perf's samples on the
#   loop; docs/benchmarks.md, "Ocean code placement");
# - TLS descriptors on x86-64: every rand() of an env reads the thread's
#   stream slot (ocean_random.h), which in a shared object is a call of
#   __tls_get_addr per read by default, and a load once the loader placed the
#   slot in static TLS (glibc does for descriptors where room is left, else
#   the call); enduro draws about seven a step.
PLACEMENT_FLAGS = ("-falign-loops=32", "-mtls-dialect=gnu2")
LINK_FLAGS = ("-shared", "-Wl,--gc-sections", "-Wl,--version-script=exports.map",
              "-Wl,--no-undefined")
EXPORTS = ("ENVD_OCEAN { global: envd_plugin; envd_ocean_ckwargs; envd_ocean_action_dtype; "
           "local: *; };\n")
INDEX = "built.json"


class OceanBuildError(EnvdError):
    """An Ocean env cannot be built (no compiler, no source, a compile error)."""


@dataclass(frozen=True)
class OceanBuild:
    """One built env: its name and plugin library."""

    env: str
    library: Path
    key: str


def manifest_envs() -> list[str]:
    """The Ocean envs envd has a manifest for (the envs it can build)."""
    return sorted(p.stem for p in (GLUE_DIR / "manifests").glob("*.h"))


def default_cache() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "envd" / "ocean"


def check_private_dir(path: Path, create: bool = False) -> Path:
    """``path`` if it is a real folder of this user that no one else may
    write (mode 0700 when created here); else OceanBuildError."""
    if create and not path.exists():
        path.mkdir(mode=0o700, parents=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise OceanBuildError(f"{path}: no such Ocean build cache "
                              "(run `envd ocean build` first)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OceanBuildError(f"{path}: the Ocean build cache must be a folder, not a link "
                              "or a file")
    if st.st_uid != os.getuid():
        raise OceanBuildError(f"{path}: the Ocean build cache belongs to uid {st.st_uid}, "
                              f"not to this user ({os.getuid()}); refusing to use it")
    if st.st_mode & 0o077:
        raise OceanBuildError(f"{path}: the Ocean build cache has mode "
                              f"{stat.S_IMODE(st.st_mode):o}; it must be 0700 (chmod 700)")
    return path


@contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """Hold the cache's build lock (an flock: released if the process dies)."""
    fd = os.open(cache / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def find_compiler() -> list[str]:
    """The C compiler: $CC, else cc, gcc or clang on PATH; else OceanBuildError."""
    if os.environ.get(CC_ENV):
        return shlex.split(os.environ[CC_ENV])
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise OceanBuildError("no C compiler found: `envd ocean build` needs one "
                          "(install gcc or clang, or set CC)")


def compiler_version(cc: Sequence[str]) -> str:
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise OceanBuildError(f"the C compiler {shlex.join(cc)} cannot run: {e.strerror}") from None
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else "?"


_accepted: dict[tuple[str, ...], tuple[str, ...]] = {}


def placement_flags(cc: Sequence[str]) -> tuple[str, ...]:
    """The PLACEMENT_FLAGS ``cc`` compiles a unit with, without a warning
    (an unknown one, or gnu2 off x86-64, is left out: the build goes on as
    before it), probed once per process and compiler."""
    key = tuple(cc)
    if key not in _accepted:
        ok = []
        for flag in PLACEMENT_FLAGS:
            try:
                done = subprocess.run([*cc, "-Werror", flag, "-fPIC", "-x", "c", "-c", "-o",
                                       os.devnull, "-"], input="__thread int x;\nint f(void)"
                                      " { return x; }\n", capture_output=True, text=True,
                                      timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0:
                ok.append(flag)
        _accepted[key] = tuple(ok)
    return _accepted[key]


def envd_include() -> Path:
    """The folder of the envd.h Ocean plugins build against: the installed
    package's."""
    return Path(__file__).resolve().parent / "include"


def _hash_files(digest: hashlib._Hash, root: Path, files: Sequence[Path]) -> None:
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")


def _env_files(ocean: Path, env: str) -> list[Path]:
    folder = ocean / env
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".c", ".h")]


def build_key(env: str, ocean: Path, cc: Sequence[str], flags: Sequence[str],
              raylib: Path | None = None) -> str:
    """What a build depends on, hashed: the env's C files, envd's glue and the
    env's manifest, envd.h, raylib's header and library, the compiler's
    version, every flag and the exported symbols."""
    digest = hashlib.sha256()
    if raylib is not None:
        _hash_files(digest, raylib, [p for p in (raylib / "include" / "raylib.h",
                                                 raylib / "lib" / "libraylib.a") if p.is_file()])
    _hash_files(digest, ocean, _env_files(ocean, env))
    _hash_files(digest, GLUE_DIR, [GLUE_DIR / f for f in GLUE_FILES]
                + [GLUE_DIR / "manifests" / f"{env}.h"])
    digest.update((envd_include() / "envd.h").read_bytes())
    digest.update("\0".join([*cc, compiler_version(cc), *flags, EXPORTS]).encode())
    return digest.hexdigest()


def _first_error(output: str) -> str:
    lines = output.splitlines()
    for line in lines:
        if " error:" in line or "undefined reference" in line or "fatal error" in line:
            return line.strip()
    return lines[0].strip() if lines else "the compiler failed without a message"


def _stage(tree: Path, ocean: Path, env: str) -> None:
    """The build tree: the env's folder unmodified, envd's headers beside it."""
    shutil.copytree(ocean / env, tree / "ocean" / env,
                    ignore=shutil.ignore_patterns("*.so", "*.o", "__pycache__"))
    glue = tree / "envd_ocean"
    (glue / "python").mkdir(parents=True)
    shutil.copyfile(GLUE_DIR / "env_binding.h", tree / "ocean" / "env_binding.h")
    for name in GLUE_FILES:
        shutil.copyfile(GLUE_DIR / name, glue / name)
    shutil.copyfile(GLUE_DIR / "manifests" / f"{env}.h", glue / "manifest.h")
    shutil.copyfile(envd_include() / "envd.h", glue / "envd.h")
    (tree / "exports.map").write_text(EXPORTS)


def _compile(tree: Path, cc: Sequence[str], flags: Sequence[str], raylib: Path | None,
             library: str, env: str) -> None:
    """Compile and link the env's unit.  Linked without raylib first; a unit
    whose kept code still calls raylib (a c_close that asks IsWindowReady) is
    linked again with the sdist's static libraylib.a, as PufferLib links it."""
    cmd = [*cc, *flags, "-include", "envd_ocean/ocean_random.h", "-I", "envd_ocean",
           "-I", "envd_ocean/python"]
    if raylib is not None:  # the units include raylib.h
        cmd += ["-I", str(raylib / "include")]
    cmd += [f"ocean/{env}/binding.c", "-o", library, *LINK_FLAGS, "-lm"]
    done = _run_compiler(cmd, tree, cc, env)
    static = raylib / "lib" / "libraylib.a" if raylib is not None else None
    if done.returncode != 0 and "undefined reference" in done.stderr and static and static.is_file():
        done = _run_compiler([*cmd, str(static), "-lpthread", "-ldl"], tree, cc, env)
    if done.returncode != 0:
        raise OceanBuildError(f"{env}: does not compile: {_first_error(done.stderr)}")


def _run_compiler(cmd: list[str], tree: Path, cc: Sequence[str],
                  env: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=600)
    except OSError as e:
        raise OceanBuildError(f"the C compiler {shlex.join(cc)} cannot run: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise OceanBuildError(f"{env}: the compiler ran over 600 s") from None


def _raylib(tree_root: Path) -> Path | None:
    """The sdist's raylib folder (include/raylib.h, lib/libraylib.a)."""
    for candidate in sorted(tree_root.glob("raylib*")) + [tree_root / "raylib"]:
        if (candidate / "include" / "raylib.h").is_file():
            return candidate
    return None


def header_digest() -> str:
    """The sha256 of this envd's envd.h: a library built against another
    header may lay the ABI's structs out otherwise (an unreleased ABI changes
    within its version), so it is never loaded (installed_builds)."""
    return hashlib.sha256((envd_include() / "envd.h").read_bytes()).hexdigest()


def _record(cache: Path, build: OceanBuild) -> None:
    index = cache / INDEX
    entries = json.loads(index.read_text()) if index.is_file() else {}
    entries[build.env] = {"library": str(build.library.relative_to(cache)), "key": build.key,
                          "envd_h": header_digest()}
    partial = cache / (INDEX + ".part")
    partial.write_text(json.dumps(entries, indent=1, sort_keys=True))
    partial.replace(index)


def build_env(env: str, tree_root: Path, cache: Path, extra_flags: Sequence[str] = (),
              record: bool = True) -> OceanBuild:
    """Build one env of the PufferLib tree ``tree_root`` into ``cache`` (or
    reuse the build of the same key).  ``extra_flags`` (e.g. sanitizers) add
    to the key; ``record`` makes it the env's build ``installed_builds`` sees."""
    if env not in manifest_envs():
        raise OceanBuildError(f"unknown Ocean env {env!r}; envd builds: "
                              + ", ".join(manifest_envs()))
    ocean = ocean_source.ocean_dir(tree_root)
    if not (ocean / env / "binding.c").is_file():
        raise OceanBuildError(f"{env}: the PufferLib tree {tree_root} has no "
                              f"pufferlib/ocean/{env}/binding.c")
    check_private_dir(cache, create=True)
    cc = find_compiler()
    flags = [*PUFFER_FLAGS, *GLUE_FLAGS, *placement_flags(cc), *extra_flags]
    raylib = _raylib(ocean.parent.parent)
    key = build_key(env, ocean, cc, flags, raylib)
    out = cache / "builds" / f"{env}-{key[:24]}"
    build = OceanBuild(env, out / f"libenvd_ocean_{env}.so", key)
    with cache_lock(cache):
        if not build.library.is_file():
            (cache / "builds").mkdir(mode=0o700, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache / "builds", prefix=f".{env}-") as tmp:
                tree = Path(tmp)
                _stage(tree, ocean, env)
                _compile(tree, cc, flags, raylib, build.library.name, env)
                staged = tree / "out"
                staged.mkdir()
                (tree / build.library.name).replace(staged / build.library.name)
                shutil.rmtree(out, ignore_errors=True)
                staged.replace(out)
        if record:
            _record(cache, build)
    return build


def build(envs: Sequence[str] = (), source: str | os.PathLike | None = None,
          cache: Path | None = None) -> tuple[list[OceanBuild], dict[str, str]]:
    """Build ``envs`` (default: every env envd has a manifest for); returns
    the builds and, per env that failed, its error in one line."""
    cache = default_cache() if cache is None else Path(cache)
    check_private_dir(cache, create=True)
    compiler_version(find_compiler())  # no compiler: one error, before any download
    with cache_lock(cache):  # builds sharing the cache (Ray nodes on one disk) fetch and
        tree_root = ocean_source.resolve(source, cache)  # extract the source once, in turn
    done, failed = [], {}
    for env in envs or manifest_envs():
        try:
            done.append(build_env(env, tree_root, cache))
        except OceanBuildError as e:
            failed[env] = str(e)
    return done, failed


def installed_builds(cache: Path | None = None) -> dict[str, Path]:
    """The env -> library of the cache's recorded builds, after checking the
    cache is this user's own (0700) and every library lies inside it.  A
    build made by another envd (against another envd.h, or of an env envd no
    longer has a manifest for) is left out, as if not built: loading it
    could crash the process that loads it; `envd ocean build` makes it anew."""
    cache = check_private_dir(default_cache() if cache is None else Path(cache))
    index = cache / INDEX
    if not index.is_file():
        return {}
    out, header, known = {}, header_digest(), set(manifest_envs())
    for env, entry in json.loads(index.read_text()).items():
        if entry.get("envd_h") != header or env not in known:
            continue
        library = (cache / entry["library"]).resolve()
        if cache.resolve() not in library.parents or not library.is_file():
            raise OceanBuildError(f"{index}: the build of {env} lies outside the cache")
        out[env] = library
    return out
