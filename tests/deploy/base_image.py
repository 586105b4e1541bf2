"""Build a Python base image for deploy/Dockerfile where no image registry can be
reached: Debian bookworm from the mirror this machine's apt already uses
(debootstrap), imported into podman.

    python tests/containers/base_image.py NAME      # .ci/run does this once per run

deploy/Dockerfile's default base is python:3.11-slim, pulled from a registry.
Here none is reachable, so CI builds this stand-in and passes it as
``--build-arg PYTHON_IMAGE=NAME``.  What the Dockerfile expects of its base:
``python`` is Python 3.11 with venv and pip, headers for the cffi build, and
apt-get, with which the builder stage installs gcc.  No compiler here, as in
python:3.11-slim: the runtime stage, on this same base, must have none.

The host's CA bundle (pip's ``cert`` setting, else the system bundle) replaces
the base's system bundle, which Debian's pip reads: where the package index is
reached through a TLS-inspecting proxy, pip inside the build then trusts what
pip on the host trusts.  This is a test base only; it never ships.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
#: What the Dockerfile's stages use from their base (see the module docstring).
PACKAGES = ("python3", "python3-venv", "python3-dev", "python3-pip", "python-is-python3",
            "ca-certificates")
SYSTEM_CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"


def debian_mirror(suite: str = SUITE, apt_dir: Path = Path("/etc/apt")) -> str:
    """The URI of the first apt source that serves suite's main component:
    the mirror this machine's apt uses, in deb822 (.sources) or one-line
    (.list) form.  Raises LookupError when there is none."""
    files = [apt_dir / "sources.list"] + sorted((apt_dir / "sources.list.d").glob("*.list"))
    files += sorted((apt_dir / "sources.list.d").glob("*.sources"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = _deb822_fields(stanza)
                if ("deb" in fields.get("Types", "").split()
                        and fields.get("Enabled", "yes").lower() != "no"
                        and suite in fields.get("Suites", "").split()
                        and "main" in fields.get("Components", "").split()):
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 4 and words[0] == "deb" and words[2] == suite \
                        and "main" in words[3:]:
                    return words[1]
    raise LookupError(f"no apt source in {apt_dir} serves {suite} main")


def _deb822_fields(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    last = None
    for line in stanza.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line[0].isspace() and last:
            fields[last] += " " + line.strip()
            continue
        key, sep, value = line.partition(":")
        if sep:
            last = key.strip()
            fields[last] = value.strip()
    return fields


def host_ca_bundle() -> Path:
    """The CA bundle pip on this host trusts: PIP_CERT, pip's `cert` setting,
    else the system bundle."""
    candidates = [os.environ.get("PIP_CERT")]
    done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                          capture_output=True, text=True, check=False)
    candidates.append(done.stdout.strip() if done.returncode == 0 else None)
    candidates.append("/" + SYSTEM_CA_BUNDLE)
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("no CA bundle: set PIP_CERT")


def build(name: str, podman: str = "podman", workdir: Path | None = None) -> float:
    """Build the base as image name (replacing nothing: podman import tags it).
    Returns the seconds it took."""
    start = time.monotonic()
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="envd-base-", dir=workdir) as tmp:
        root = Path(tmp) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                        SUITE, str(root), mirror], check=True, stdout=subprocess.DEVNULL)
        shutil.copyfile(host_ca_bundle(), root / SYSTEM_CA_BUNDLE)
        # A base image carries no package lists or caches (as python:3.11-slim).
        for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / folder).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run([podman, "import", "--change", "CMD [\"python3\"]", "-", name],
                       stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
        tar.stdout.close()
        if tar.wait() != 0:
            raise subprocess.CalledProcessError(tar.returncode, "tar")
    return time.monotonic() - start


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} IMAGE_NAME")
    seconds = build(sys.argv[1])
    print(f"base image {sys.argv[1]} ({SUITE} from {debian_mirror()}) built in {seconds:.0f} s")
