"""Hypothesis strategies for the protocol fuzzer (tests/integration/test_fuzz.py).

Hypothesis draws, per example, a corpus of structured messages (CORPUS: a
few of each kind below), a pool of values (VALUE_POOL) and a seed; expand()
turns them into a batch of messages: each picks a kind by weight, an entry of
the corpus, a sender and a salt, and half of them are varied further by a
small mutation engine (fresh random bytes; a field set to another value of
its type, to a pool value, or dropped; another corruption).  Drawing every
message through hypothesis would cost about 2 ms each (some 200 us per drawn
choice on a loaded 2-core box): 100,000 of them a run would not fit in a
test.  All the randomness still comes from what hypothesis drew, so a
derandomized run sends the same messages.

A message is a Msg record, not bytes: what depends on the daemon's state
(the id of a session one of the fuzzer's connections made, or a bystander's,
and the inline actions that fit it) is a placeholder resolved when the
message is sent.  Large frames are a size, filled when sent.

Message kinds (see KIND_WEIGHTS):
  bytes      random frames
  object     valid msgpack of random objects (any type, nested, ext types)
  special    hand-picked hostile msgpack (deep nesting, huge declared lengths,
             invalid UTF-8, non-str keys, trailing bytes, ...)
  valid      a well-formed request of any type on the sender's own sessions,
             sent in random order: step before reset, recv before send, send
             twice, requests after close or bye, ...
  mutated    a well-formed request with fields dropped, added or retyped
  corrupt    the bytes of a well-formed request truncated, flipped, extended
  frames     a well-formed request with extra or missing data frames
  foreign    a well-formed request naming a session of the bystander client:
             must be refused (unknown_session); or a heartbeat naming the
             bystander's connection (allowed: it only renews that lease)
  replay     one of the sender's recent messages again, same id
  big        frames up to --max-message-bytes, or several frames together over it
  oversized  one frame over --max-message-bytes: the daemon drops the connection
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack
from hypothesis import strategies as st

import envd
from envd import protocol
from envd.native.registry import get_spec

TYPES = list(protocol.MESSAGE_FIELDS)
ENV_IDS = envd.list_envs()
PARAM_NAMES = sorted({param.name for env_id in ENV_IDS for param in get_spec(env_id).params}
                     | {"gravity"})
FIELD_NAMES = sorted({"type", "id", "pad", "order", "dtype", "shape", "x", "Type", "ID",
                      *(name for fields in protocol.MESSAGE_FIELDS.values() for name in fields)})
WORDS = [*TYPES, *ENV_IDS, "", "x", "next_step", "same_step", "disabled", "<i8", "<f4", "<i4",
         "int64", ">i8", "|b1", "é\u2603\x00", "\x7f", "None", "nan", "-1",
         "0" * 32, "STEP", "__init__", "../CartPole-v1"]


# ---- placeholders, resolved when a message is sent -------------------------------------

@dataclass(frozen=True)
class Ref:
    """The id of a session: "own" (made by the sending connection), "other" (the
    bystander's), "gone" (closed by the sender, or never made)."""
    whose: str
    k: int


@dataclass(frozen=True)
class Desc:
    """The exact inline-actions description {dtype, shape} of ref's session."""
    ref: Ref


@dataclass(frozen=True)
class Blob:
    """Inline actions for ref's session: its actions' byte size + delta, all bytes = fill."""
    ref: Ref
    delta: int
    fill: int


class _Peer:
    """The bystander's routing id (a heartbeat may name another connection)."""

    def __repr__(self) -> str:
        return "PEER"


PEER = _Peer()


class _Drop:
    """A field value meaning: leave the field out."""

    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()


@dataclass(frozen=True)
class Msg:
    """One message to send.  sock: index of the fuzzer connection that sends it
    (ignored for "oversized", which go to a throwaway connection); salt: shifts
    which session a Ref names.  body by kind:
      bytes/object/special: tuple of frames;
      valid/mutated/frames/foreign: (header, blobs) with placeholders;
      corrupt: ((header, blobs), op, position, byte);
      replay: how many messages back; big: (variant, fraction of the limit);
      oversized: (variant, bytes over the limit)."""
    sock: int
    kind: str
    body: Any
    salt: int = 0


# ---- values -------------------------------------------------------------------------------

SMALL_INTS = st.integers(-3, 12)
EDGE_INT_VALUES = [2**7, 2**8, 2**15, 2**16, 2**20, 2**20 + 1, 2**31 - 1, 2**31, 2**32,
                   2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -2**7 - 1, -2**31, -2**63]
EDGE_INTS = st.sampled_from(EDGE_INT_VALUES)
INTS = st.one_of(SMALL_INTS, SMALL_INTS, EDGE_INTS)
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.0, 1e300, -1e-300, math.nan,
                                    math.inf, -math.inf]), st.floats())
# long strings and bytes are drawn as a length: cheap for hypothesis's data budget
TEXT = st.one_of(st.sampled_from(WORDS), st.sampled_from(WORDS), st.text(max_size=6),
                 st.integers(100, 70_000).map(lambda n: "a" * n),
                 st.integers(10, 3_000).map(lambda n: "\u2603" * n))
BINARY = st.one_of(st.binary(max_size=16), st.integers(17, 70_000).map(lambda n: b"\xa5" * n))
EXT = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=6))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, INTS, FLOATS, TEXT, TEXT, BINARY, EXT)
KEYS = st.one_of(st.sampled_from(FIELD_NAMES), st.sampled_from(FIELD_NAMES), st.text(max_size=4),
                 st.binary(max_size=4), SMALL_INTS, st.none(), st.booleans())
VALUES = st.recursive(SCALARS, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4)), max_leaves=6)


def pack_any(value: Any, bin_type: bool = True, single_float: bool = False) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=bin_type, use_single_float=single_float)
    except OverflowError:  # a float too large for float32
        return msgpack.packb(value, use_bin_type=bin_type)


# ---- raw frames ----------------------------------------------------------------------------

_STATUS = pack_any({"type": "status", "id": 7})
SPECIAL = [
    b"", b"\xc0", b"\xc1", b"\x80", b"\x90", b"\xc2", b"\xff" * 8, _STATUS[:-1], _STATUS + b"\x00",
    b"\x91" * 5000 + b"\xc0", b"\x81\xa1a" * 3000 + b"\xc0",           # too deep
    b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",  # 4 G long
    b"\xc6\x7f\xff\xff\xff", b"\xc9\x00\x00\x10\x00\x01",
    b"\x82\xa4type\xa6status\xa2id\xcf" + b"\xff" * 8,                 # id 2**64 - 1
    b"\x82\xa4type\xa6status\xa2id\xd3" + b"\x80" + bytes(7),          # id -2**63
    b"\x82\xa4type\xa6status\xa2id\xcb" + b"\x7f\xf8" + bytes(6),      # id nan
    b"\x82\xa4type\xa2\xff\xfe\xa2id\x01",                              # invalid UTF-8 type
    b"\x82\xc4\x04type\xa6status\xa2id\x01",                            # bin key
    b"\x82\xa4type\xc4\x06status\xa2id\x01",                            # bin type
    b"\x82\x01\x02\xa2id\x01", b"\x81\xc0\x01", b"\x81\x90\x01", b"\x81\x80\x01",
    b"\x83\xa4type\xa6status\xa2id\x01\xa4type\xa4step",                # duplicate key
    b"\x83\xa4type\xa6status\xa2id\x01\xa2id\xa1x",
    b"\x82\xa4type\xa6status\xa2id\xd6\xff" + bytes(4),                  # timestamp id
    pack_any({"type": "status", "id": 1, "x": msgpack.ExtType(1, b"e")}),
    pack_any({"type": "status", "id": 1}, bin_type=False),
    pack_any({"type": "hello", "version": protocol.PROTOCOL_VERSION}, bin_type=False),
    pack_any({"type": "status", "id": 1.0}),
    pack_any({"type": "status", "id": 1.0}, single_float=True),
]

RAW_FRAME = st.one_of(st.binary(max_size=64), st.binary(min_size=1, max_size=4),
                      st.integers(65, 20_000).map(lambda n: bytes(range(256)) * (n // 256)
                                                  + b"\x01"))
EXTRA_BLOBS = st.one_of(st.just(()), st.just(()), st.just(()),
                        st.lists(st.binary(max_size=24), min_size=1, max_size=3).map(tuple))


def _frames(header: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(lambda h, blobs: (h, *blobs), header, EXTRA_BLOBS)


BYTES_FRAMES = _frames(RAW_FRAME)
OBJECT_FRAMES = _frames(st.builds(pack_any, VALUES, st.booleans(), st.booleans()))
SPECIAL_FRAMES = _frames(st.integers(0, len(SPECIAL) - 1).map(SPECIAL.__getitem__))


# ---- well-formed requests ----------------------------------------------------------------

def refs(whose: str | None = None) -> st.SearchStrategy:
    owners = st.just(whose) if whose else st.sampled_from(["own"] * 6 + ["gone", "other"])
    return st.builds(Ref, owners, st.integers(0, 7))


def _ids_blob(ids: list[int]) -> bytes:
    return b"".join(int(i).to_bytes(8, "little", signed=True) for i in ids)


ENV_IDS_BLOB = st.one_of(
    st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True).map(_ids_blob),
    st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True).map(_ids_blob),
    st.lists(st.one_of(st.integers(-2, 9), st.sampled_from([2**63 - 1, -2**63])),
             max_size=10).map(_ids_blob),
    st.binary(max_size=20))


def _request(kind: str, ref: st.SearchStrategy) -> st.SearchStrategy:
    """(header, blobs) of a well-formed request of this type (the id is added when sent)."""
    def header(required: dict, optional: dict | None = None) -> st.SearchStrategy:
        return st.fixed_dictionaries({"type": st.just(kind), **required}, optional=optional)

    no_blobs = st.just(())
    if kind == "hello":
        return st.tuples(header({"version": st.just(protocol.PROTOCOL_VERSION)},
                                {"client_name": TEXT}), no_blobs)
    if kind == "heartbeat":
        return st.tuples(header({}, {"client": st.binary(min_size=16, max_size=16)}), no_blobs)
    if kind in ("list_envs", "status", "bye"):
        return st.tuples(header({}), no_blobs)
    if kind == "make":
        return st.tuples(header(
            {"env_id": st.sampled_from(ENV_IDS), "num_envs": st.integers(1, 8)},
            {"seed": st.one_of(st.none(), st.integers(0, 2**32),
                               st.lists(st.integers(0, 99), min_size=1, max_size=8)),
             "autoreset_mode": st.sampled_from(["next_step", "same_step", "disabled"]),
             "max_episode_steps": st.one_of(st.none(), st.integers(1, 50)),
             "env_kwargs": st.just({}), "batch_size": st.one_of(st.none(), st.integers(1, 4)),
             "max_threads": st.one_of(st.none(), st.integers(-1, 3))}),  # -1: refused
            no_blobs)
    fills = st.sampled_from([0, 0, 0, 1, 0xff, 0x7f])
    if kind == "reset":
        # inline resets take their seeds and mask as frames (a Blob has the
        # actions' size: for Discrete envs, that of the seeds)
        return st.one_of(
            st.tuples(header({"session": ref}, {"seeds": st.booleans(), "mask": st.booleans(),
                                                "inline": st.booleans()}), no_blobs),
            st.builds(lambda r, fill: ({"type": "reset", "session": r, "seeds": True,
                                        "inline": True}, (Blob(r, 0, fill),)), ref, fills))
    if kind == "step":
        return st.one_of(
            st.tuples(header({"session": ref}), no_blobs),
            st.builds(lambda r, fill, inline: ({"type": "step", "session": r, "actions": Desc(r),
                                                "inline": inline}, (Blob(r, 0, fill),)),
                      ref, fills, st.booleans()))
    if kind == "send":
        return st.one_of(
            st.tuples(header({"session": ref}), st.tuples(ENV_IDS_BLOB)),
            st.builds(lambda r, ids, fill, delta: ({"type": "send", "session": r, "inline": True},
                                                   (ids, Blob(r, delta, fill))),
                      ref, ENV_IDS_BLOB, fills, st.sampled_from([0, 0, -8, 8])))
    if kind == "recv":
        return st.tuples(header({"session": ref, "count": st.integers(1, 8)},
                                {"inline": st.booleans()}), no_blobs)
    if kind == "close":
        return st.tuples(header({"session": ref}), no_blobs)
    if kind == "fast":  # the fast path on and off (socket steps are refused while on)
        return st.tuples(header({"session": ref}, {"enable": st.booleans()}), no_blobs)
    raise AssertionError(kind)


#: How often each request type is drawn: mostly the session requests; a bye
#: (which frees all the sender's sessions) seldom.
REQUEST_WEIGHTS = {"hello": 2, "heartbeat": 2, "list_envs": 1, "status": 2, "make": 4, "reset": 5,
                   "step": 10, "send": 6, "recv": 6, "close": 2, "bye": 1, "fast": 2}


def requests(whose: str | None = None) -> st.SearchStrategy:
    ref = refs(whose)
    return st.one_of(*(_request(kind, ref) for kind, weight in REQUEST_WEIGHTS.items()
                       for _ in range(weight)))


SESSION_TYPES = ["reset", "step", "send", "recv", "close", "fast"]
FOREIGN_REQUESTS = st.one_of(
    *(_request(kind, refs("other")) for kind in SESSION_TYPES),
    st.just(({"type": "heartbeat", "client": PEER}, ())))


_ANY_REQUEST = requests()
_INDEX = st.integers(0, 255)
_OPS = st.sampled_from(["same type"] * 5 + ["retype"] * 2 + ["drop", "add", "type", "id", "blobs",
                                                           "rename"])
_NEW_TYPES = st.one_of(st.sampled_from(TYPES), st.sampled_from(TYPES).map(str.encode), TEXT, VALUES)
#: Values of the type a field has, to get past the type checks to the handlers'.
_SAME_TYPE = {
    str: TEXT, int: INTS, bool: st.booleans(), bytes: BINARY, type(None): st.none(),
    list: st.lists(st.one_of(INTS, INTS, VALUES), max_size=9),
    dict: st.dictionaries(st.sampled_from(PARAM_NAMES + FIELD_NAMES), VALUES, max_size=3),
    Ref: st.one_of(TEXT, refs()),
    Desc: st.fixed_dictionaries({"dtype": TEXT, "shape": st.lists(INTS, max_size=3)}),
}
_NEW_BLOBS = st.lists(st.one_of(st.binary(max_size=40), st.just(b"")), max_size=5).map(tuple)
_RENAMES = st.sampled_from([str.encode, str.upper, lambda name: name + " "])


@st.composite
def mutated_requests(draw) -> tuple[dict, tuple]:
    """A well-formed request with 1-3 fields dropped, added, retyped or renamed."""
    header, blobs = draw(_ANY_REQUEST)
    header = dict(header)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(_OPS)
        names = [name for name in header if isinstance(name, str)] or ["type"]
        name = names[draw(_INDEX) % len(names)]
        if op == "same type":
            header[name] = draw(_SAME_TYPE.get(type(header.get(name)), VALUES))
        elif op == "retype":
            header[name] = draw(VALUES)
        elif op == "drop":
            header[name if draw(st.booleans()) else "id"] = DROP
        elif op == "add":
            header[draw(KEYS)] = draw(VALUES)
        elif op == "type":
            header["type"] = draw(_NEW_TYPES)
        elif op == "id":
            header["id"] = draw(VALUES)
        elif op == "blobs":
            blobs = draw(_NEW_BLOBS)
        elif name in header:  # the same name as bin, upper case, or with a space
            header[draw(_RENAMES)(name)] = header.pop(name)
    return header, blobs


CORRUPT = st.tuples(_ANY_REQUEST, st.sampled_from(["truncate", "truncate", "flip", "insert",
                                                 "append", "count"]),
                    st.integers(0, 1 << 16), st.integers(0, 255))
WRONG_FRAMES = st.builds(
    lambda request, blobs, cut: (request[0], request[1][:0] if cut else request[1] + blobs),
    _ANY_REQUEST, st.lists(st.binary(max_size=40), min_size=1, max_size=6).map(tuple),
    st.booleans())


# ---- the message mix -------------------------------------------------------------------------

#: Relative weight of each kind among the messages sent.
KIND_WEIGHTS = {"bytes": 100, "object": 90, "special": 25, "valid": 230, "mutated": 200,
                "corrupt": 70, "frames": 50, "foreign": 80, "replay": 60, "big": 5,
                "oversized": 2}
#: The corpus hypothesis draws per example: so many entries of each kind.
CORPUS_SIZES = {"bytes": 4, "object": 5, "special": 3, "valid": 10, "mutated": 10,
                "corrupt": 4, "frames": 3, "foreign": 4}
_BODIES = {"bytes": BYTES_FRAMES, "object": OBJECT_FRAMES, "special": SPECIAL_FRAMES,
           "valid": requests("own"), "mutated": mutated_requests(), "corrupt": CORRUPT,
           "frames": WRONG_FRAMES, "foreign": FOREIGN_REQUESTS}
CORPUS = st.fixed_dictionaries({kind: st.lists(_BODIES[kind], min_size=size, max_size=size)
                                for kind, size in CORPUS_SIZES.items()})
#: Values the expansion puts into mutated headers.
VALUE_POOL = st.lists(VALUES, min_size=16, max_size=16)
#: Seeds the Random that expand() draws with.
SEEDS = st.integers(0, 2**64 - 1)
CORRUPT_OPS = ["truncate", "truncate", "flip", "insert", "append", "count"]
BIG_VARIANTS = ["pad", "inline", "split", "blobs"]
OVERSIZED_VARIANTS = ["header", "blob", "second"]
_KINDS, _WEIGHTS = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())


def expand(corpus: dict[str, list], pool: list, rnd, count: int, num_sockets: int) -> list[Msg]:
    """count messages from a corpus drawn by hypothesis, with a Random it drew:
    each picks a kind (KIND_WEIGHTS), a corpus entry of that kind, a sender and a
    salt (which of the sender's sessions a Ref names), and half of them are varied
    further.  Drawing every message through hypothesis would cost ~2 ms each."""
    messages = []
    for kind in rnd.choices(_KINDS, _WEIGHTS, k=count):
        sock, salt = rnd.randrange(num_sockets), rnd.getrandbits(30)
        if kind == "replay":
            body = rnd.randint(1, 40)
        elif kind == "big":
            body = (rnd.choice(BIG_VARIANTS), rnd.random())
        elif kind == "oversized":
            body = (rnd.choice(OVERSIZED_VARIANTS), rnd.randint(1, 1 << 18))
        else:
            body = rnd.choice(corpus[kind])
            if rnd.random() < 0.5:
                body = _vary(kind, body, corpus, pool, rnd)
        messages.append(Msg(sock, kind, body, salt))
    return messages


def _vary(kind: str, body: Any, corpus: dict[str, list], pool: list, rnd) -> Any:
    if kind == "bytes":
        return (rnd.randbytes(rnd.randrange(80)), *body[1:])
    if kind == "object":
        header = {rnd.choice(FIELD_NAMES): rnd.choice(pool) for _ in range(rnd.randrange(6))}
        if rnd.random() < 0.5:
            header.update(type=rnd.choice(TYPES), id=rnd.getrandbits(20))
        return (pack_any(header), *body[1:])
    if kind == "special":
        return (rnd.randbytes(rnd.randrange(4)) + body[0] + rnd.randbytes(rnd.randrange(4)),
                *body[1:])
    if kind == "mutated":
        header, blobs = body if rnd.random() < 0.5 else rnd.choice(corpus["valid"])
        header = dict(header)
        for _ in range(rnd.choice((1, 1, 1, 2))):
            names = [name for name in header if name not in ("type", "id")]
            op = rnd.random()
            if names and op < 0.6:  # a field it has, a value of the same type
                name = rnd.choice(names)
                header[name] = like(header[name], pool, rnd)
            elif names and op < 0.75:
                header[rnd.choice(names)] = rnd.choice(pool)
            elif op < 0.85:
                header[rnd.choice(FIELD_NAMES)] = DROP
            elif op < 0.95:
                header[rnd.choice(FIELD_NAMES + PARAM_NAMES)] = rnd.choice(pool)
            else:
                header["type"] = rnd.choice(TYPES + WORDS)
        return header, blobs
    if kind == "corrupt":
        return (rnd.choice(corpus["valid"]), rnd.choice(CORRUPT_OPS), rnd.getrandbits(16),
                rnd.randrange(256))
    if kind == "frames":
        header, blobs = rnd.choice(corpus["valid"])
        return header, tuple(rnd.randbytes(rnd.randrange(40)) for _ in range(rnd.randrange(7)))
    return body  # valid, foreign: the salt picks another session


_FLOATS = [0.0, -0.0, 0.5, 1.0, 1.5, -2.0, 1e300, math.nan, math.inf, -math.inf]
_DTYPES = ["<i8", "<f4", "<i4", "<f8", ">i8", "|u1", "int64", "float32", "", "x"]
_CHARS = "ab_-0 ☃é\x00"


def like(value: Any, pool: list, rnd) -> Any:
    """A random value of value's type: past the envelope's type checks, to the
    handlers' own (unknown env ids and sessions, num_envs, seeds, modes, ...)."""
    kind = type(value)
    same = [other for other in pool if type(other) is kind]
    if same and rnd.random() < 0.3:
        return rnd.choice(same)
    if kind is bool:
        return rnd.random() < 0.5
    if kind is int:
        return rnd.randint(-3, 300) if rnd.random() < 0.7 else rnd.choice(EDGE_INT_VALUES)
    if kind is float:
        return rnd.choice(_FLOATS)
    if kind is str or kind is Ref:
        pick = rnd.random()
        if pick < 0.4:
            return rnd.choice(WORDS)
        if pick < 0.8:
            return "".join(rnd.choice(_CHARS) for _ in range(rnd.randrange(12)))
        return rnd.choice("x☃") * rnd.randrange(90, 130)
    if kind is bytes:
        return rnd.randbytes(rnd.choice((0, 1, 15, 16, 17, 100)))
    if kind is Desc:
        return {"dtype": rnd.choice(_DTYPES),
                "shape": [rnd.randint(-1, 9) for _ in range(rnd.randrange(3))]}
    if kind is dict:
        return {rnd.choice(PARAM_NAMES + FIELD_NAMES): rnd.choice(pool + _FLOATS + [True, 3])
                for _ in range(rnd.randrange(3))}
    if kind is list:
        return [rnd.randint(-2, 12) for _ in range(rnd.randrange(10))]
    return rnd.choice(pool)


def corrupt(frame: bytes, op: str, position: int, byte: int) -> bytes:
    """The bytes of a packed header, damaged."""
    at = position % (len(frame) + 1)
    if op == "truncate":
        return frame[:at % max(1, len(frame))]
    if op == "flip" and frame:
        at %= len(frame)
        return frame[:at] + bytes([frame[at] ^ (byte or 1)]) + frame[at + 1:]
    if op == "insert":
        return frame[:at] + bytes([byte]) + frame[at:]
    if op == "count" and frame and 0x80 <= frame[0] <= 0x8e:
        return bytes([frame[0] + 1]) + frame[1:]  # the map claims one entry more than it has
    return frame + bytes([byte]) * (1 + position % 9)
