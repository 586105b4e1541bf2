"""What a daemon serves, as its ``hello`` reply advertises it.

The client decides from these, once at connect, instead of trying a feature
and reading the refusal (docs/protocol.md, "Capabilities"): whether to ask
for the fast path, whether async mode, the inline transport and rendering can
be asked for, and the limits it must keep to (the message size).

A daemon older than the field (its hello has no ``capabilities``) is read
with the fallback ``Capabilities.legacy``: the features every daemon of
protocol 2 serves (async mode, the inline transport, rendering) and no fast
path, which such a daemon cannot be asked for without the trial and error
this replaces; its limits come from the hello's top-level ``limits``.

Features added later are optional in the map: a daemon that does not name
one does not serve it (``max_threads``, the per-session thread cap of make:
a client does not send it to such a daemon, which would ignore the field).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

from envd.errors import ProtocolError

#: The boolean features a hello's capabilities name (wire key -> attribute).
_FEATURES = {"fast_path": "fast_path", "async": "async_mode", "inline": "inline",
             "render": "render"}
#: Features a daemon may leave out of its capabilities (older daemons): absent is False.
_OPTIONAL_FEATURES = {"max_threads": "max_threads"}


@dataclass(frozen=True)
class Capabilities:
    """The features and limits of one daemon."""

    #: the protocol version the daemon speaks (envd.protocol.PROTOCOL_VERSION)
    protocol: int
    #: the daemon's native ABI version (native/include/envd.h); None: not said
    abi: int | None
    #: it serves steps, sends and recvs from a doorbell in shared memory
    fast_path: bool
    #: it serves async mode (make with batch_size < num_envs, send/recv)
    async_mode: bool
    #: it sends the arrays over the socket for clients that cannot map its segments
    inline: bool
    #: it renders rgb_array frames (make with render_mode)
    render: bool
    #: recv takes ``min`` and sends are served while a recv waits (async
    #: mode over several daemons needs it); False when not said (older daemons)
    recv_min: bool = False
    #: make takes max_threads, a per-session thread cap (optional: absent is False)
    max_threads: bool = False
    #: the layout of its doorbells (native/src/doorbell.h ENVD_DOORBELL_LAYOUT; absent:
    #: 1, the layout of the daemons older than the field); the client rings
    #: only a doorbell of its own layout
    doorbell_layout: int = 1
    #: its limits (max_message_bytes, max_sessions, ...: see docs/protocol.md)
    limits: dict[str, int] = field(default_factory=dict)
    #: False: the daemon sent none, these are the fallback's (see the module docstring)
    advertised: bool = True

    @classmethod
    def from_hello(cls, reply: dict[str, Any]) -> Capabilities:
        """The capabilities of a hello reply; the fallback when it has none.
        ProtocolError when they are malformed (a daemon that is not envd)."""
        wire = reply.get("capabilities")
        if wire is None:
            return cls.legacy(reply)
        if not isinstance(wire, dict):
            raise ProtocolError(f"the daemon's hello carries capabilities of type "
                                f"{type(wire).__name__}; expected a map")
        flags = {}
        for key, name in _FEATURES.items():
            value = wire.get(key)
            if not isinstance(value, bool):
                raise ProtocolError(f"the daemon's hello capabilities give {key!r} as "
                                    f"{value!r}; expected true or false")
            flags[name] = value
        for key, name in _OPTIONAL_FEATURES.items():
            value = wire.get(key, False)
            if not isinstance(value, bool):
                raise ProtocolError(f"the daemon's hello capabilities give {key!r} as "
                                    f"{value!r}; expected true or false")
            flags[name] = value
        version, abi, limits = wire.get("protocol"), wire.get("abi"), wire.get("limits", {})
        if not _is_int(version) or not (abi is None or _is_int(abi)):
            raise ProtocolError(f"the daemon's hello capabilities give protocol {version!r} "
                                f"and abi {abi!r}; expected ints")
        if not isinstance(limits, dict) or not all(
                isinstance(k, str) and _is_int(v) for k, v in limits.items()):
            raise ProtocolError("the daemon's hello capabilities give limits that are not a "
                                "map of names to ints")
        recv_min = wire.get("recv_min", False)  # (optional: younger than the others)
        if not isinstance(recv_min, bool):
            raise ProtocolError(f"the daemon's hello capabilities give 'recv_min' as "
                                f"{recv_min!r}; expected true or false")
        layout = wire.get("doorbell_layout", 1)  # (optional: younger than the others)
        if not _is_int(layout):
            raise ProtocolError(f"the daemon's hello capabilities give 'doorbell_layout' as "
                                f"{layout!r}; expected an int")
        return cls(protocol=version, abi=abi, limits=dict(limits), recv_min=recv_min,
                   doorbell_layout=layout, **flags)

    @classmethod
    def legacy(cls, reply: dict[str, Any]) -> Capabilities:
        """What a daemon without the capabilities field is taken to serve."""
        limits = reply.get("limits")
        version = reply.get("version")
        return cls(protocol=version if _is_int(version) else 0, abi=None, fast_path=False,
                   async_mode=True, inline=True, render=True,
                   limits=dict(limits) if isinstance(limits, dict) else {}, advertised=False)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
