"""Reading a daemon's capabilities from its hello reply (client/capabilities.py)."""
from __future__ import annotations

import pytest

from envd import protocol
from envd.client.capabilities import Capabilities
from envd.errors import ProtocolError

LIMITS = {"max_message_bytes": 1 << 20, "max_sessions": 8}


def hello(**capabilities):
    wire = {"protocol": protocol.PROTOCOL_VERSION, "abi": 3, "fast_path": True, "async": True,
            "inline": True, "render": False, "limits": LIMITS, **capabilities}
    return {"ok": True, "version": protocol.PROTOCOL_VERSION, "limits": {"max_sessions": 1},
            "capabilities": wire}


def test_advertised_capabilities_are_read_as_given():
    caps = Capabilities.from_hello(hello())
    assert caps.advertised
    assert (caps.protocol, caps.abi) == (protocol.PROTOCOL_VERSION, 3)
    assert (caps.fast_path, caps.async_mode, caps.inline, caps.render) == (True, True, True, False)
    assert caps.limits == LIMITS  # the capabilities' limits, not the top-level ones
    assert not caps.recv_min  # optional (younger than the others): absent reads as false
    assert Capabilities.from_hello(hello(recv_min=True)).recv_min
    assert not caps.max_threads  # optional: a daemon that does not name it does not serve it
    assert Capabilities.from_hello(hello(max_threads=True)).max_threads
    assert caps.doorbell_layout == 1  # optional: absent is the layout before the field
    assert Capabilities.from_hello(hello(doorbell_layout=2)).doorbell_layout == 2


def test_a_hello_without_capabilities_gets_the_documented_fallback():
    old = {"ok": True, "version": 2, "limits": LIMITS}
    caps = Capabilities.from_hello(old)
    assert not caps.advertised
    assert not caps.fast_path  # never tried on such a daemon
    assert caps.async_mode and caps.inline and caps.render
    assert not caps.max_threads  # such a daemon would ignore make's max_threads
    assert caps.limits == LIMITS and caps.protocol == 2 and caps.abi is None


@pytest.mark.parametrize("bad, match", [
    ({"capabilities": []}, "of type list"),
    (hello(fast_path=1), "'fast_path' as 1"),
    (hello(recv_min="yes"), "'recv_min' as 'yes'"),
    (hello(**{"async": None}), "'async' as None"),
    (hello(max_threads="yes"), "'max_threads' as 'yes'"),
    (hello(doorbell_layout="2"), "'doorbell_layout' as '2'"),
    (hello(doorbell_layout=True), "'doorbell_layout' as True"),
    (hello(protocol="2"), "protocol '2'"),
    (hello(abi=True), "abi True"),
    (hello(limits={"max_sessions": "many"}), "limits"),
    (hello(limits=[1]), "limits"),
])
def test_malformed_capabilities_are_a_protocol_error(bad, match):
    with pytest.raises(ProtocolError, match=match):
        Capabilities.from_hello(bad)
