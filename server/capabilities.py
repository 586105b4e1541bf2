"""What this daemon serves, as its ``hello`` reply advertises it.

Clients decide from these once, at connect, instead of trying requests and
reading refusals (docs/protocol.md, "Capabilities"; the client's side is
client/capabilities.py).
"""
from __future__ import annotations

from typing import Any

from envd import _native_facts, protocol
from envd.native._envd_native import lib
from envd.server.config import Config


def hello_capabilities(config: Config, limits: dict[str, int]) -> dict[str, Any]:
    """The ``capabilities`` map of the hello reply: protocol and native ABI
    versions, the features served (the fast path unless --fast-path-sessions
    is 0), and the limits (as the reply's top-level ``limits``).  recv_min:
    recv takes ``min`` and a send is served while a recv waits (what async
    over several daemons needs, client/multi_async.py); max_threads: make
    takes a per-session thread cap; doorbell_layout: the layout of its
    doorbells (native/src/doorbell.h ENVD_DOORBELL_LAYOUT), which a client must share
    to ring them."""
    return {"protocol": protocol.PROTOCOL_VERSION, "abi": int(lib.envd_abi_version()),
            "fast_path": config.fast_path_sessions > 0, "async": True, "inline": True,
            "render": True, "recv_min": True, "max_threads": True,
            "doorbell_layout": _native_facts.DOORBELL_LAYOUT, "limits": limits}
