"""The native core's modules depend on each other one way: no circle.

A module of native/src is a name with its .c and/or .h (session.c and
session.h are the module session).  Module A depends on module B when a file
of A includes "B.h" or names a function of B: one that B.h declares (an
interface header such as backend.h owns what it declares, wherever it is
defined), else one that B.c defines with external linkage.  The graph must
have no cycle: the doorbell (a front door) depends on the session, never the
reverse (issue 39 broke doorbell.c <-> session.c).
Comments and string literals are left out, so a comment may name any module.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "native" / "src"

_COMMENT_OR_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)\.h"', re.M)
# A function declared (";") or defined ("{") at file scope, not static: a
# return type on the name's line, the name, the parameters.
_DECLARATION = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(envd_\w+)\s*\([^;{}]*\)\s*;", re.M)
_DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(envd_\w+)\s*\([^;{}]*\)\s*\{", re.M)
_NAME = re.compile(r"\benvd_\w+\b")


def code(path: Path) -> str:
    """The file's text with every comment and string literal blanked."""
    return _COMMENT_OR_STRING.sub(lambda m: '""' if m[0][0] in "\"'" else " ", path.read_text())


def dependencies(src: Path) -> dict[str, set[str]]:
    """module -> the other modules of src it depends on."""
    files: dict[str, list[Path]] = {}
    for path in sorted(src.glob("*.[ch]")):
        files.setdefault(path.stem, []).append(path)
    owner: dict[str, str] = {}
    for pattern, suffix in ((_DECLARATION, ".h"), (_DEFINITION, ".c")):
        for module, paths in files.items():
            for path in paths:
                if path.suffix == suffix:
                    for name in pattern.findall(code(path)):
                        owner.setdefault(name, module)
    graph: dict[str, set[str]] = {}
    for module, paths in files.items():
        used: set[str] = set()
        for path in paths:
            text = code(path)
            used |= {m for m in _INCLUDE.findall(path.read_text()) if m in files}
            used |= {owner[name] for name in _NAME.findall(text) if name in owner}
        graph[module] = used - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of graph as the modules on it (the first repeated at the end),
    or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for other in sorted(graph.get(module, ())):
            cycle = visit(other, path + [module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_the_native_modules_form_no_circle():
    cycle = find_cycle(dependencies(SRC))
    assert cycle is None, "native/src modules depend on each other in a circle: " + " -> ".join(cycle)


def test_the_doorbell_depends_on_the_session_and_not_the_reverse():
    graph = dependencies(SRC)
    assert "session" in graph["doorbell"]
    assert "doorbell" not in graph["session"], graph["session"]


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("files, cycle", [
    # an include each way
    ({"a.h": '#include "b.h"\n', "b.h": '#include "a.h"\n'}, ["a", "b", "a"]),
    # a.c calls b's function, b.h includes a.h (the old doorbell.c <-> session.c)
    ({"a.c": "void envd_a_run(void)\n{\n    envd_b_go();\n}\n",
      "b.c": '#include "a.h"\nint envd_b_go(void)\n{\n    return 0;\n}\n', "a.h": ""},
     ["a", "b", "a"]),
    # three modules round
    ({"a.h": '#include "b.h"\n', "b.h": '#include "c.h"\n', "c.h": '#include "a.h"\n'},
     ["a", "b", "c", "a"]),
])
def test_a_circle_is_found(tmp_path, files, cycle):
    assert find_cycle(dependencies(write(tmp_path, files))) == cycle


def test_what_is_no_dependency_is_not_counted(tmp_path):
    """A comment or a string naming another module's function and a call to
    one's own functions are no dependency; a function declared in an
    interface header belongs to that header, not to the .c defining it."""
    folder = write(tmp_path, {
        "a.c": '/* envd_b_go, in b.c, calls us back */\nconst char *s = "envd_b_go";\n'
               "void envd_a_run(void)\n{\n    envd_a_run();\n}\n",
        "b.c": '#include "a.h"\nint envd_b_go(void)\n{\n    return 0;\n}\n', "a.h": "",
        "i.h": "int envd_i_make(void);\nvoid envd_i_free(int x);\n",
        "i_one.c": '#include "i.h"\nint envd_i_make(void)\n{\n    return 0;\n}\n'
                   "void envd_i_free(int x)\n{\n}\n"})
    graph = dependencies(folder)
    assert graph == {"a": set(), "b": {"a"}, "i": set(), "i_one": {"i"}}
    assert find_cycle(graph) is None
