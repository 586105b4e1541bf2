"""The envd wire protocol: the one definition both the daemon and the client import.

Transport
---------
The daemon binds one ZeroMQ ROUTER socket; a client connects a DEALER socket
whose routing id it picks at random (16 bytes).  Requests and replies are
multipart messages::

    client -> daemon   [header]            [blob 0] [blob 1] ...
    daemon sees        [routing id] [header] [blob 0] [blob 1] ...
    daemon -> client   [routing id] [header] [blob 0] ...   (ROUTER strips the id)

``header`` is one msgpack map (binary and str types kept apart, no ext types)
of at most --max-header-bytes, MAX_HEADER_DEPTH deep (checked by scan()
before anything is decoded).
``blob i`` are raw array bytes, only where a message says so (e.g. ``step``
with inline actions); arrays never travel inside msgpack and nothing is
pickled.  A frame count the message type does not expect is a bad request.

Requests
--------
Every request header has ``"type"`` (str) and ``"id"`` (int, chosen by the
client, echoed in the reply; ids need not be unique: the daemon keeps no
record of them, and a request sent twice runs twice).  Every request the
daemon reads gets exactly one reply, also after SIGTERM (``shutting_down``).
``hello`` must come first on a connection and carries ``"version"``; the daemon answers ``unsupported_version`` when it
does not speak it.  Per type, the fields (``?`` = optional):

    hello      version:int, client_name?:str
    heartbeat  client?:bin          (keeps that client's lease; default: the sender)
    list_envs  -
    status     -
    make       env_id:str, num_envs:int, seed?:int|[int]|blob|nil, autoreset_mode?:str,
               max_episode_steps?:int|nil, env_kwargs?:map, batch_size?:int|nil,
               render_mode?:str|nil, max_threads?:int|nil, num_workers?:int|nil,
               info_bytes?:int|nil
               (a per-env list, seed or a kwarg's values, may be a blob
               reference {blob:int, dtype:str}: list_to_blob; each field's
               bound and the env kinds that take it are defined once in
               envd.make_options, which the daemon checks them with; max_threads: at most that
               many of the daemon's pool threads step the session's envs at
               once, 0 = inline on the thread serving the call, nil or absent
               = no cap; an int in [0, the daemon's --threads], else
               invalid_argument.  A client sends it only to a daemon whose
               hello capabilities say max_threads: true.  num_workers and
               info_bytes: hosted "py:" ids only, which refuse max_threads)
    reset      session:str, seeds?:bool, mask?:bool, inline?:bool, async?:bool
               (seeds / mask: read the "reset_seeds" / "reset_mask" arrays of
               the session's shared memory, written by the client; inline:
               blob 0 / 1 hold them instead, the whole arrays.  async: true is
               async_reset: wait for the envs in flight, drop their results,
               reset every env and make them all ready for recv, in env
               order; takes no mask, and its inline reply carries no arrays:
               the recvs that follow carry the rows)
    step       session:str, actions?:{dtype:str, shape:[int]}, inline?:bool
               (actions given: blob 0 holds them, C order, exactly that dtype
               and shape; else the client wrote the "actions" array in shm)
    send       session:str, inline?:bool   blob 0: env ids (int64); async mode:
                                start stepping them with the actions the client wrote
                                in their shm rows (inline: blob 1 holds those rows, in
                                the order of the ids)
    recv       session:str, count:int, min?:int, inline?:bool   async mode: answer once at
                                least min (default: count) sent envs are ready; blob 0:
                                the oldest ready ids (int64), as many as are ready then
                                but at most count (exactly count without min; the rest
                                stay ready).  A send of the same session is served while
                                a recv waits (async over several daemons: client/multi_async.py)

Inline transport (remote sessions)
----------------------------------
A client that cannot map the session's segment (another host, another IPC
namespace, another user: found at make time by trying) sets ``inline: true``
on reset, step, send and recv.  It sends what it would have written to shared
memory as blobs (above), and the reply carries what it would have read there:
``arrays: [name, ...]`` names the output arrays (every array of the make
reply's layout but the inputs "actions", "reset_seeds" and "reset_mask", in
layout order) and one blob follows per name, C order, the layout's dtype:
the whole arrays after reset and step, the rows of the reported envs (in the
order of the ids in blob 0) after recv.  The daemon's buffers stay a segment
either way, so both transports run the very same native code on the same
memory: results are bit-identical.
    render     session:str      (a session made with render_mode "rgb_array", no send in
                                flight: draw every env's frame; refused with
                                limit_exceeded when the frames are over --max-message-bytes)
    env_call   session:str      (a hosted session: call, get_attr or set_attr on its envs
                                in its workers, gymnasium's AsyncVectorEnv methods; blob 0:
                                the request, envd.info_codec-encoded (msgpack, numpy-aware,
                                never pickle): {op: "call", name, args: [], kwargs: {}} or
                                {op: "set_attr", name, values: [one per env]}; no send in
                                flight; bounded by --hosted-timeout and, the results, by
                                --max-message-bytes)
    close      session:str
    bye        -                (the client leaves: free all its sessions now)
    fast       session:str, enable?:bool   serve this sync session's steps from the
                                doorbell in its shared-memory header from now on (the
                                same-host fast path, docs/architecture.md); step, send
                                and recv over the socket are refused meanwhile.
                                enable: false stops it (the client does before async
                                calls)

Unread replies: tokens and acks
-------------------------------
ZeroMQ never tells the daemon that a peer consumed a reply, so the daemon
asks for a receipt.  Every reply whose frames add up to more than
``SMALL_REPLY_BYTES`` carries ``"token"``, a random 64-bit int; the client
names in every later request (optional ``"ack": int`` field, any request
type) the token of the last such reply it has read.  Replies arrive in the
order they were sent, so that acknowledges that reply and every reply before
it; a token cannot be guessed, so a client cannot acknowledge a reply it has
not received.  The daemon keeps, per connection, the bytes of the large
replies not acknowledged yet: over --max-reply-bytes-per-client (or all
connections' over --max-reply-bytes) a request is refused with
``limit_exceeded``, and a large reply that would cross the budget is replaced
by a small ``limit_exceeded`` error (the request ran; its results were not
sent).  Small replies need no ack: the daemon's ROUTER socket queues at most
``REPLY_QUEUE`` messages per peer, and a client whose queue is full (it reads
no replies) is dropped: its sessions are freed and every later request from
that connection gets ``connection_lost``.  A client therefore reads its
replies: the official client posts at most ``POSTED_WINDOW`` requests (async
``send``) without reading their replies.

Replies
-------
``{"id": <request id>, "ok": true, ...result}`` or
``{"id": <request id or nil>, "ok": false, "code": <ERROR_CODES key>,
"message": <str for a human>}`` (plus ``"native_code"`` for code ``native``).
A reply never carries a traceback.  Results:

    hello      version, server, pid, hostname, lease_timeout, heartbeat_interval,
               limits: {max_sessions, max_envs_per_client, max_message_bytes,
                        max_header_bytes, max_sessions_per_client, max_shm_bytes, max_state_bytes,
                        max_requests_per_second, request_burst}   (0 rate and burst: unthrottled)
               capabilities: {protocol:int, abi:int, fast_path:bool, async:bool,
                              inline:bool, render:bool, limits}   (what the daemon
                              serves; a client reads it instead of trying requests:
                              docs/protocol.md, "Capabilities")
    heartbeat  -
    list_envs  envs: [{id, observation_space, action_space, max_episode_steps, params,
                       info_fields: [{name, dtype, shape, doc}], origin,
                       describes, resets_itself, episode_fields}]   (ABI 5: spaces
                       at the defaults when describes)
    status     see envd.server.service.Service.status
    make       session, env_id, shm: {name, size, arrays: {name: [offset, dtype, shape]}},
               observation_space, action_space, max_episode_steps, autoreset_mode,
               render_mode, render_fps (nil for an env that cannot render),
               resets_itself, episode_fields (ABI 5; absent from older daemons: false, [])
    reset      - (inline: arrays + blobs)
    step       num_done:int   (envs whose episode ended in this step; inline: arrays + blobs)
    send       -
    recv       - (the ids in blob 0; their results are in the shm rows; inline: arrays +
                 blobs after blob 0)
    render     frames: {dtype: "uint8", shape: [num_envs, height, width, 3]};
               blob 0: the frames, C order (a large reply: it carries a token)
    env_call   blob 0: the per-env results, envd.info_codec-encoded (a list)
    close      -
    bye        -
    fast       doorbell: {offset}   (where the doorbell lies in the header page)

Spaces travel as msgpack maps (envd.leaves.space_to_wire; docs/protocol.md,
"Spaces"): ``{"kind": "box", "dtype", "shape", "low", "high"}`` (bounds as
nested lists in the box's dtype), ``{"kind": "discrete", "n", "start"}``,
``{"kind": "multi_discrete", "dtype", "nvec", "start"}``,
``{"kind": "multi_binary", "n": [int]}``, ``{"kind": "dict", "spaces":
[[key, space], ...]}`` (in the Dict's order) and ``{"kind": "tuple",
"spaces": [space, ...]}``.

Sessions and leases
-------------------
A session (one ``make``) belongs to the connection that made it.  Any request
from that connection, a ``heartbeat`` naming it, or a request served through
the doorbell of one of its fast-path sessions (seen at the daemon's lease
tick) renews its lease; after
``lease_timeout`` seconds of silence the daemon frees all its sessions and
later requests for them get ``session_expired``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np
from gymnasium import spaces

from envd import _native_facts, errors, leaves

#: 2: replies over SMALL_REPLY_BYTES carry "token", requests may carry "ack".
PROTOCOL_VERSION = 2
#: A reply larger than this (all frames) carries a token the client acks;
#: smaller ones (every error: MAX_ERROR_MESSAGE) are bounded by their count
#: (REPLY_QUEUE) instead.
SMALL_REPLY_BYTES = 4 << 10
#: Messages the daemon's ROUTER queues per peer (its ZMQ_SNDHWM, libzmq's
#: default made explicit); a peer that leaves more unread in the daemon is
#: dropped.  Not smaller: the event loop answers a burst of pipelined
#: requests faster than libzmq's I/O thread (which the loaded CPUs may not
#: run for milliseconds) empties the queue, and a queue of 64 overflowed so
#: for clients that read every reply.
REPLY_QUEUE = 1000
#: Requests the official client posts without reading their replies (its
#: window for async sends); well under REPLY_QUEUE.
POSTED_WINDOW = 32
#: Longest error message the daemon sends, in UTF-8 bytes (longer ones are
#: cut): every error reply stays under SMALL_REPLY_BYTES.
MAX_ERROR_MESSAGE = 2000


def default_endpoint(environ: Mapping[str, str] | None = None) -> str:
    """ENVD_ENDPOINT, else an ipc socket in $XDG_RUNTIME_DIR, else in /tmp/envd-$UID/
    (variables from environ, default os.environ)."""
    environ = os.environ if environ is None else environ
    endpoint = environ.get("ENVD_ENDPOINT")
    if endpoint:
        return endpoint
    runtime = environ.get("XDG_RUNTIME_DIR")
    folder = runtime if runtime and os.path.isdir(runtime) else f"/tmp/envd-{os.getuid()}"
    return f"ipc://{folder}/envd.sock"


#: Message types a daemon accepts, each with its fields: name -> (allowed
#: types, required).  bool is never accepted where int is asked for.
_INT = (int,)
_ANY = (object,)  # checked by the handler, whose errors match envd.make's
_SESSION: dict[str, tuple[tuple[type, ...], bool]] = {"session": ((str,), True)}
MESSAGE_FIELDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "hello": {"version": (_INT, True), "client_name": ((str,), False)},
    "heartbeat": {"client": ((bytes,), False)},
    "list_envs": {},
    "status": {},
    "make": {"env_id": ((str,), True), "num_envs": (_INT, True),
             "seed": (_ANY, False), "autoreset_mode": ((str,), False),
             "max_episode_steps": (_ANY, False), "env_kwargs": ((dict,), False),
             "batch_size": (_ANY, False), "render_mode": (_ANY, False),
             "max_threads": (_ANY, False), "num_workers": (_ANY, False),
             "info_bytes": (_ANY, False)},
    "reset": {**_SESSION, "seeds": ((bool,), False), "mask": ((bool,), False),
              "inline": ((bool,), False), "async": ((bool,), False)},
    "step": {**_SESSION, "actions": ((dict,), False), "inline": ((bool,), False)},
    "send": {**_SESSION, "inline": ((bool,), False)},
    "recv": {**_SESSION, "count": (_INT, True), "min": (_INT, False),
             "inline": ((bool,), False)},
    "render": _SESSION,
    "env_call": _SESSION,
    "close": _SESSION,
    "bye": {},
    "fast": {**_SESSION, "enable": ((bool,), False)},
}
#: Number of blobs after the header each type may carry (make: its per-env
#: lists, see list_to_blob).
MAX_BLOBS = {"reset": 2, "step": 1, "send": 2, "make": 64, "env_call": 1}
#: The dtypes a make's per-env list travels in (a blob frame of one value per
#: env, C order), so that a make of a million seeds keeps a small header.
LIST_DTYPES = {"b": "|b1", "i": "<i8", "u": "<u8", "f": "<f8"}
#: The arrays of a session's layout the client writes (the rest the daemon
#: writes); the inline transport sends these in requests, the others in replies.
INPUT_ARRAYS = ("actions", "reset_seeds", "reset_mask")
#: Arrays of a session's layout that only the fast path uses (the env ids of
#: its sends and recvs): neither input nor output of the inline transport.
DOORBELL_ARRAYS = ("doorbell_ids",)
#: Where the fast path's doorbell lies in a session's header page
#: (ENVD_DOORBELL_OFFSET of native/src/doorbell.h, which defines its fields; the
#: client's side: envd.client.doorbell.Doorbell).
DOORBELL_OFFSET = _native_facts.DOORBELL_OFFSET


def output_arrays(layout: Mapping[str, Any]) -> list[str]:
    """The names of a layout's output arrays, in layout order."""
    return [name for name in layout if name not in INPUT_ARRAYS + DOORBELL_ARRAYS]

#: The error-code table: wire code -> the exception the client raises.
ERROR_CODES: dict[str, type[errors.EnvdError]] = {
    cls.error_code: cls for cls in (
        errors.ProtocolError, errors.UnknownEnvError, errors.InvalidArgumentError,
        errors.InvalidActionError, errors.EnvStateError, errors.NativeError,
        errors.LimitExceededError, errors.UnknownSessionError, errors.SessionExpiredError,
        errors.DaemonError, errors.ShuttingDownError, errors.SharedMemoryError,
        errors.ConnectionLostError, errors.EnvError)
}
ERROR_CODES["unsupported_version"] = errors.ProtocolError
ERROR_CODES["unknown_type"] = errors.ProtocolError


class BadRequest(errors.ProtocolError):
    """Raised by the daemon's validation; ``code`` picks the wire code."""

    def __init__(self, message: str, code: str = "bad_request"):
        super().__init__(message)
        self.error_code = code


# ---- encoding -----------------------------------------------------------------------
def pack(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


#: Deepest nesting of containers (maps, arrays) a header may have: a request
#: needs 4 (make's env_kwargs with a blob reference), a reply's spaces a few
#: more; deeper headers are refused before msgpack decodes anything.
MAX_HEADER_DEPTH = 32
#: The daemon's default cap on a request's header frame (--max-header-bytes):
#: headers are a few hundred bytes; bulk data travels in blob frames.
DEFAULT_MAX_HEADER_BYTES = 64 << 10
#: Bytes of header per object a request header may hold at most (the object
#: count is bounded by max_bytes // this): with the byte cap it bounds what
#: decoding allocates (SECURITY.md: under 100 x the header cap).
HEADER_BYTES_PER_OBJECT = 8

# msgpack's type bytes (the spec's table): fixed sizes of scalars, the width
# of the length of str/bin, and the (length width, items per entry) of the
# 16- and 32-bit arrays and maps.  Every other byte over 0xc0 (ext types, the
# never-used 0xc1) is refused.
_SCALAR = {0xc0: 1, 0xc2: 1, 0xc3: 1, 0xca: 5, 0xcb: 9, 0xcc: 2, 0xcd: 3, 0xce: 5,
           0xcf: 9, 0xd0: 2, 0xd1: 3, 0xd2: 5, 0xd3: 9}
_SIZED = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}
_CONTAINER = {0xdc: (2, 1), 0xdd: (4, 1), 0xde: (2, 2), 0xdf: (4, 2)}
#: Every byte that may open a container: a frame with at most max_depth of
#: them (counted at C speed, str contents included) nests no deeper, and one
#: of at most max_objects bytes holds no more objects, so the per-object
#: walk runs only for the rare header that could break a bound.
_OPENERS = bytes([*range(0x80, 0xa0), *_CONTAINER])


def scan(frame: bytes, max_depth: int, max_objects: int) -> None:
    """Walk msgpack bytes without decoding them: BadRequest unless they hold
    at most max_objects objects nested at most max_depth containers deep (and
    no ext type).  Nothing is allocated per object, so a hostile header (a
    frame of nested empty arrays) is refused before it costs any memory."""
    view, end, pos, objects = memoryview(frame), len(frame), 0, 0
    stack: list[int] = []  # items left in each open container
    left = 1  # items left at the current level
    while left:
        if pos >= end:
            raise BadRequest("the header frame is not valid msgpack (truncated)")
        byte = view[pos]
        objects += 1
        if objects > max_objects:
            raise BadRequest(f"the header frame holds more than {max_objects} msgpack objects; "
                             "bulk data goes in data frames (docs/protocol.md)")
        items, opens = 0, True
        if byte < 0x80 or byte >= 0xe0:  # fixint
            pos, opens = pos + 1, False
        elif byte < 0x90:  # fixmap
            items, pos = 2 * (byte & 0x0f), pos + 1
        elif byte < 0xa0:  # fixarray
            items, pos = byte & 0x0f, pos + 1
        elif byte < 0xc0:  # fixstr
            pos, opens = pos + 1 + (byte & 0x1f), False
        elif byte in _SCALAR:
            pos, opens = pos + _SCALAR[byte], False
        elif byte in _SIZED:
            width, opens = _SIZED[byte], False
            pos += 1 + width + int.from_bytes(view[pos + 1:pos + 1 + width], "big")
        elif byte in _CONTAINER:
            width, per_entry = _CONTAINER[byte]
            items = per_entry * int.from_bytes(view[pos + 1:pos + 1 + width], "big")
            pos += 1 + width
        else:
            raise BadRequest(f"the header frame is not valid msgpack (type byte 0x{byte:02x} "
                             "is refused: no ext types)")
        left -= 1
        if opens and len(stack) >= max_depth:  # (an empty container counts too)
            raise BadRequest(f"the header frame nests msgpack containers deeper than "
                             f"{max_depth}")
        if items:
            if items > end - pos:  # every item takes a byte at least
                raise BadRequest("the header frame is not valid msgpack (truncated)")
            stack.append(left)
            left = items
        while not left and stack:
            left = stack.pop()
    if pos > end:  # the last str or bin runs past the frame
        raise BadRequest("the header frame is not valid msgpack (truncated)")


def unpack(frame: bytes, max_bytes: int, max_depth: int = MAX_HEADER_DEPTH,
           max_objects: int | None = None) -> dict[str, Any]:
    """Decode one header frame; BadRequest unless it is a msgpack map with str keys.

    Bounded before anything is decoded: a frame over max_bytes is refused,
    then scan() bounds its nesting (max_depth) and
    object count (max_objects, default max_bytes // HEADER_BYTES_PER_OBJECT),
    and msgpack bounds every container by max_bytes (no memory bombs)."""
    if len(frame) > max_bytes:
        raise BadRequest(f"a msgpack header frame of {len(frame)} bytes is over the limit of "
                         f"{max_bytes} (--max-header-bytes); bulk data goes in data frames")
    if max_objects is None:
        max_objects = max(64, max_bytes // HEADER_BYTES_PER_OBJECT)
    if (len(frame) > max_objects
            or len(frame) - len(frame.translate(None, _OPENERS)) > max_depth):
        scan(frame, max_depth, max_objects)
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True,
                                 max_bin_len=max_bytes, max_str_len=max_bytes,
                                 max_array_len=max_bytes, max_map_len=max_bytes, max_ext_len=0)
    except Exception as exc:  # noqa: BLE001 -- msgpack raises several unrelated types
        raise BadRequest(f"the header frame is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise BadRequest(f"the header must be a msgpack map, got {type(header).__name__}")
    return header


def list_to_blob(value: Any, blobs: list[bytes]) -> Any:
    """A per-env list of make (a list, tuple or 1-d array of bools, ints or
    floats, all of one Python type) as a reference ``{"blob": k, "dtype": d}``,
    its values appended to blobs as blob k; any other value as it is."""
    if isinstance(value, np.ndarray):
        array = value if value.ndim == 1 else None
    elif (isinstance(value, (list, tuple)) and value
          and len({type(v) for v in value}) == 1 and type(value[0]) in (bool, int, float)):
        try:
            array = np.asarray(value)
        except OverflowError:  # an int beyond 64 bits: the daemon's checks say so
            return value
    else:
        return value
    if array is None or array.dtype.kind not in LIST_DTYPES:
        return value
    dtype = LIST_DTYPES[array.dtype.kind]
    blobs.append(np.ascontiguousarray(array, dtype).tobytes())
    return {"blob": len(blobs) - 1, "dtype": dtype}


def list_from_blob(value: Any, blobs: list[bytes], used: set[int], max_items: int) -> Any:
    """The list a make's blob reference stands for (list_to_blob), its index
    added to used; any other value as it is.  BadRequest for a reference to
    no blob, to one already used, of another dtype, of a ragged size or of
    more than max_items values (checked before the list is built: a Python
    list costs ~8x its packed bytes)."""
    if not (isinstance(value, dict) and set(value) == {"blob", "dtype"}):
        return value
    index, dtype = value["blob"], value["dtype"]
    if type(index) is not int or not 0 <= index < len(blobs) or index in used:
        raise BadRequest(f"make: a per-env list names data frame {index!r}, which is not "
                         "there or is named twice")
    if dtype not in LIST_DTYPES.values():
        raise BadRequest(f"make: a per-env list's dtype must be one of "
                         f"{', '.join(LIST_DTYPES.values())}, got {dtype!r}"[:200])
    if len(blobs[index]) % np.dtype(dtype).itemsize:
        raise BadRequest(f"make: data frame {index} of {len(blobs[index])} bytes is not a "
                         f"whole number of {dtype} values")
    count = len(blobs[index]) // np.dtype(dtype).itemsize
    if count > max_items:
        raise BadRequest(f"make: data frame {index} holds {count} values, more than the "
                         f"{max_items} envs a session may have")
    used.add(index)
    return np.frombuffer(blobs[index], dtype).tolist()


#: The client's bounds on a reply's header frame.  Replies carry spaces (a
#: Box's bounds as nested lists, an object per element) and status tables, so
#: objects are bounded by the frame's bytes only, and a Dict space nests three
#: levels per level: deeper than a request may.
MAX_REPLY_HEADER_BYTES = 64 << 20
MAX_REPLY_DEPTH = 64


def unpack_reply(frame: bytes) -> dict[str, Any]:
    """Decode a reply's header frame as the client does: bounded by
    MAX_REPLY_HEADER_BYTES and MAX_REPLY_DEPTH (ProtocolError otherwise)."""
    return unpack(frame, MAX_REPLY_HEADER_BYTES, MAX_REPLY_DEPTH, max(64, len(frame)))


def _type_names(types: tuple[type, ...]) -> str:
    names = {int: "int", str: "str", bytes: "bin", bool: "bool", list: "array",
             dict: "map", type(None): "nil", object: "any"}
    return " or ".join(names[t] for t in types)


def validate_request(header: dict[str, Any], num_blobs: int) -> str:
    """Check the envelope and the fields of a request; return its type."""
    if not all(isinstance(key, str) for key in header):
        raise BadRequest("the header's field names must be str (msgpack str, not bin)")
    kind = header.get("type")
    if not isinstance(kind, str):
        raise BadRequest("a request needs a 'type' field of type str")
    request_id = header.get("id")
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        raise BadRequest("a request needs an 'id' field of type int")
    fields = MESSAGE_FIELDS.get(kind)
    if fields is None:
        raise BadRequest(f"unknown message type {kind[:100]!r}; known types: "
                         f"{', '.join(MESSAGE_FIELDS)}", "unknown_type")
    for name, (types, required) in fields.items():
        if name not in header:
            if required:
                raise BadRequest(f"{kind}: missing field {name!r} ({_type_names(types)})")
            continue
        value = header[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types
                                            and types is not _ANY):
            raise BadRequest(f"{kind}: field {name!r} must be {_type_names(types)}, "
                             f"got {type(value).__name__}")
    ack = header.get("ack")
    if "ack" in header and (not isinstance(ack, int) or isinstance(ack, bool)):
        raise BadRequest(f"{kind}: field 'ack' must be int, got {type(ack).__name__}")
    extra = sorted(set(header) - set(fields) - {"type", "id", "ack"})
    if extra:
        raise BadRequest(f"{kind}: unknown fields {extra}")
    if num_blobs > MAX_BLOBS.get(kind, 0):
        raise BadRequest(f"{kind}: takes at most {MAX_BLOBS.get(kind, 0)} data frames, "
                         f"got {num_blobs}")
    return kind


def ok_reply(request_id: int, **result: Any) -> dict[str, Any]:
    """An ok reply; a "_blobs" list in result goes out as data frames."""
    return {"id": request_id, "ok": True, **result}


def error_reply(request_id: int | None, exc: errors.EnvdError) -> dict[str, Any]:
    message = str(exc)
    encoded = message.encode("utf-8", "replace")
    if len(encoded) > MAX_ERROR_MESSAGE:  # e.g. a hostile header's field names, echoed
        message = encoded[:MAX_ERROR_MESSAGE - 3].decode("utf-8", "ignore") + "..."
    reply = {"id": request_id, "ok": False, "code": exc.error_code, "message": message}
    if isinstance(exc, errors.NativeError):
        reply["native_code"] = exc.code
    if isinstance(exc, errors.EnvError):
        reply["env_index"] = exc.env_index
    return reply


def error_from_reply(reply: dict[str, Any]) -> errors.EnvdError:
    """The exception an error reply stands for (the class of its code)."""
    code = reply.get("code")
    message = str(reply.get("message", "the daemon gave no message"))
    # (a code that is not a string, even an unhashable one, is an unknown code)
    cls = ERROR_CODES.get(code, errors.DaemonError) if isinstance(code, str) else errors.DaemonError
    if cls is errors.NativeError:
        return errors.NativeError(message, int(reply.get("native_code", -1)))
    if cls is errors.EnvError:
        index = reply.get("env_index", -1)
        return errors.EnvError(message, int(reply.get("native_code", -1)),
                               index if type(index) is int else -1)
    exc = cls(message)
    if code != cls.error_code:  # e.g. unknown_type, or a code of a newer daemon
        exc.error_code = str(code)
    return exc


def raise_error(reply: dict[str, Any]) -> None:
    """Raise the exception an error reply stands for."""
    raise error_from_reply(reply)


# ---- spaces ---------------------------------------------------------------------------
def space_to_wire(space: spaces.Space) -> dict[str, Any]:
    """A space's msgpack-able description (envd.leaves.space_to_wire)."""
    return leaves.space_to_wire(space)


def space_from_wire(wire: dict[str, Any]) -> spaces.Space:
    """The space space_to_wire described."""
    return leaves.space_from_wire(wire)
