"""PufferLib's source for the Ocean envs: a tree on disk, or its pinned sdist.

``envd ocean build`` compiles each Ocean env's own ``binding.c`` from
PufferLib's source and never runs PufferLib's ``setup.py`` (it downloads from
the web).  The source is, in order of preference: a PufferLib tree the user
names (a checkout, or an extracted sdist: the folder holding ``pufferlib/``),
an sdist file the user names, the ``ENVD_OCEAN_SOURCE`` variable (either), or
the pinned sdist fetched from the package index into the cache, its sha256
checked before it is opened.
"""
from __future__ import annotations

import hashlib
import json
import os
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

from envd.errors import EnvdError

PUFFERLIB_VERSION = "3.0.0"
SDIST_NAME = f"pufferlib-{PUFFERLIB_VERSION}.tar.gz"
SDIST_SHA256 = "7df3a3e3f5f894d78d2a1f5374097890aec01473183e748abefe4f3faa10eaa9"
SDIST_BYTES = 60_681_266
# PyPI's own address of the file (its JSON API names the same one).
SDIST_URL = ("https://files.pythonhosted.org/packages/7c/e1/"
             "5292f9b69c6263707b40ba04a87e6b9bcc177281d31092f77afd90c412f1/" + SDIST_NAME)
SOURCE_ENV = "ENVD_OCEAN_SOURCE"


class OceanSourceError(EnvdError):
    """PufferLib's source cannot be found, fetched or trusted."""


def ocean_dir(tree: Path) -> Path:
    """The ``pufferlib/ocean`` folder of a PufferLib tree, or OceanSourceError."""
    for candidate in (tree / "pufferlib" / "ocean", tree / "ocean", tree):
        if (candidate / "env_binding.h").is_file():
            return candidate
    raise OceanSourceError(
        f"{tree}: not a PufferLib source tree (no pufferlib/ocean/env_binding.h)")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path) -> Path:
    got = sha256_of(path)
    if got != SDIST_SHA256:
        raise OceanSourceError(
            f"{path}: sha256 {got} is not pufferlib {PUFFERLIB_VERSION}'s sdist "
            f"({SDIST_SHA256}); refusing to build from it")
    return path


def _index_url() -> str:
    """pip's configured index (PIP_INDEX_URL), else PyPI's simple API."""
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def _sdist_url() -> str:
    """The sdist's address on the configured index (PyPI: the pinned URL)."""
    index = _index_url()
    if urllib.parse.urlparse(index).netloc in ("pypi.org", "pypi.python.org"):
        return SDIST_URL
    request = urllib.request.Request(f"{index}/pufferlib/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        files = json.load(reply).get("files", [])
    for entry in files:
        if entry.get("filename") == SDIST_NAME:
            return urllib.parse.urljoin(f"{index}/pufferlib/", entry["url"])
    raise OceanSourceError(f"the index {index} lists no {SDIST_NAME}")


def download_sdist(downloads: Path) -> Path:
    """The pinned sdist in ``downloads`` (fetched once, sha256 checked)."""
    target = downloads / SDIST_NAME
    if target.is_file():
        return _verified(target)
    downloads.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = downloads / (SDIST_NAME + ".part")
    try:
        url = _sdist_url()
        with urllib.request.urlopen(url, timeout=120) as reply, open(partial, "wb") as out:
            while block := reply.read(1 << 20):
                out.write(block)
                if out.tell() > SDIST_BYTES:
                    raise OceanSourceError(f"{url}: larger than the pinned sdist")
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise OceanSourceError(f"cannot fetch {SDIST_NAME} from the package index: {e}; "
                               "give a PufferLib tree or sdist with --source") from None
    try:
        _verified(partial)
    except OceanSourceError:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return target


def _safe_members(tar: tarfile.TarFile, prefix: str) -> list[tarfile.TarInfo]:
    """The sdist's regular files and folders under ``prefix``, none escaping it."""
    members = []
    for member in tar.getmembers():
        name = member.name
        if not name.startswith(prefix) or name.startswith("/") or ".." in name.split("/"):
            continue
        if member.isfile() or member.isdir():
            members.append(member)
    return members


def extract_sdist(sdist: Path, into: Path) -> Path:
    """The tree of a verified sdist, extracted once under ``into`` (by hash)."""
    _verified(sdist)
    # (named for what is extracted: a tree extracted without PufferLib's
    # config files, which `envd bench --ocean` reads, is left alone)
    root = into / f"{SDIST_SHA256[:16]}-config"
    top = root / f"pufferlib-{PUFFERLIB_VERSION}"
    if (top / "pufferlib" / "ocean" / "env_binding.h").is_file():
        return top
    partial = into / f"{root.name}.part"
    into.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tarfile.open(sdist, "r:gz") as tar:
        # the Ocean envs, raylib (its headers for the build; its library and
        # PufferLib's pufferlib.py and spaces.py for the tests' reference),
        # the envs' configs (their num_envs: `envd bench --ocean`)
        top_name = f"pufferlib-{PUFFERLIB_VERSION}/"
        wanted = [top_name + p for p in ("pufferlib/ocean/", "pufferlib/pufferlib.py",
                                         "pufferlib/spaces.py", "pufferlib/config/ocean/",
                                         "raylib-5.5_linux_amd64/", "LICENSE")]
        members = [m for prefix in wanted for m in _safe_members(tar, prefix)]
        if hasattr(tarfile, "data_filter"):  # the members are checked above either way
            tar.extractall(partial, members=members, filter="data")
        else:
            tar.extractall(partial, members=members)
    partial.replace(root)
    return top


def resolve(source: str | os.PathLike | None, cache: Path) -> Path:
    """The PufferLib tree to build from: ``source`` (a tree or an sdist file),
    else ``$ENVD_OCEAN_SOURCE``, else the pinned sdist from the index."""
    given = source if source is not None else os.environ.get(SOURCE_ENV) or None
    if given is not None:
        # (absolute: the compiler runs inside each env's build tree, where a
        # relative path to the source's raylib headers would not resolve)
        path = Path(given).expanduser().resolve()
        if path.is_dir():
            ocean_dir(path)
            return path
        if path.is_file():
            return extract_sdist(path, cache / "src")
        raise OceanSourceError(f"{path}: no such PufferLib tree or sdist")
    return extract_sdist(download_sdist(cache / "downloads"), cache / "src")
