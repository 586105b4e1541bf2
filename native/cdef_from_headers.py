"""The cffi declarations of envd's native core, generated from its C headers.

A header marks what Python sees: the text between a ``/* cffi:begin */`` line
and the next ``/* cffi:end */`` line.  Everything declared there reaches
Python (``envd.native._envd_native.lib``) with no other edit: the build
(native/build_ffi.py) calls :func:`generate` and hands its result to cffi.
Declarations that only C calls, and static inline functions (which have
bodies, which cffi does not take), stay outside the marks.

cffi's cdef takes a subset of C without a preprocessor, so the marked text is
rewritten, with no C parser and no fake libc headers:

* the headers are read as the compiler would, each after those it includes
  (``#include "x.h"``), and their function-like macros are recorded in order
  (``#define``/``#undef``), so that an X-macro table used in a marked region
  (``ENVD_ERRNO_MAP(ENVD_ERROR_ENUM_ENTRY)`` in envd.h) is expanded there;
* ``#define NAME value`` becomes ``#define NAME ...`` (cffi asks the compiler
  for the value; a string constant is left out), ``#include`` and ``#undef``
  go, conditional compilation is refused (cffi would see every branch);
* enums lose their values and end with ``...`` (the compiler's values);
* structs end with ``...;`` (the compiler's layout: fields may be listed in
  part, and a field whose length is not a plain number gets ``[...]``);
* ``_Atomic`` and ``__attribute__((...))`` go (cffi knows neither; the
  layout still comes from the compiler).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

BEGIN = "/* cffi:begin */"
END = "/* cffi:end */"
#: a comment line that means to be a marker (any spacing or case): one that is
#: not exactly BEGIN or END is refused, not read as a plain comment that
#: silently leaves its declarations out of the cdef
_MARKER_LIKE = re.compile(r"/\*\s*cffi\s*:?\s*(begin|end)\s*\*/", re.I)

# A string or character literal, or a comment (kept apart so that "/*" inside
# a string is not taken for a comment).
_LITERAL_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*',
                                 re.S)
_DEFINE = re.compile(r"#\s*define\s+(\w+)(\(([^)]*)\))?\s*(.*)", re.S)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_ATTRIBUTE = re.compile(r"\b__attribute__\s*\(\(")


def headers(native: Path) -> list[Path]:
    """Every header of native/include and native/src with a marked region, each
    after the headers it includes (the order a compiler reads them in)."""
    found = {p.name: p for p in sorted(native.glob("include/*.h")) + sorted(native.glob("src/*.h"))}
    order: list[Path] = []

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name not in found or found[name] in order:
            return
        if name in stack:
            raise ValueError(f"the headers include each other in a circle: {' -> '.join(stack)}")
        for included in _INCLUDE.findall(found[name].read_text()):
            visit(included, stack + (name,))
        order.append(found[name])

    for name in found:
        visit(name, ())
    return [p for p in order if _MARKER_LIKE.search(p.read_text())]


def _split_marked(path: Path) -> list[tuple[bool, str]]:
    """The header's text in pieces (marked?, text), comments blanked out and
    continuation lines joined."""
    pieces: list[tuple[bool, str]] = []
    marked = False
    for number, raw in enumerate(path.read_text().split("\n"), 1):
        line = raw.strip()
        if line not in (BEGIN, END) and _MARKER_LIKE.fullmatch(line):
            raise ValueError(f"{path.name}:{number}: {line!r} is not a marker: write "
                             f"{BEGIN} or {END} exactly")
        if line in (BEGIN, END):
            if marked and line == BEGIN:
                raise ValueError(f"{path.name}:{number}: {BEGIN} inside a marked region")
            if not marked and line == END:
                raise ValueError(f"{path.name}:{number}: {END} without a {BEGIN} before it")
            marked = line == BEGIN
            pieces.append((marked, ""))
            continue
        if not pieces:
            pieces.append((False, ""))
        pieces[-1] = (pieces[-1][0], pieces[-1][1] + raw + "\n")
    if marked:
        raise ValueError(f"{path.name}: {BEGIN} without {END}")
    return [(m, _strip_comments(text).replace("\\\n", " ")) for m, text in pieces]


def _strip_comments(text: str) -> str:
    """text with each comment replaced by a space (and its line breaks)."""
    return _LITERAL_OR_COMMENT.sub(
        lambda m: m[0] if m[0][0] in "\"'" else " " + "\n" * m[0].count("\n"), text)


def _closing(text: str, start: int, open_: str = "(", close: str = ")") -> int:
    """The index of the bracket that closes the one at text[start]."""
    depth = 0
    i = start
    while i < len(text):
        m = _LITERAL_OR_COMMENT.match(text, i)
        if m:
            i = m.end()
            continue
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced {open_!r} in {text[start:start + 60]!r}")


def _split_args(text: str) -> list[str]:
    """A macro invocation's arguments (text between its parentheses)."""
    args, depth, current, i = [], 0, "", 0
    while i < len(text):
        m = _LITERAL_OR_COMMENT.match(text, i)
        if m:
            current += m[0]
            i = m.end()
            continue
        c = text[i]
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += c
        i += 1
    args.append(current.strip())
    return args


def _expand(text: str, macros: dict[str, tuple[list[str], str]], depth: int = 0) -> str:
    """text with every invocation of a function-like macro replaced by its
    body (parameters substituted, ``##`` pasted), rescanned."""
    if depth > 32:
        raise ValueError("macro expansion nests deeper than 32 (a recursive macro?)")
    if not macros:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\s*\(")
    out, i = "", 0
    while (m := pattern.search(text, i)) is not None:
        params, body = macros[m[1]]
        end = _closing(text, m.end() - 1)
        args = _split_args(text[m.end():end])
        if args == [""] and not params:
            args = []
        if len(args) != len(params):
            raise ValueError(f"macro {m[1]} takes {len(params)} arguments, given {len(args)}")
        for param, arg in zip(params, args):
            body = re.sub(rf"\b{re.escape(param)}\b", _literal(arg), body)
        body = re.sub(r"\s*##\s*", "", body)
        out += text[i:m.start()] + " " + _expand(body, macros, depth + 1) + " "
        i = end + 1
    return out + text[i:]


def _literal(text: str) -> Callable[[re.Match[str]], str]:
    """A re.sub replacement that inserts text as it is (no backslash escapes)."""
    return lambda _match: text


def _remove_attributes(text: str) -> str:
    while (m := _ATTRIBUTE.search(text)) is not None:
        text = text[:m.start()] + text[_closing(text, m.end() - 2) + 1:]
    return text


def _cffi_types(text: str, top: bool = True) -> str:
    """Rewrite enums and structs for cffi (see the module's docstring); top:
    text is file level (its structs get ``...;``, not the nested ones)."""
    out, i = "", 0
    pattern = re.compile(r"\b(enum|struct|union)\s*(\w*)\s*\{")
    while (m := pattern.search(text, i)) is not None:
        end = _closing(text, m.end() - 1, "{", "}")
        body = text[m.end():end]
        if m[1] == "enum":
            names = [item.split("=")[0].strip() for item in _split_args(body)]
            body = " " + ", ".join([n for n in names if n] + ["..."]) + " "
        else:
            body = re.sub(r"\[([^\]]*)\]",
                          lambda a: a[0] if re.fullmatch(r"\s*\d+\s*", a[1]) else "[...]",
                          _cffi_types(body, top=False))
            if top:  # the layout is the compiler's
                body = body.rstrip() + "\n    ...;\n"
        out += text[i:m.end()] + body + "}"
        i = end + 1
    return out + text[i:]


def generate(native: Path) -> str:
    """The cdef of every marked region of native's headers, in include order."""
    macros: dict[str, tuple[list[str], str]] = {}
    parts: list[str] = []
    for path in headers(native):
        parts.append(f"/* {path.relative_to(native)} */")
        for marked, text in _split_marked(path):
            kept: list[str] = []
            pending: list[str] = []  # text since the last directive, not expanded yet
            for line in text.split("\n") + ["#"]:
                if not line.lstrip().startswith("#"):
                    pending.append(line)
                    continue
                # a macro expands with the definitions in force where it is used
                if marked:
                    kept.append(_expand("\n".join(pending), macros))
                pending = []
                if marked and re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b", line):
                    raise ValueError(f"{path.name}: {line.strip()!r} in a cffi region (cffi "
                                     f"would see every branch): keep the region out of it")
                if (d := _DEFINE.match(line.strip())) is not None:
                    if d[2] is not None:  # function-like: an X-macro table or entry
                        macros[d[1]] = ([p.strip() for p in d[3].split(",") if p.strip()],
                                        d[4])
                    elif marked and not d[4].lstrip().startswith('"'):
                        kept.append(f"#define {d[1]} ...")
                elif (u := re.match(r"\s*#\s*undef\s+(\w+)", line)) is not None:
                    macros.pop(u[1], None)
            if marked:
                parts.append(_translate("\n".join(kept), path))
    return "\n".join(parts) + "\n"


def _translate(text: str, path: Path) -> str:
    """A marked region's text (directives done, macros expanded) as cffi takes it."""
    if re.search(r"\bstatic\b", text):
        raise ValueError(f"{path.name}: a static declaration in a cffi region (static inline "
                         f"functions have bodies, which cffi does not take): move {END} above it")
    text = re.sub(r"\b_Atomic\b", "", _remove_attributes(text))
    text = _cffi_types(text)
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(line for line in lines if line.strip())


if __name__ == "__main__":  # python native/cdef_from_headers.py: print the cdef
    print(generate(Path(__file__).resolve().parent), end="")
