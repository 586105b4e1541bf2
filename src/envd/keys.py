"""CURVE keys of envd: ``envd keygen`` writes them, the daemon and clients load them.

A key pair is two files in pyzmq's certificate format (what
``zmq.auth.create_certificates`` writes and ``zmq.auth.load_certificate``
reads): ``NAME.key`` holds the public key, ``NAME.key_secret`` the public and
the secret key.  The daemon loads its ``.key_secret`` (--curve-secret-key) and
a directory of its clients' public ``.key`` files (--curve-allowed-clients); a
client loads the daemon's public key (a ``.key`` file or its 40-character Z85
text) and its own ``.key_secret``.

Shared by the client and the daemon: imports neither, nor native code.  Every
problem is a KeyFileError (a ValueError) whose message names the file and what
to do about it.
"""
from __future__ import annotations

import datetime
import glob
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

#: A Z85-encoded CURVE key: 32 bytes in 40 characters of the Z85 alphabet.
_Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")

#: Banners of pyzmq's certificate files (zmq/auth/certs.py), so that the files
#: read like the ones zmq.auth.create_certificates writes.
_BANNER = """#   ****  Generated on {now} by envd keygen  ****
#   ZeroMQ CURVE {kind} Certificate
#   {advice}

"""
_PUBLIC_ADVICE = ("Public: hand it to the other side (a client's .key goes into the daemon's\n"
                  "#   --curve-allowed-clients directory; the daemon's .key goes to its clients).")
_SECRET_ADVICE = ("DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions "
                  "(mode 0600).")


class KeyFileError(ValueError):
    """A CURVE key file or directory that cannot be used (see the message)."""


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, each key as 40 bytes of Z85 text (what pyzmq's
    curve_publickey / curve_secretkey socket options take)."""

    public: bytes
    secret: bytes


def _certificate(public: bytes, secret: bytes | None) -> str:
    """The text of a certificate file in pyzmq's format."""
    now = datetime.datetime.now()
    kind, advice = ("**Secret**", _SECRET_ADVICE) if secret else ("Public", _PUBLIC_ADVICE)
    text = _BANNER.format(now=now, kind=kind, advice=advice)
    text += "metadata\ncurve\n"
    text += f'    public-key = "{public.decode()}"\n'
    if secret:
        text += f'    secret-key = "{secret.decode()}"\n'
    return text


def _write_private(path: Path, text: str) -> None:
    """Create path with mode 0600 from the start (O_EXCL: never overwrite, never
    follow a link an attacker planted), so no other user can read it even once."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have taken bits away, never added: be exact
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1  # the file object closes it now
            f.write(text)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)  # no empty or half-written key left behind
        raise


def certificate_text(public: bytes, secret: bytes | None = None) -> str:
    """The text of a key file (public, or public and secret) in pyzmq's format."""
    return _certificate(public, secret)


def write_private(path: str | os.PathLike, text: str) -> None:
    """Create path with mode 0600 and text (never overwrite, never follow a link)."""
    _write_private(Path(path), text)


def generate(out_dir: str | os.PathLike = ".", name: str = "envd") -> tuple[Path, Path]:
    """Write a new key pair as out_dir/name.key (public) and out_dir/name.key_secret
    (secret), both mode 0600; out_dir is created with mode 0700 when missing.
    Returns (public file, secret file).  KeyFileError when name is not a plain
    file name or either file exists (nothing is overwritten)."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise KeyFileError(f"--name must be a plain file name (no '/'), got {name!r}")
    folder = Path(out_dir)
    public_file, secret_file = folder / f"{name}.key", folder / f"{name}.key_secret"
    for path in (public_file, secret_file):
        if os.path.lexists(path):
            raise KeyFileError(f"{path} already exists; envd keygen never overwrites a key "
                               "(other hosts may trust it): pick another --name or --out, or "
                               "remove the old pair first")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    try:
        _write_private(public_file, _certificate(public, None))
    except FileExistsError:  # created meanwhile by someone else
        raise KeyFileError(f"{public_file} already exists; pick another --name or --out") from None
    try:
        _write_private(secret_file, _certificate(public, secret))
    except BaseException as exc:
        public_file.unlink()  # no half pair left behind
        if isinstance(exc, FileExistsError):
            raise KeyFileError(f"{secret_file} already exists; pick another --name or --out") \
                from None
        raise
    return public_file, secret_file


def is_z85_key(text: object) -> bool:
    """Whether text is a 40-character Z85 key (str or bytes)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return False
    if not isinstance(text, str) or not _Z85_KEY.fullmatch(text):
        return False
    try:
        return len(z85.decode(text)) == 32
    except Exception:  # noqa: BLE001 -- a 5-character group above 2**32: not a key
        return False


def _read_certificate(path: str | os.PathLike[str], what: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None) of a certificate file, both checked to be keys."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise KeyFileError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"{what} {path} is not a file")
    public = secret = None
    try:
        with open(path, "rb") as f:
            lines = f.read(1 << 16).splitlines()  # a certificate is a few hundred bytes
    except OSError as exc:
        raise KeyFileError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    # The parsing of zmq.auth.load_certificate, which reads the same files.
    for line in lines:
        line = line.strip()
        if line.startswith(b"#"):
            continue
        if line.startswith(b"public-key") and b"=" in line:
            public = line.split(b"=", 1)[1].strip(b" \t'\"")
        if line.startswith(b"secret-key") and b"=" in line:
            secret = line.split(b"=", 1)[1].strip(b" \t'\"")
    if public is None:
        raise KeyFileError(f"{what} {path} is not a CURVE certificate (no public-key line); "
                           "create keys with `envd keygen`")
    if not is_z85_key(public):
        raise KeyFileError(f"{what} {path}: its public-key is not a 40-character Z85 key")
    if secret is not None and not is_z85_key(secret):
        raise KeyFileError(f"{what} {path}: its secret-key is not a 40-character Z85 key")
    return public, secret


def check_private(path: str | os.PathLike, what: str) -> None:
    """Refuse a secret key file other users may read or change."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise KeyFileError(
            f"{what} {path} holds a secret key but has mode {mode:04o}: other users can read "
            f"or change it; run `chmod 600 {path}` (from a Kubernetes Secret, copy the "
            "key with umask 077 in an init container running as this uid: see "
            "docs/deployment.md)")


def load_key_pair(path: str | os.PathLike, what: str) -> KeyPair:
    """The pair of a .key_secret file (mode 0600 or stricter, both keys
    present and matching).  what names the setting, for the messages."""
    public, secret = _read_certificate(path, what)
    if secret is None:
        raise KeyFileError(f"{what} {path} holds no secret-key: give the .key_secret file "
                           "(the .key file is the public half, for the other side)")
    check_private(path, what)
    if zmq.curve_public(secret) != public:
        raise KeyFileError(f"{what} {path}: its secret-key does not belong to its public-key "
                           "(a damaged file?); create a new pair with `envd keygen`")
    return KeyPair(public, secret)


def load_public_key(value: str | bytes | os.PathLike[str], what: str) -> bytes:
    """A public key given as a certificate file (.key, or a .key_secret whose
    public half is used) or as its 40-character Z85 text."""
    if isinstance(value, (str, bytes)) and is_z85_key(value) and not os.path.exists(value):
        return value.encode("ascii") if isinstance(value, str) else value
    # (a bytes path as text: the messages name the file, not b'...')
    return _read_certificate(os.fsdecode(value) if isinstance(value, bytes) else value, what)[0]


def load_allowed_clients(folder: str | os.PathLike, what: str) -> list[bytes]:
    """The public keys of the *.key files in folder (the files the daemon's
    authenticator reads).  KeyFileError when folder is missing, holds no key,
    or one of its key files cannot be read."""
    if not os.path.isdir(folder):
        raise KeyFileError(f"{what} {folder} is not a directory; it must hold the public "
                           "*.key files of the clients the daemon admits")
    files = sorted(glob.glob(os.path.join(glob.escape(os.fspath(folder)), "*.key")))
    if not files:
        raise KeyFileError(f"{what} {folder} holds no *.key file, so no client could connect; "
                           "copy each client's public .key file (from `envd keygen`) there")
    return [_read_certificate(path, f"{what}: key file")[0] for path in files]


def writable_by_others(path: str | os.PathLike) -> bool:
    """Whether users other than the owner may change path (then they may add
    keys the daemon trusts)."""
    return bool(os.stat(path).st_mode & 0o022)


__all__ = ["KeyFileError", "KeyPair", "generate", "is_z85_key", "load_key_pair",
           "load_public_key", "load_allowed_clients", "check_private", "writable_by_others"]
