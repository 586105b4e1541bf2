"""Who may talk to whom: the client's CURVE options and the reading of a
failed handshake.

A tcp daemon started with CURVE keys (SECURITY.md) admits only clients that
know its public key and whose own public key it lists.  This module turns
connect's server_key / client_key (or ENVD_SERVER_KEY / ENVD_CLIENT_KEY) into
socket options, and turns the socket monitor's handshake events into an
AuthenticationError a user can act on, asking the daemon which mechanism it
speaks (a ZMTP greeting probe) where libzmq's event is ambiguous.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import zmq

from envd import keys
from envd.errors import AuthenticationError, InvalidArgumentError

#: What a client's monitor reports: a broken connection, and the ways a
#: handshake fails (which events each CURVE mistake gives: see handshake_error).
MONITOR_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                  | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def curve_options(endpoint: str, server_key: Any, client_key: Any) -> dict[int, bytes]:
    """The CURVE socket options for endpoint: empty without keys and for ipc
    endpoints (the daemon serves those without CURVE; keys are ignored there).
    A tcp endpoint with keys needs both: the daemon admits only the client
    keys it lists, so a made-up pair would never get in."""
    names = {"server_key": "server_key", "client_key": "client_key"}
    if server_key is None and os.environ.get("ENVD_SERVER_KEY"):
        server_key, names["server_key"] = os.environ["ENVD_SERVER_KEY"], "ENVD_SERVER_KEY"
    if client_key is None and os.environ.get("ENVD_CLIENT_KEY"):
        client_key, names["client_key"] = os.environ["ENVD_CLIENT_KEY"], "ENVD_CLIENT_KEY"
    if not endpoint.startswith("tcp://") or (server_key is None and client_key is None):
        return {}
    if server_key is None or client_key is None:
        given, missing = (("server_key", "client_key") if client_key is None
                          else ("client_key", "server_key"))
        raise InvalidArgumentError(
            f"CURVE needs both keys, got {names[given]} without {missing} (or ENVD_"
            f"{missing.upper()}): server_key is the daemon's public .key file (or its 40-"
            "character text), client_key this client's .key_secret file, whose .key must be "
            "in the daemon's --curve-allowed-clients directory; create a pair with "
            "`envd keygen`")
    if not isinstance(server_key, (str, bytes, os.PathLike)):
        raise InvalidArgumentError("server_key must be a path (str or os.PathLike) or the "
                                   "daemon's 40-character Z85 public key (str or bytes), got "
                                   f"a {type(server_key).__name__}")
    if not isinstance(client_key, (str, os.PathLike)):
        raise InvalidArgumentError("client_key must be the path (str or os.PathLike) of this "
                                   f"client's .key_secret file, got a {type(client_key).__name__}")
    try:
        server = keys.load_public_key(server_key, names["server_key"])
        pair = keys.load_key_pair(client_key, names["client_key"])
    except keys.KeyFileError as exc:
        raise InvalidArgumentError(str(exc)) from None
    return {zmq.CURVE_SERVERKEY: server, zmq.CURVE_PUBLICKEY: pair.public,
            zmq.CURVE_SECRETKEY: pair.secret}


#: The start of a ZMTP 3 greeting: signature and major version.  A libzmq
#: peer answers it with its whole greeting, which names its mechanism.
_ZMTP3_GREETING_START = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03"


#: How long the probe waits to see whether the daemon hangs up on it.
_PROBE_HANG_UP_S = 0.5


def daemon_mechanism(endpoint: str, timeout: float) -> bytes | None:
    """The security mechanism (b"CURVE", b"NULL") the ZeroMQ socket at a tcp
    endpoint announces in its ZMTP greeting; None when it cannot be told.

    Sending the greeting's first 11 bytes only, then hanging up, keeps the
    daemon from seeing a mechanism to refuse: it sends its full 64-byte
    greeting (mechanism at bytes 12-31) and then just sees a peer leave."""
    if not endpoint.startswith("tcp://"):
        return None  # ipc: no CURVE, and nothing to probe
    address = endpoint[len("tcp://"):].rpartition(";")[2]  # tcp://source;host:port
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as probe:
            probe.sendall(_ZMTP3_GREETING_START)
            greeting = b""
            while len(greeting) < 64:
                chunk = probe.recv(64 - len(greeting))
                if not chunk:
                    break
                greeting += chunk
            # A daemon at its --max-connections greets, then hangs up on
            # every new connection: that says nothing about keys.
            probe.settimeout(_PROBE_HANG_UP_S)
            try:
                if probe.recv(1) == b"":
                    return None
            except TimeoutError:
                pass
    except (OSError, ValueError):
        return None
    if len(greeting) < 32 or greeting[0] != 0xFF or greeting[10] < 3:
        return None
    return greeting[12:32].rstrip(b"\x00")


def handshake_error(event: Mapping[str, Any], endpoint: str, curve: Mapping[int, bytes],
                    timeout: float) -> AuthenticationError | None:
    """The error of a failed handshake the monitor reported, or None for an
    event that says nothing about keys.  What a client sees with libzmq 4.3:
      - its key is not in --curve-allowed-clients: HANDSHAKE_FAILED_AUTH
        (the ZAP handler's status 400), and libzmq gives up;
      - a wrong server key: HANDSHAKE_FAILED_NO_DETAIL (the daemon cannot
        decrypt the HELLO and hangs up: EPIPE), again at every retry;
      - CURVE on one side only: HANDSHAKE_FAILED_PROTOCOL with
        ZMTP_MECHANISM_MISMATCH, but as often NO_DETAIL first (the daemon
        hangs up before its greeting reaches the client), and sometimes
        only NO_DETAILs for several retries;
      - a daemon at its --max-connections: NO_DETAIL, and no greeting for
        the probe either (it hangs up on every new connection until a
        slot frees): not a key problem, so libzmq retries.
    So AUTH and the mismatch are answers, while a NO_DETAIL is ambiguous:
    then daemon_mechanism asks the daemon whether it speaks CURVE.  Each
    event comes before the DISCONNECTED of the same attempt: raising at
    the first makes the rejection fast."""
    kind, value = event["event"], event["value"]
    if kind not in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
        return None
    mechanism: bytes | None
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        mechanism = b"CURVE" if curve else b"NULL"
    elif value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        mechanism = b"NULL" if curve else b"CURVE"
    else:
        mechanism = daemon_mechanism(endpoint, min(timeout, 5.0))
        if mechanism is None:
            # No greeting at all: the daemon hung up at once, as it does
            # for a connection over its --max-connections; libzmq
            # retries, and the request's timeout bounds the wait.
            return None
    where = f"the daemon at {endpoint}"
    if not curve:
        if mechanism == b"CURVE":
            return AuthenticationError(
                f"{where} requires CURVE authentication: pass server_key= (the daemon's "
                "public .key file) and client_key= (this client's .key_secret file, whose "
                ".key must be in the daemon's --curve-allowed-clients directory) to "
                "envd.connect, or set ENVD_SERVER_KEY and ENVD_CLIENT_KEY (`envd status "
                "--server-key --client-key`); create a pair with `envd keygen`")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH and endpoint.startswith("ipc://"):
            return AuthenticationError(
                f"{where} refused this process's user (uid {os.geteuid()}; ZAP status "
                f"{value}): it admits only the uids of its --ipc-allowed-uids (by default "
                "its own user and root); run the trainer as the daemon's user, or start "
                "the daemon with --ipc-allowed-uids listing this uid")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return AuthenticationError(f"{where} refused this client (ZAP status {value})")
        return None  # a connection that broke during the handshake: libzmq retries
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        public = curve[zmq.CURVE_PUBLICKEY].decode()
        return AuthenticationError(
            f"{where} refused this client's CURVE key {public} (status {value}): that "
            "public key must be in a .key file in the daemon's --curve-allowed-clients "
            "directory (copy this client's .key file there and restart the daemon), and "
            "client_key (ENVD_CLIENT_KEY) must be this client's .key_secret file")
    if mechanism == b"NULL":
        return AuthenticationError(
            f"{where} does not use CURVE (it runs without --curve-secret-key), but this "
            "client gave keys: connect without server_key/client_key (unset "
            "ENVD_SERVER_KEY and ENVD_CLIENT_KEY), or restart the daemon with keys")
    check = ("check that server_key (ENVD_SERVER_KEY) is the daemon's public key: the "
             ".key file `envd keygen` wrote next to the daemon's --curve-secret-key file")
    if mechanism == b"CURVE":
        return AuthenticationError(f"{where} uses CURVE but hung up during the handshake, "
                                   f"as it does for a wrong server key; {check}")
    return AuthenticationError(f"the CURVE handshake with {where} failed; {check}, and "
                               "that the daemon runs with --curve-secret-key")
