"""`envd ocean build` and its cache: the bad cases get one clear line."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envd.native import ocean_build, ocean_source

ENVD = [sys.executable, "-m", "envd"]


def _cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    return cache


def _run(*args, env=None, timeout=600):
    return subprocess.run([*ENVD, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_build_makes_a_private_cache_and_reuses_it(tmp_path, puffer_tree):
    cache = tmp_path / "fresh" / "cache"
    proc = _run("ocean", "build", "--source", str(puffer_tree), "--cache", str(cache), "tetris")
    assert proc.returncode == 0, proc.stderr
    line, = proc.stdout.splitlines()
    assert line.startswith("tetris: built ")
    library = Path(line.split("built ", 1)[1])
    assert cache in library.parents and library.is_file()
    assert (cache.stat().st_mode & 0o777) == 0o700
    assert ocean_build.installed_builds(cache) == {"tetris": library.resolve()}
    stamp = library.stat().st_mtime_ns
    again = _run("ocean", "build", "--source", str(puffer_tree), "--cache", str(cache), "tetris")
    assert again.returncode == 0 and again.stdout == proc.stdout
    assert library.stat().st_mtime_ns == stamp  # the same key: not rebuilt


def test_a_relative_source_path_builds_an_env_that_includes_raylib(tmp_path, puffer_tree):
    """--source given relative to the working directory: pong includes
    raylib.h from the source tree, and the compiler runs in the env's own
    build tree, where the relative path would name nothing."""
    cache = _cache(tmp_path)
    relative = os.path.relpath(puffer_tree, tmp_path)
    proc = subprocess.run([*ENVD, "ocean", "build", "--source", relative, "--cache", str(cache),
                           "pong"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pong: built ")


def test_placement_flags_keep_what_the_compiler_accepts(monkeypatch):
    """A placement flag the compiler warns about or rejects is left out, the
    others kept; a compiler that cannot run gets none (the build then says
    why, as without them)."""
    monkeypatch.setattr(ocean_build, "_accepted", {})
    monkeypatch.setattr(ocean_build, "PLACEMENT_FLAGS",
                        ("-falign-loops=32", "-fenvd-no-such-flag", "-Wenvd-no-such-warning"))
    cc = ocean_build.find_compiler()
    assert ocean_build.placement_flags(cc) == ("-falign-loops=32",)
    assert ocean_build.placement_flags(["/nonexistent/envd-cc"]) == ()


@pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("readelf"),
                    reason="TLS descriptors are the x86-64 build's (readelf reads them)")
def test_an_env_that_draws_reads_its_stream_slot_by_descriptor(ocean_builds):
    """On x86-64 the streams' thread-local slot is reached by TLS descriptor,
    never by a call of __tls_get_addr per rand() (ocean_build's
    PLACEMENT_FLAGS)."""
    library = ocean_builds("enduro")
    relocs = subprocess.run(["readelf", "-rW", str(library)], capture_output=True, text=True,
                            timeout=60).stdout
    assert "R_X86_64_TLSDESC" in relocs
    assert "__tls_get_addr" not in relocs


def test_a_build_of_another_envd_is_never_loaded(tmp_path, puffer_tree):
    """A recorded build made against another envd.h (an unreleased ABI's
    structs may change within its version: such a library crashed a daemon
    started with --ocean all), or of an env envd has no manifest for, is
    left out as if not built; a rebuild records it again."""
    import json
    cache = tmp_path / "cache"
    build = ocean_build.build_env("tetris", puffer_tree, cache)
    index = cache / ocean_build.INDEX
    entries = json.loads(index.read_text())
    assert entries["tetris"]["envd_h"] == ocean_build.header_digest()
    entries["freeway"] = {**entries["tetris"]}  # no manifest any more
    entries["tetris"]["envd_h"] = "0" * 64  # another envd's header
    index.write_text(json.dumps(entries))
    assert ocean_build.installed_builds(cache) == {}
    del entries["tetris"]["envd_h"]  # a record from before the digest
    index.write_text(json.dumps(entries))
    assert ocean_build.installed_builds(cache) == {}
    ocean_build.build_env("tetris", puffer_tree, cache)
    assert ocean_build.installed_builds(cache) == {"tetris": build.library.resolve()}


def test_concurrent_builds_wait_for_each_other(tmp_path, puffer_tree):
    cache = _cache(tmp_path)
    args = [*ENVD, "ocean", "build", "--source", str(puffer_tree), "--cache", str(cache), "pong"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert len({out for out, _ in outs}) == 1
    assert not [p for p in (cache / "builds").iterdir() if p.name.startswith(".")]


def test_no_compiler_is_one_line(tmp_path, puffer_tree):
    env = {"PATH": str(tmp_path / "empty"), "CC": ""}
    proc = _run("ocean", "build", "--source", str(puffer_tree), "--cache",
                str(_cache(tmp_path)), "tetris", env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "envd ocean build: no C compiler found: `envd ocean build` needs one "
        "(install gcc or clang, or set CC)"]


def test_a_compile_error_names_the_env_and_the_first_error(tmp_path, puffer_tree):
    tree = tmp_path / "puffer"
    ocean = ocean_source.ocean_dir(puffer_tree)
    shutil.copytree(ocean / "tetris", tree / "pufferlib" / "ocean" / "tetris")
    shutil.copytree(ocean / "pong", tree / "pufferlib" / "ocean" / "pong")
    shutil.copyfile(ocean / "env_binding.h", tree / "pufferlib" / "ocean" / "env_binding.h")
    raylib = next(puffer_tree.glob("raylib*/include"))
    shutil.copytree(raylib, tree / raylib.relative_to(puffer_tree))
    header = tree / "pufferlib" / "ocean" / "tetris" / "tetris.h"
    header.write_text(header.read_text() + "\nint broken = undeclared_name;\n")
    proc = _run("ocean", "build", "--source", str(tree), "--cache", str(_cache(tmp_path)),
                "tetris", "pong")
    assert proc.returncode == 1
    assert proc.stdout.startswith("pong: built ")  # the other env still builds
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("tetris: does not compile: ")
    assert "undeclared_name" in line and "error" in line


def test_unknown_env_and_missing_source(tmp_path, puffer_tree):
    cache = _cache(tmp_path)
    proc = _run("ocean", "build", "--source", str(puffer_tree), "--cache", str(cache), "nosuch")
    assert proc.returncode == 1
    assert proc.stderr.startswith("unknown Ocean env 'nosuch'; envd builds: breakout,")
    proc = _run("ocean", "build", "--source", str(tmp_path / "nowhere"), "--cache", str(cache))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"envd ocean build: {tmp_path / 'nowhere'}: no such PufferLib tree or sdist"
    proc = _run("ocean", "build", "--source", str(tmp_path), "--cache", str(cache))
    assert proc.returncode == 1 and "not a PufferLib source tree" in proc.stderr


def test_an_sdist_of_another_hash_is_refused(tmp_path):
    fake = tmp_path / ocean_source.SDIST_NAME
    fake.write_bytes(b"not pufferlib")
    proc = _run("ocean", "build", "--source", str(fake), "--cache", str(_cache(tmp_path)))
    assert proc.returncode == 1
    assert f"is not pufferlib {ocean_source.PUFFERLIB_VERSION}'s sdist" in proc.stderr
    assert "refusing to build from it" in proc.stderr


def test_a_cache_others_may_write_or_own_is_refused(tmp_path, puffer_tree):
    cache = _cache(tmp_path)
    cache.chmod(0o770)
    proc = _run("ocean", "build", "--source", str(puffer_tree), "--cache", str(cache), "pong")
    assert proc.returncode == 1 and "must be 0700" in proc.stderr
    link = tmp_path / "link"
    cache.chmod(0o700)
    link.symlink_to(cache)
    with pytest.raises(ocean_build.OceanBuildError, match="must be a folder, not a link"):
        ocean_build.check_private_dir(link)
    if os.getuid() == 0:  # root can hand the folder to another user
        os.chown(cache, 65534, 65534)
        with pytest.raises(ocean_build.OceanBuildError, match="belongs to uid 65534"):
            ocean_build.check_private_dir(cache)


def test_a_recorded_build_outside_the_cache_is_refused(tmp_path, puffer_tree):
    cache = _cache(tmp_path)
    ocean_build.build_env("pong", puffer_tree, cache)
    index = cache / ocean_build.INDEX
    entries = json.loads(index.read_text())
    entries["pong"]["library"] = "../elsewhere.so"
    (tmp_path / "elsewhere.so").write_bytes(b"")
    index.write_text(json.dumps(entries))
    with pytest.raises(ocean_build.OceanBuildError, match="lies outside the cache"):
        ocean_build.installed_builds(cache)


def test_the_sdist_is_fetched_from_the_configured_index_and_checked(tmp_path, monkeypatch):
    """PIP_INDEX_URL's simple JSON API names the file; a download whose sha256
    is not the pinned one is refused and not kept (a loopback index here)."""
    import http.server
    import threading

    body = b"not the sdist"
    listing = json.dumps({"files": [{"filename": ocean_source.SDIST_NAME,
                                     "url": f"/files/{ocean_source.SDIST_NAME}"}]}).encode()
    asked = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            asked.append(self.path)
            data = listing if self.path == "/simple/pufferlib/" else body
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
        downloads = tmp_path / "downloads"
        with pytest.raises(ocean_source.OceanSourceError, match="refusing to build from it"):
            ocean_source.download_sdist(downloads)
    finally:
        server.shutdown()
    assert asked == ["/simple/pufferlib/", f"/files/{ocean_source.SDIST_NAME}"]
    assert list(downloads.iterdir()) == []
