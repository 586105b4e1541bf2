"""Readers for the deploy files that tests/deploy checks: the Dockerfile, its
.dockerignore, docker-compose.yml and the Kubernetes manifests, plus where the
external validators are.

Nothing here needs Docker or a cluster.  YAML is read with PyYAML when the
test environment has it, else through the validators' Python (python-yaml in
ENVD_VALIDATORS_BIN, see install-validators.sh).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S_DIR = ROOT / "deploy" / "k8s"

#: Validators .ci/run installs (tests/deploy/install-validators.sh).
VALIDATORS = ("docker-compose", "kubernetes-validate", "hadolint")


# ---- validators --------------------------------------------------------------------------

def in_ci() -> bool:
    """CI sets CI (.ci/run exports CI=true): a missing validator fails there."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_tool(name: str) -> str | None:
    """name in ENVD_VALIDATORS_BIN first, then on PATH; None if in neither."""
    bin_dir = os.environ.get("ENVD_VALIDATORS_BIN")
    if bin_dir:
        found = shutil.which(name, path=bin_dir)
        if found:
            return found
    return shutil.which(name)


def require_tool(name: str) -> str:
    """The path of validator name.  Missing: the test fails in CI (where
    .ci/run installs every validator) and is skipped elsewhere, saying how to
    get it."""
    found = find_tool(name)
    if found:
        return found
    message = (f"{name} not found in ENVD_VALIDATORS_BIN "
               f"({os.environ.get('ENVD_VALIDATORS_BIN') or 'unset'}) or on PATH; install the "
               "validators with `bash tests/deploy/install-validators.sh DIR` and set "
               "ENVD_VALIDATORS_BIN=DIR/bin")
    if in_ci():
        pytest.fail(message + " (CI is set: .ci/run should have installed it)")
    pytest.skip(message)


def run_tool(argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                          **kwargs)


# ---- YAML ----------------------------------------------------------------------------------

_YAML_TO_JSON = ("import json, sys, yaml\n"
                 "json.dump(list(yaml.safe_load_all(sys.stdin)), sys.stdout)\n")


def load_yaml_text(text: str) -> list:
    """The documents of a YAML text (None documents dropped); a fresh copy
    each time, so that a caller may change it."""
    return copy.deepcopy(_load_yaml_text(text))


@functools.cache
def _load_yaml_text(text: str) -> list:
    try:
        import yaml
    except ImportError:
        python = require_tool("python-yaml")
        done = run_tool([python, "-c", _YAML_TO_JSON], input=text)
        assert done.returncode == 0, done.stderr
        documents = json.loads(done.stdout)
    else:
        documents = list(yaml.safe_load_all(text))
    return [d for d in documents if d is not None]


def load_yaml(path: Path) -> list:
    return load_yaml_text(path.read_text(encoding="utf-8"))


# ---- Dockerfile ----------------------------------------------------------------------------

@dataclass
class Instruction:
    keyword: str          # upper case: FROM, RUN, COPY...
    text: str             # the rest, continuation lines joined
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (CMD ["a", "b"]), else None."""
        text = self.text.strip()
        if not text.startswith("["):
            return None
        return json.loads(text)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def expand(self, text: str) -> str:
        """${NAME} and $NAME replaced by the stage's ARG defaults."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                      lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)), text)


def dockerfile_instructions(text: str) -> list[Instruction]:
    """Instructions with their continuation lines joined; comment lines (also
    inside a continued instruction, as Docker drops them) removed."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), rest.strip(), start))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def dockerfile_stages(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages in order)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for inst in dockerfile_instructions(path.read_text(encoding="utf-8")):
        if inst.keyword == "FROM":
            words = inst.text.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)),
                          words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
            continue
        if inst.keyword == "ARG":
            name, _, default = inst.text.partition("=")
            target = stages[-1].args if stages else global_args
            target[name.strip()] = stages[-1].expand(default) if stages else default
            if not stages:
                continue
        assert stages, f"line {inst.line}: {inst.keyword} before the first FROM"
        stages[-1].instructions.append(inst)
    return global_args, stages


def dockerfile_env(stage: Stage) -> dict[str, str]:
    """The ENV variables a stage sets (KEY=VALUE form), ARGs expanded."""
    env: dict[str, str] = {}
    for inst in stage.all("ENV"):
        for word in shlex.split(inst.text):
            key, sep, value = word.partition("=")
            assert sep, f"line {inst.line}: use ENV KEY=VALUE"
            env[key] = stage.expand(value)
    return env


def copy_sources(inst: Instruction) -> tuple[list[str], str, dict[str, str]]:
    """(sources, destination, --flags) of a COPY instruction."""
    words = inst.exec_form() or shlex.split(inst.text)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return words[:-1], words[-1], flags


# ---- .dockerignore ------------------------------------------------------------------------

def _glob_regex(pattern: str) -> str:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return out


class DockerIgnore:
    """Docker's .dockerignore rules: a path is left out of the build context
    when the last pattern that matches it or one of its parent folders is not
    a `!` exception."""

    def __init__(self, path: Path = DOCKERIGNORE):
        self.rules: list[tuple[bool, re.Pattern, str]] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = os.path.normpath(line[1:].strip() if keep else line).lstrip("/")
            self.rules.append((keep, re.compile(_glob_regex(pattern) + r"\Z"), pattern))

    def excluded(self, path: str) -> bool:
        parts = Path(path).parts
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        excluded = False
        for keep, regex, _ in self.rules:
            if any(regex.match(p) for p in prefixes):
                excluded = not keep
        return excluded

    def may_include_below(self, folder: str) -> bool:
        """Whether an exception pattern could bring back something in folder."""
        return any(keep and (pattern.startswith(folder + "/") or "*" in pattern)
                   for keep, _, pattern in self.rules)

    def context_files(self, root: Path = ROOT) -> list[str]:
        """Every file of root that goes into the build context (relative paths)."""
        files = []
        for folder, dirs, names in os.walk(root):
            rel = os.path.relpath(folder, root)
            rel = "" if rel == "." else rel
            dirs[:] = [d for d in dirs if d != ".git" and not (
                self.excluded(os.path.join(rel, d))
                and not self.may_include_below(os.path.join(rel, d)))]
            files += [p for p in (os.path.join(rel, n) for n in names) if not self.excluded(p)]
        return sorted(files)


# ---- docker-compose.yml --------------------------------------------------------------------

_COMPOSE_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?:(:?-)([^}]*))?\}|\$(\w+)")


def compose_interpolate(value, environ: dict[str, str]):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and $$, recursively."""
    if isinstance(value, dict):
        return {k: compose_interpolate(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [compose_interpolate(v, environ) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if m.group(2) == ":-":
            return environ.get(name) or m.group(3)
        if m.group(2) == "-":
            return environ.get(name, m.group(3))
        return environ.get(name, "")
    return _COMPOSE_VARIABLE.sub(one, value)


def compose_services(environ: dict[str, str] | None = None) -> dict[str, dict]:
    """docker-compose.yml's services, YAML merges applied and variables set
    from environ (default: none set, so every default applies)."""
    (document,) = load_yaml(COMPOSE_FILE)
    return compose_interpolate(document["services"], environ or {})


def compose_environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


@dataclass
class ComposeMount:
    source: str
    target: str
    read_only: bool

    @property
    def named_volume(self) -> bool:
        return not self.source.startswith((".", "/", "~"))


def compose_mounts(service: dict) -> list[ComposeMount]:
    mounts = []
    for item in service.get("volumes") or []:
        if isinstance(item, dict):
            mounts.append(ComposeMount(item.get("source", ""), item["target"],
                                       bool(item.get("read_only"))))
            continue
        parts = item.split(":")
        mode = parts[2] if len(parts) > 2 else "rw"
        mounts.append(ComposeMount(parts[0], parts[1], "ro" in mode.split(",")))
    return mounts


# ---- Kubernetes ---------------------------------------------------------------------------

def k8s_manifests() -> list[Path]:
    """Every Kubernetes resource file (not the kustomizations)."""
    return sorted(p for p in K8S_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")


def k8s_resources() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in k8s_manifests() for doc in load_yaml(path)]


def pod_spec(resource: dict) -> dict | None:
    """The pod template's spec of a workload (Deployment, Job, DaemonSet...)."""
    kind = resource.get("kind")
    if kind == "Pod":
        return resource["spec"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return resource["spec"]["template"]["spec"]
    if kind == "CronJob":
        return resource["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def pod_labels(resource: dict) -> dict:
    return resource["spec"]["template"]["metadata"].get("labels", {})


def all_containers(spec: dict) -> list[dict]:
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def is_envd_daemon(container: dict) -> bool:
    """A container that runs the daemon: the image's entrypoint (envd) with no
    command of its own and no subcommand."""
    command = container.get("command")
    args = container.get("args", [])
    if command and command[:1] != ["envd"]:
        return False
    words = (command or ["envd"])[1:] + args
    return not any(w in ("list", "status", "keygen") for w in words)


def effective_security(spec: dict, container: dict, key: str):
    """A container's securityContext key, else the pod's."""
    value = (container.get("securityContext") or {}).get(key)
    return value if value is not None else (spec.get("securityContext") or {}).get(key)


def env_values(container: dict) -> dict[str, object]:
    """name -> value, or the valueFrom mapping where the value comes from elsewhere."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts_by_path(container: dict) -> dict[str, dict]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volumes_by_name(spec: dict) -> dict[str, dict]:
    return {v["name"]: v for v in spec.get("volumes", [])}


def volume_at(spec: dict, container: dict, path: str) -> tuple[str, dict] | None:
    """(mount path, volume) of the container's mount holding path, the deepest one."""
    best = None
    for mount_path, mount in mounts_by_path(container).items():
        inside = path == mount_path or path.startswith(mount_path.rstrip("/") + "/")
        if inside and (best is None or len(mount_path) > len(best[0])):
            best = (mount_path, volumes_by_name(spec)[mount["name"]])
    return best


_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 1e-3, "": 1}


def quantity(value) -> float:
    """A Kubernetes quantity ("512Mi", "2", "500m") as a number."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert m and m.group(2) in _QUANTITY, f"unknown quantity {value!r}"
    return float(m.group(1)) * _QUANTITY[m.group(2)]


def compose_size(value: str) -> int:
    """A compose byte size ("2gb", "512m") in bytes."""
    m = re.fullmatch(r"([0-9]+)\s*([bkmg]?)b?", str(value).strip().lower())
    assert m, f"unknown size {value!r}"
    return int(m.group(1)) * {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]
