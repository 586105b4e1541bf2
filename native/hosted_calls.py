"""render, call, get_attr and set_attr on a hosted session's envs
(gymnasium's vector-env methods), run by each worker on its slice.

Control requests only, never per step: each worker has a socket of its own
to the parent (a socketpair end passed at spawn), served by a thread of the
worker while the parent waits for the reply.  The parent sends one only
when no env of the session is in flight or ready (HostedSession.env_call),
so the worker's stepping loop is parked on its futex and never touches an
env at the same time.

Requests and replies are envd.info_codec (msgpack, numpy-aware), never
pickle: what a call returns is any value the info codec carries (a frame is
a uint8 array), and a reply over MAX_REPLY_BYTES encoded is refused (the
worker answers an error instead): a frame or a call's result is bounded as
an info is (SECURITY.md, "Hosted envs").  With num_workers=0 the envs are
the caller's own and run_op runs on them directly, as SyncVectorEnv does.

    (any request may add "max_bytes": a lower bound on its reply)
    request {"op": "render"}                       -> [frame per env]
            {"op": "call", "name", "args", "kwargs"} -> [result per env]
            {"op": "set_attr", "name", "values"}    -> [None per env]
    reply   {"ok": [...]} or {"error": "ExcType: message", "type": "ExcType"}
"""
from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

from envd import info_codec

#: The largest encoded reply of one worker (its envs' frames or call
#: results): 256 MiB, a few hundred 1080p frames.
MAX_REPLY_BYTES = 256 << 20
#: The largest encoded request (call arguments, set_attr values).
MAX_REQUEST_BYTES = 16 << 20
#: The most objects (containers and their items) the daemon decodes from one
#: request of a client or one reply of a worker (info_codec.decode's
#: max_objects): bulk values travel as numpy arrays, one object each.
MAX_CALL_OBJECTS = 1 << 16
#: Methods gymnasium's AsyncVectorEnv refuses to call through call().
NOT_CALLABLE = ("reset", "step", "close", "_setattr", "_check_spaces")

_HEADER = struct.Struct("<Q")


def run_op(envs: Sequence[Any], request: dict[str, Any]) -> list[Any]:
    """The request's result per env, as SyncVectorEnv computes it (envs:
    gymnasium envs, or a PettingZoo env's ParallelRows adapters, whose
    render, get_wrapper_attr and set_wrapper_attr reach the ParallelEnv)."""
    op = request["op"]
    if op == "render":
        return [env.render() for env in envs]
    name = request["name"]
    if not isinstance(name, str):
        raise TypeError(f"an attribute name is a str, not {type(name).__name__}")
    if op == "set_attr":
        for env, value in zip(envs, request["values"], strict=True):
            env.set_wrapper_attr(name, value)
        return [None] * len(envs)
    if op == "call":
        if name in NOT_CALLABLE:
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` "
                             "directly instead.")
        results = []
        for env in envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*request["args"], **request["kwargs"]) if callable(attr)
                           else attr)
        return results
    raise ValueError(f"unknown hosted-env operation {op!r}")


def answer(envs: Sequence[Any], data: bytes) -> bytes:
    """The encoded reply to an encoded request (never raises for the envs'
    doing: their exceptions, a result the codec cannot carry, a reply over
    MAX_REPLY_BYTES, or over the request's "max_bytes" (a daemon's message
    bound), are errors in the reply)."""
    bound = MAX_REPLY_BYTES
    try:
        request = info_codec.decode(data)
        bound = min(bound, int(request.get("max_bytes") or bound))
        reply = info_codec.encode({"ok": run_op(envs, request)})
    except Exception as exc:  # noqa: BLE001 -- the env's own code, or the codec's refusal
        kind = type(exc).__name__
        text = f"{kind}: {exc}"
        if isinstance(exc, TypeError) and str(exc).startswith("a "):  # (info_codec's)
            text = f"TypeError: a result holds {exc}, which msgpack cannot carry"
        return info_codec.encode({"error": text, "type": kind})
    if len(reply) > bound:
        return info_codec.encode({"error": f"ValueError: the reply is {len(reply)} bytes "
                                           f"encoded, over the {bound}-byte bound",
                                  "type": "ValueError"})
    return reply


def send(sock: socket.socket, data: bytes) -> None:
    """One length-prefixed message."""
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, max_bytes: int) -> bytes:
    """One length-prefixed message; ValueError if it says it is over max_bytes
    (the stream is then out of step: the caller drops the socket)."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > max_bytes:
        raise ValueError(f"a {size}-byte message, over the {max_bytes}-byte bound")
    return _recv_exact(sock, size)


def _serve(envs: Sequence[Any], sock: socket.socket) -> None:
    try:
        while True:
            send(sock, answer(envs, recv(sock, MAX_REQUEST_BYTES)))
    except (EOFError, OSError, ValueError):
        return  # the parent closed (or broke the protocol): no more calls
    finally:
        sock.close()


def start_serving(envs: Sequence[Any], fd: int) -> None:
    """Serve the parent's requests on socket fd from a thread of the worker."""
    sock = socket.socket(fileno=fd)
    threading.Thread(target=_serve, args=(envs, sock), daemon=True,
                     name="envd-hosted-calls").start()
