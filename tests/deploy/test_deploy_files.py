"""The container and Kubernetes files (deploy/, docker-compose.yml, .dockerignore),
checked without a Docker engine or a cluster.

- The validators: `docker-compose config` (both profiles), `kubernetes-validate
  --strict` (offline schemas, the oldest Kubernetes these files need and the
  newest the validator knows), hadolint.  .ci/run installs them
  (install-validators.sh) and points ENVD_VALIDATORS_BIN at them; missing, a
  test fails in CI and is skipped elsewhere.
- In their place, for what only a real build would show: the files the
  Dockerfile copies pass .dockerignore and build the wheel the image installs.
- What the deploy rests on and a validator cannot see: zero-copy needs the
  trainer in the daemon's IPC namespace, socket folder and uid; probes run
  `envd status` over the ipc socket the daemon serves; CURVE keys come from a
  Secret with safe modes; grace periods outlast the drain; nothing runs as
  root; every ENVD_* variable and flag is one envd reads, and the daemon's
  Config accepts each configuration.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from deploy_files import (
    COMPOSE_FILE,
    DOCKERFILE,
    K8S_DIR,
    ROOT,
    DockerIgnore,
    all_containers,
    compose_environment,
    compose_mounts,
    compose_services,
    compose_size,
    copy_sources,
    dockerfile_env,
    dockerfile_stages,
    effective_security,
    env_values,
    find_tool,
    is_envd_daemon,
    k8s_manifests,
    k8s_resources,
    load_yaml,
    load_yaml_text,
    mounts_by_path,
    pod_labels,
    pod_spec,
    quantity,
    require_tool,
    run_tool,
    volume_at,
    volumes_by_name,
)

#: The image's user; compose and the manifests run daemon and trainers as it.
ENVD_UID = 10001
#: Seconds a drain may take before the container is killed: SIGTERM drains in
#: seconds, and a long step must still finish.
MIN_GRACE_SECONDS = 30
#: The oldest Kubernetes the manifests need (native sidecars: an init
#: container with restartPolicy Always), and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", "1.37.0")
#: The socket both sides share in every example, served by every daemon.
IPC_ENDPOINT = "ipc:///run/envd/envd.sock"
SOCKET_DIR = "/run/envd"
CURVE_VARIABLES = ("ENVD_CURVE_SECRET_KEY", "ENVD_CURVE_ALLOWED_CLIENTS")


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs Python "
                                      ">= 3.11 or tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _clean_env() -> dict[str, str]:
    """This environment without ENVD_* settings, so that a developer's shell
    does not change what compose resolves."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")
            or k == "ENVD_VALIDATORS_BIN"}


# ---- envd itself: what it accepts ------------------------------------------------------------

def _envd_help(*args: str) -> str:
    """The installed `envd` command's help, as the deploy files run it."""
    beside = Path(sys.executable).with_name("envd")
    envd_script = str(beside) if beside.exists() else shutil.which("envd")
    assert envd_script, "the envd command is not installed"
    done = run_tool([envd_script, *args, "--help"], env={**_clean_env(), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def daemon_variables() -> set[str]:
    """Every ENVD_* variable `envd --help` documents (each flag's, ENVD_BIND,
    ENVD_ENDPOINT, ENVD_PLUGINS, ENVD_INSECURE...)."""
    return set(re.findall(r"ENVD_[A-Z0-9_]+", _envd_help()))


@pytest.fixture(scope="module")
def client_variables() -> set[str]:
    """Every ENVD_* variable the installed client side names as a string
    (envd.client and the modules it shares with the daemon)."""
    import envd
    import envd.client
    names: set[str] = set()
    for folder in (Path(envd.__file__).parent, Path(envd.client.__file__).parent):
        for source in folder.glob("*.py"):  # not envd/tools/: the CLI names the daemon's too
            names |= set(re.findall(r"[\"'](ENVD_[A-Z0-9_]+)[\"']", source.read_text()))
    return names


@pytest.fixture(scope="module")
def status_options() -> set[str]:
    return set(re.findall(r"--[a-z][a-z-]*", _envd_help("status"))) - {"--help"}


def _daemon_parser() -> argparse.ArgumentParser:
    from envd.server import config as server_config
    parser = argparse.ArgumentParser(prog="envd", exit_on_error=False)
    server_config.add_arguments(parser)
    return parser


@pytest.fixture(scope="module")
def curve_files(tmp_path_factory) -> dict[str, str]:
    """Real key files for the CURVE variables of the deploy files, whose
    paths exist only inside a container."""
    from envd import keys
    folder = tmp_path_factory.mktemp("curve")
    _, server_secret = keys.generate(folder, "server")
    client_public, _ = keys.generate(folder / "made", "trainer")
    (folder / "clients").mkdir()
    shutil.copy(client_public, folder / "clients" / "trainer.key")
    return {"ENVD_CURVE_SECRET_KEY": str(server_secret),
            "ENVD_CURVE_ALLOWED_CLIENTS": str(folder / "clients")}


# ---- the daemons and clients of every deploy file, in one shape -------------------------

class Process:
    """One daemon or client process the deploy files start: where, its ENVD_*
    environment (values from elsewhere resolved) and its arguments."""

    def __init__(self, where: str, env: dict[str, str], args: list[str]):
        self.where, self.env, self.args = where, env, args

    @property
    def binds(self) -> list[str]:
        bind = self.env.get("ENVD_BIND") or self.env.get("ENVD_ENDPOINT", "")
        return bind.replace(",", " ").split()

    def __repr__(self) -> str:
        return self.where


def _image_env() -> dict[str, str]:
    _, stages = dockerfile_stages()
    return dockerfile_env(stages[-1])


def _image_cmd() -> list[str]:
    _, stages = dockerfile_stages()
    cmd = stages[-1].last("CMD")
    return (cmd.exec_form() or []) if cmd else []


def _compose_is_daemon(service: dict) -> bool:
    entrypoint = service.get("entrypoint")
    return entrypoint in (None, ["envd"]) and not any(
        w in ("list", "status", "keygen") for w in service.get("command") or [])


def _k8s_env(container: dict) -> dict[str, str]:
    """ENVD_* values of a container, resourceFieldRef limits resolved."""
    env = {}
    for name, value in env_values(container).items():
        if isinstance(value, dict) and "resourceFieldRef" in value:
            ref = value["resourceFieldRef"]
            limit = quantity(container["resources"]["limits"][ref["resource"].split(".")[1]])
            value = str(math.ceil(limit / quantity(ref.get("divisor", "1"))))
        env[name] = value
    return env


def daemons() -> list[Process]:
    image_env = _image_env()
    found = [Process("Dockerfile", image_env, _image_cmd())]
    for name, service in compose_services().items():
        if _compose_is_daemon(service):
            found.append(Process(f"docker-compose.yml:{name}",
                                 {**image_env, **compose_environment(service)},
                                 service.get("command") or _image_cmd()))
    for path, resource in k8s_resources():
        spec = pod_spec(resource)
        for container in all_containers(spec) if spec else []:
            if is_envd_daemon(container):
                found.append(Process(f"{path.relative_to(ROOT)}:{container['name']}",
                                     {**image_env, **_k8s_env(container)},
                                     container.get("args", [])))
    return found


def clients() -> list[Process]:
    """Every other container that sets ENVD_* variables (trainers)."""
    found = []
    for name, service in compose_services().items():
        if not _compose_is_daemon(service):
            found.append(Process(f"docker-compose.yml:{name}", compose_environment(service), []))
    for path, resource in k8s_resources():
        spec = pod_spec(resource)
        for container in all_containers(spec) if spec else []:
            env = {k: v for k, v in _k8s_env(container).items() if k.startswith("ENVD_")}
            if not is_envd_daemon(container) and env:
                found.append(Process(f"{path.relative_to(ROOT)}:{container['name']}", env, []))
    return found


def status_checks() -> list[tuple[str, list[str], float, set[str]]]:
    """Every health check and probe: (where, argv, its timeout in seconds,
    the endpoints its daemon serves)."""
    checks = []
    _, stages = dockerfile_stages()
    health = stages[-1].last("HEALTHCHECK")
    options, _, command = health.text.partition("CMD")
    timeout = re.search(r"--timeout=(\d+)s", options)
    image_binds = set(daemons()[0].binds)
    checks.append(("Dockerfile HEALTHCHECK", json.loads(command),
                   float(timeout.group(1)) if timeout else 30.0, image_binds))
    for name, service in compose_services().items():
        if "healthcheck" in service:
            test = service["healthcheck"]["test"]
            assert test[0] == "CMD", f"{name}: healthcheck test must be exec form [\"CMD\", ...]"
            binds = set(Process("", {**_image_env(), **compose_environment(service)}, []).binds)
            checks.append((f"docker-compose.yml:{name}", test[1:],
                           float(service["healthcheck"]["timeout"].rstrip("s")), binds))
    for path, resource in k8s_resources():
        spec = pod_spec(resource)
        for container in all_containers(spec) if spec else []:
            binds = set(Process("", {**_image_env(), **_k8s_env(container)}, []).binds)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in container:
                    checks.append((f"{path.relative_to(ROOT)}:{container['name']}.{probe}",
                                   container[probe]["exec"]["command"],
                                   float(container[probe].get("timeoutSeconds", 1)), binds))
    return checks


# ---- the validators --------------------------------------------------------------------------

@pytest.mark.parametrize("profile", [None, "tcp"])
def test_compose_config_is_valid(profile):
    compose = require_tool("docker-compose")
    argv = [compose, "-f", str(COMPOSE_FILE)] + (["--profile", profile] if profile else [])
    done = run_tool(argv + ["config"], cwd=ROOT, env=_clean_env())
    assert done.returncode == 0, done.stderr
    services = load_yaml_text(done.stdout)[0]["services"]
    assert {"envd", "trainer"} <= set(services)
    if profile:
        assert {"envd-tcp", "trainer-tcp"} <= set(services)
        assert all(services[s]["profiles"] == [profile] for s in ("envd-tcp", "trainer-tcp"))
    # docker-compose resolves what the semantic checks below resolve themselves.
    ours = compose_services()
    for name, service in services.items():
        assert service.get("user") == ours[name].get("user"), name
        assert service.get("ipc") == ours[name].get("ipc"), name


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_are_valid_kubernetes(version):
    validate = require_tool("kubernetes-validate")
    files = [str(p) for p in k8s_manifests()]
    done = run_tool([validate, "--strict", "-k", version, *files], cwd=ROOT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # An unknown apiVersion/kind is only a warning (exit 0): no schema checked it.
    assert "WARN" not in output and "ERROR" not in output, output
    assert output.count("passed for resource") == len(k8s_resources()), output


def test_dockerfile_passes_hadolint():
    hadolint = require_tool("hadolint")
    done = run_tool([hadolint, "--no-color", "--failure-threshold", "style",
                     "--require-label", "org.opencontainers.image.title:text",
                     "--require-label", "org.opencontainers.image.version:text",
                     "--require-label", "org.opencontainers.image.licenses:spdx",
                     str(DOCKERFILE)], cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("folder", ["sidecar", "fleet"])
def test_kustomization_renders(folder):
    """Optional: needs kubectl, which no pip package brings, so it is skipped
    without it (in CI too); the checks below read the kustomizations anyway."""
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not on PATH (optional: kubectl kustomize)")
    done = run_tool([kubectl, "kustomize", str(K8S_DIR / folder)], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rendered = {(d["kind"], d["metadata"]["name"]) for d in load_yaml_text(done.stdout)}
    (kustomization,) = load_yaml(K8S_DIR / folder / "kustomization.yaml")
    listed = {(d["kind"], d["metadata"]["name"])
              for f in kustomization["resources"] for d in load_yaml(K8S_DIR / folder / f)}
    assert rendered == listed


# ---- the Dockerfile --------------------------------------------------------------------------

COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|build-essential|libc6-dev|python3-dev)\b")


def test_dockerfile_builds_in_one_stage_and_runs_without_compiler():
    _, stages = dockerfile_stages()
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    builder, runtime = stages[0], stages[-1]
    assert builder.name == "builder"
    assert runtime.base == builder.base, "the copied venv needs the same Python at the same path"
    assert re.fullmatch(r"python:3\.11-slim(@sha256:[0-9a-f]{64})?", runtime.base)
    assert any(COMPILERS.search(i.text) for i in builder.all("RUN")), "the builder has gcc"
    assert any("pip wheel" in i.text for i in builder.all("RUN")), "the builder builds a wheel"
    for inst in runtime.all("RUN"):
        assert not re.search(r"apt-get install|apk add|pip install", inst.text) \
            or not COMPILERS.search(inst.text), f"line {inst.line}: a compiler in the final stage"
    copies = [copy_sources(i) for i in runtime.all("COPY")]
    from_builder = [(src, dest) for src, dest, flags in copies if flags.get("from") == "builder"]
    assert from_builder == [(["/opt/envd"], "/opt/envd")], "only the venv comes from the builder"


def test_dockerfile_runtime_contract():
    _, stages = dockerfile_stages()
    runtime = stages[-1]
    user = runtime.expand(runtime.last("USER").text)
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == ENVD_UID, \
        f"USER {user}: numeric (runAsNonRoot can check it), non-root, {ENVD_UID}"
    assert gid.isdigit() and int(gid) != 0
    assert runtime.last("ENTRYPOINT").exec_form() == ["envd"]
    assert runtime.last("CMD").exec_form() == [], "no base-image CMD reaches envd"
    assert runtime.last("STOPSIGNAL").text == "SIGTERM"
    assert "5555" in runtime.last("EXPOSE").text.split()
    env = dockerfile_env(runtime)
    assert env["ENVD_ENDPOINT"] == IPC_ENDPOINT
    assert env["PATH"].startswith("/opt/envd/bin:")
    assert "ENVD_BIND" not in env, "the default serves ipc only: tcp needs keys or --insecure"
    # The socket folder exists, owned by the user, closed to others.
    folder = [i for i in runtime.all("RUN") if SOCKET_DIR in i.text]
    assert folder and re.search(r"install -d -o \S+ -g \S+ -m 0?700 /run/envd",
                                runtime.expand(folder[0].text).replace('"', ""))
    labels = " ".join(i.text for i in runtime.all("LABEL"))
    for label in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{label}=" in labels
    assert runtime.args["ENVD_VERSION"] == _pyproject()["project"]["version"]


def test_dockerfile_copies_what_the_wheel_is_built_from():
    """Every source pyproject.toml builds the package from is copied, and
    passes .dockerignore; key files and build outputs do not."""
    _, stages = dockerfile_stages()
    ignore = DockerIgnore()
    copied = {src.rstrip("/") for inst in stages[0].all("COPY")
              for src in copy_sources(inst)[0]}
    project = _pyproject()
    needed = {"pyproject.toml", "setup.py", "MANIFEST.in", project["project"]["readme"]}
    needed |= set(project["tool"]["setuptools"]["package-dir"].values())
    needed |= {re.search(r"\"(\w+)/", (ROOT / "setup.py").read_text()).group(1)}  # cffi module
    assert needed <= copied, f"not copied into the builder: {sorted(needed - copied)}"
    for inst in stages[-1].all("COPY"):
        sources, _, flags = copy_sources(inst)
        copied |= set() if "from" in flags else {s.rstrip("/") for s in sources}
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not ignore.excluded(source), f"{source} is copied but .dockerignore leaves it out"
    for secret in ("deploy/keys/server.key_secret", "deploy/keys/clients/trainer.key",
                   "server.key_secret", "keys/a.key", "native/_envd_native.abi3.so",
                   "native/__pycache__/registry.cpython-311.pyc", ".venv/bin/python",
                   "native/build/temp.linux-x86_64-cpython-311/x.o", "server/.venv/bin/python",
                   "client/venv/bin/python", "src/dist/envd-0.1.0.tar.gz", "build/lib/envd/tools/cli.py",
                   "tests/conftest.py", ".git/config"):
        assert ignore.excluded(secret), f"{secret} would be sent to the builder"


def test_build_context_builds_the_wheel(tmp_path):
    """What stands in for `docker build` here: the builder stage's COPY lines
    applied to the context .dockerignore lets through, then its pip wheel."""
    _, stages = dockerfile_stages()
    ignore = DockerIgnore()
    context = set(ignore.context_files())
    src = tmp_path / "src"
    src.mkdir()
    for inst in stages[0].all("COPY"):
        sources, dest, flags = copy_sources(inst)
        assert "from" not in flags and not dest.startswith("/"), "relative to WORKDIR"
        for source in (s.rstrip("/") for s in sources):
            if source in context:  # a file: into dest/ or as dest
                targets = {source: src / dest / Path(source).name if dest.endswith("/")
                           else src / dest}
            else:  # a folder: its contents into dest
                targets = {f: src / dest / os.path.relpath(f, source)
                           for f in context if f.startswith(source + "/")}
            assert targets, f"COPY {source}: not in the build context"
            for f, target in targets.items():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, target)
    wheels = tmp_path / "wheels"
    done = run_tool([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir",
                     str(wheels), str(src)], timeout=600, env=_clean_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = wheels.glob("envd_rl-*.whl")  # the distribution envd-rl
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    assert any(re.fullmatch(r"envd/native/_envd_native.*\.so", n) for n in names), names
    for module in ("envd/tools/cli.py", "envd/tools/bench.py", "envd/client/__init__.py",
                   "envd/server/daemon.py"):
        assert module in names
    assert re.search(r"^envd = envd\.tools\.cli:main$", entry_points, re.MULTILINE), entry_points


# ---- docker-compose.yml ---------------------------------------------------------------------

def _compose_pairs():
    """(trainer, daemon) service names of each same-host pair."""
    services = compose_services()
    return [(name, s["ipc"].split(":", 1)[1]) for name, s in services.items()
            if str(s.get("ipc", "")).startswith("service:")]


def test_compose_trainer_shares_ipc_socket_and_uid_with_envd():
    services = compose_services()
    pairs = _compose_pairs()
    assert ("trainer", "envd") in pairs
    for trainer_name, daemon_name in pairs:
        trainer, daemon = services[trainer_name], services[daemon_name]
        assert daemon.get("ipc") == "shareable", f"{daemon_name}: others may join its IPC"
        assert compose_size(daemon["shm_size"]) >= 1 << 30, f"{daemon_name}: /dev/shm >= 1 GiB"
        assert "shm_size" not in trainer, f"{trainer_name} uses {daemon_name}'s /dev/shm"
        assert trainer["user"] == daemon["user"], "segments are 0600: one uid"
        uid = trainer["user"].split(":")[0]
        assert uid.isdigit() and int(uid) != 0
        daemon_socket = {m.target: m.source for m in compose_mounts(daemon)}
        trainer_socket = {m.target: m.source for m in compose_mounts(trainer)}
        assert daemon_socket.get(SOCKET_DIR) and \
            daemon_socket[SOCKET_DIR] == trainer_socket.get(SOCKET_DIR)
        assert next(m for m in compose_mounts(daemon) if m.target == SOCKET_DIR).named_volume
        endpoint = compose_environment(trainer)["ENVD_ENDPOINT"]
        daemon_binds = Process("", {**_image_env(), **compose_environment(daemon)}, []).binds
        assert endpoint in daemon_binds and endpoint.startswith(f"ipc://{SOCKET_DIR}/")
        assert trainer["depends_on"][daemon_name]["condition"] == "service_healthy"


def test_compose_user_is_overridable_consistently():
    """ENVD_UID changes the build's user and the services' together."""
    services = compose_services({"ENVD_UID": "1234", "ENVD_GID": "2345"})
    for name, service in services.items():
        assert service["user"] == "1234:2345", name
        assert service["build"]["args"] == {"ENVD_UID": "1234", "ENVD_GID": "2345"}, name


def test_compose_tcp_profile_uses_curve_keys():
    services = compose_services()
    daemon, trainer = services["envd-tcp"], services["trainer-tcp"]
    for name in ("envd-tcp", "trainer-tcp"):
        assert services[name].get("profiles") == ["tcp"], f"{name} only with --profile tcp"
    for name in ("envd", "trainer"):
        assert "profiles" not in services[name]
    env = compose_environment(daemon)
    binds = env["ENVD_BIND"].split()
    assert IPC_ENDPOINT in binds, "the health check asks over ipc"
    tcp = [b for b in binds if b.startswith("tcp://")]
    assert tcp and tcp[0].rsplit(":", 1)[1] == "5555"
    assert "ENVD_INSECURE" not in env
    mounts = {m.target: m for m in compose_mounts(daemon)}
    for variable in CURVE_VARIABLES:
        assert env[variable] in mounts and mounts[env[variable]].read_only, variable
        assert not mounts[env[variable]].named_volume
    assert mounts[env["ENVD_CURVE_SECRET_KEY"]].source.endswith(".key_secret")
    assert "5555:5555" in daemon["ports"]
    trainer_env = compose_environment(trainer)
    assert trainer_env["ENVD_ENDPOINT"] == "tcp://envd-tcp:5555"
    assert "ipc" not in trainer, "another IPC namespace: arrays travel inline over TCP"
    trainer_mounts = {m.target: m for m in compose_mounts(trainer)}
    for variable, suffix in (("ENVD_SERVER_KEY", ".key"), ("ENVD_CLIENT_KEY", ".key_secret")):
        mount = trainer_mounts[trainer_env[variable]]
        assert mount.read_only and mount.source.endswith(suffix), variable
    # Keys generated into the default folder are never committed nor sent to a builder.
    keys = "deploy/keys/server.key_secret"
    assert mounts[env["ENVD_CURVE_SECRET_KEY"]].source == "./" + keys
    assert DockerIgnore().excluded(keys)
    if (ROOT / ".git").exists() and shutil.which("git"):
        for path in (keys, "deploy/keys/clients/a.key"):
            done = run_tool(["git", "check-ignore", "-q", path], cwd=ROOT)
            assert done.returncode == 0, f"git would commit {path}"


def test_compose_daemons_stop_gracefully_and_are_hardened():
    services = compose_services()
    for name, service in services.items():
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert service.get("init") is True, name
        if _compose_is_daemon(service):
            assert service["stop_signal"] == "SIGTERM", name
            grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
            assert grace and int(grace.group(1)) >= MIN_GRACE_SECONDS, name
            assert "healthcheck" in service, name


def _drain_grace(process: Process) -> float:
    """The --drain-grace a deploy file's daemon runs with."""
    from envd.server.config import Config
    args = process.args
    if "--drain-grace" in args:
        return float(args[args.index("--drain-grace") + 1])
    return float(process.env.get("ENVD_DRAIN_GRACE") or Config.drain_grace)


def test_every_daemon_gets_more_time_to_stop_than_its_drain_takes():
    """SIGTERM's drain lets running work finish for --drain-grace, kills what
    still runs in hosted envs, and the daemon exits within SHUTDOWN_SECONDS
    more (issue 38 N3): the grace period of compose and Kubernetes must be
    longer, or the daemon is SIGKILLed mid-drain and its segments stay."""
    from envd.server.daemon import SHUTDOWN_SECONDS
    graces = {}
    for name, service in compose_services().items():
        if _compose_is_daemon(service):
            graces[f"docker-compose.yml:{name}"] = float(
                re.fullmatch(r"(\d+)s", service["stop_grace_period"]).group(1))
    for path, resource in k8s_resources():
        spec = pod_spec(resource)
        for container in all_containers(spec) if spec else []:
            if is_envd_daemon(container):
                graces[f"{path.relative_to(ROOT)}:{container['name']}"] = float(
                    spec.get("terminationGracePeriodSeconds", 30))
    checked = 0
    for process in daemons():
        if process.where in graces:
            needed = _drain_grace(process) + SHUTDOWN_SECONDS
            assert graces[process.where] > needed, (process, graces[process.where], needed)
            checked += 1
    assert checked == len(graces) >= 3, graces


# ---- Kubernetes ------------------------------------------------------------------------------

def _workload(path: str) -> dict:
    (resource,) = [d for d in load_yaml(K8S_DIR / path) if pod_spec(d) is not None]
    return resource


def _container(spec: dict, name: str) -> dict:
    (container,) = [c for c in all_containers(spec) if c["name"] == name]
    return container


def test_every_pod_is_non_root_and_locked_down():
    workloads = [(p, r) for p, r in k8s_resources() if pod_spec(r) is not None]
    assert len(workloads) >= 3
    for path, resource in workloads:
        spec = pod_spec(resource)
        where = f"{path.relative_to(ROOT)}"
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec.get("automountServiceAccountToken") is False, where
        assert spec.get("enableServiceLinks") is False, f"{where}: no injected *_PORT variables"
        for container in all_containers(spec):
            at = f"{where}:{container['name']}"
            uid = effective_security(spec, container, "runAsUser")
            assert uid == ENVD_UID, f"{at}: runs as {uid}"
            assert effective_security(spec, container, "runAsGroup") not in (None, 0), at
            context = container.get("securityContext", {})
            assert context.get("allowPrivilegeEscalation") is False, at
            assert context.get("readOnlyRootFilesystem") is True, at
            assert context.get("capabilities", {}).get("drop") == ["ALL"], at
            assert not context.get("privileged"), at
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), f"{at}: {kind}"
            assert container["image"].split(":")[0] == "envd", at


def _shm_checks(spec: dict, daemon: dict, where: str) -> None:
    """A memory-backed /dev/shm with a size limit, the daemon's shm budget
    within it and within the memory limit its pages are charged to."""
    mount_path, volume = volume_at(spec, daemon, "/dev/shm")
    assert mount_path == "/dev/shm", where
    assert volume["emptyDir"]["medium"] == "Memory", where
    size = quantity(volume["emptyDir"]["sizeLimit"])
    assert size >= 2**30 / 2, f"{where}: /dev/shm of at least 512 MiB"
    budget = int(_k8s_env(daemon)["ENVD_MAX_SHM_BYTES"])
    assert budget <= size, f"{where}: ENVD_MAX_SHM_BYTES over /dev/shm's sizeLimit"
    assert budget < quantity(daemon["resources"]["limits"]["memory"]), \
        f"{where}: segments are charged to the daemon's memory limit"


def _probe_exec(container: dict, probe: str) -> list[str]:
    return container[probe]["exec"]["command"]


def test_sidecar_pod_shares_ipc_socket_shm_and_uid():
    job = _workload("sidecar/trainer-job.yaml")
    spec = pod_spec(job)
    daemon, trainer = _container(spec, "envd"), _container(spec, "trainer")
    assert is_envd_daemon(daemon) and not is_envd_daemon(trainer)
    # A native sidecar: starts first, ends after the trainer so the Job completes.
    assert daemon in spec["initContainers"] and daemon.get("restartPolicy") == "Always"
    assert _probe_exec(daemon, "startupProbe")[:2] == ["envd", "status"]
    assert spec["restartPolicy"] == "Never" and job["kind"] == "Job"
    assert "hostIPC" not in spec, "a pod's containers share IPC already"
    for path in (SOCKET_DIR, "/dev/shm"):
        daemon_volume = volume_at(spec, daemon, path)
        assert daemon_volume is not None and daemon_volume[0] == path
        assert volume_at(spec, trainer, path) == daemon_volume, f"{path} not shared"
    assert "emptyDir" in volume_at(spec, daemon, SOCKET_DIR)[1]
    _shm_checks(spec, daemon, "sidecar")
    assert effective_security(spec, daemon, "runAsUser") == \
        effective_security(spec, trainer, "runAsUser")
    endpoint = _k8s_env(trainer)["ENVD_ENDPOINT"]
    assert endpoint in Process("", _k8s_env(daemon), []).binds
    assert not any(b.startswith("tcp://") for b in Process("", _k8s_env(daemon), []).binds)
    assert spec["terminationGracePeriodSeconds"] >= MIN_GRACE_SECONDS


def test_fleet_serves_curve_tcp_behind_a_headless_service():
    deployment = _workload("fleet/deployment.yaml")
    spec = pod_spec(deployment)
    (daemon,) = [c for c in spec["containers"] if is_envd_daemon(c)]
    env = _k8s_env(daemon)
    binds = Process("", env, []).binds
    assert IPC_ENDPOINT in binds, "the probes ask over ipc"
    (tcp,) = [b for b in binds if b.startswith("tcp://")]
    port = int(tcp.rsplit(":", 1)[1])
    assert "ENVD_INSECURE" not in env and all(env.get(v) for v in CURVE_VARIABLES)
    (container_port,) = daemon["ports"]
    assert container_port["containerPort"] == port

    (service,) = load_yaml(K8S_DIR / "fleet" / "service.yaml")
    assert service["spec"]["clusterIP"] == "None", "headless: one DNS record per daemon"
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == port
    assert service_port["targetPort"] in (port, container_port["name"])

    (policy,) = load_yaml(K8S_DIR / "fleet" / "networkpolicy.yaml")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(deployment).items()
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [port]

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = _probe_exec(daemon, probe)
        assert command[:2] == ["envd", "status"], probe
    assert spec["terminationGracePeriodSeconds"] >= MIN_GRACE_SECONDS
    _shm_checks(spec, daemon, "fleet")
    # One thread per CPU of the limit, and whole CPUs requested as limited.
    assert env["ENVD_THREADS"] == str(math.ceil(quantity(daemon["resources"]["limits"]["cpu"])))
    assert daemon["resources"]["requests"] == daemon["resources"]["limits"], "Guaranteed QoS"
    # CPU-heavy nodes: an affinity or selector, and the toleration of their taint.
    assert spec.get("nodeSelector") or spec["affinity"]["nodeAffinity"]
    assert spec["tolerations"]


def test_fleet_curve_keys_come_from_secrets_with_safe_modes():
    """The daemon reads its keys from files an init container copied out of
    the Secrets (a Secret volume cannot hand a non-root uid a 0600 file), in
    a memory-backed volume only this pod sees."""
    spec = pod_spec(_workload("fleet/deployment.yaml"))
    (daemon,) = [c for c in spec["containers"] if is_envd_daemon(c)]
    env = _k8s_env(daemon)
    secrets = {d["metadata"]["name"]: d for d in load_yaml(K8S_DIR / "fleet" / "secrets.template.yaml")}
    (copier,) = spec["initContainers"]
    script = " ".join(copier["command"])
    assert "umask 077" in script, "copies readable by their owner only"
    for variable in CURVE_VARIABLES:
        mount_path, volume = volume_at(spec, daemon, env[variable])
        assert volume["emptyDir"]["medium"] == "Memory", variable
        assert mounts_by_path(daemon)[mount_path].get("readOnly") is True
        copier_mount = [m for m in copier["volumeMounts"] if m["name"] == volume["name"]]
        assert copier_mount, f"{variable}: nothing fills {mount_path}"
        inside = copier_mount[0]["mountPath"] + env[variable][len(mount_path):]
        assert inside in script, f"the init container does not write {inside}"
    volumes = volumes_by_name(spec)
    copied_from = [volumes[m["name"]] for m in copier["volumeMounts"]
                   if "secret" in volumes[m["name"]]]
    assert {v["secret"]["secretName"] for v in copied_from} == \
        {"envd-curve-server", "envd-curve-clients"}
    for volume in copied_from:
        mode = volume["secret"]["defaultMode"]
        assert mode & 0o007 == 0 and mode & 0o200 == 0, f"{volume['name']}: mode {mode:o}"
        assert volume["secret"]["secretName"] in secrets
    assert "server.key_secret" in secrets["envd-curve-server"]["stringData"]
    assert "server.key_secret" in script
    assert all(k.endswith(".key") for k in secrets["envd-curve-clients"]["stringData"])
    # Placeholders, which the daemon refuses, never a real key.
    for secret in secrets.values():
        for value in secret["stringData"].values():
            assert value.startswith("REPLACE"), value
            assert "secret-key" not in value and "public-key" not in value


def test_fleet_trainer_connects_to_every_daemon_with_keys():
    spec = pod_spec(_workload("fleet/trainer-job.yaml"))
    trainer = _container(spec, "trainer")
    env = env_values(trainer)
    (service,) = load_yaml(K8S_DIR / "fleet" / "service.yaml")
    port = service["spec"]["ports"][0]["port"]
    assert env["ENVD_ENDPOINT"] == \
        f"dns+tcp://{service['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local:{port}"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    names = [e["name"] for e in trainer["env"]]
    assert names.index("POD_NAMESPACE") < names.index("ENVD_ENDPOINT"), "$(VAR) needs it first"
    (copier,) = spec["initContainers"]
    script = " ".join(copier["command"])
    assert "umask 077" in script
    for variable in ("ENVD_SERVER_KEY", "ENVD_CLIENT_KEY"):
        _, volume = volume_at(spec, trainer, env[variable])
        assert volume["emptyDir"]["medium"] == "Memory"
        assert Path(env[variable]).name in script
    (policy,) = load_yaml(K8S_DIR / "fleet" / "networkpolicy.yaml")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= _workload("fleet/trainer-job.yaml")["spec"]["template"][
        "metadata"]["labels"].items(), "the NetworkPolicy would block the example trainer"


def test_kustomizations_list_the_workloads_but_never_the_secret_template():
    for folder in ("sidecar", "fleet"):
        (kustomization,) = load_yaml(K8S_DIR / folder / "kustomization.yaml")
        resources = kustomization["resources"]
        for name in resources:
            assert (K8S_DIR / folder / name).is_file(), name
        assert "secrets.template.yaml" not in resources, "would overwrite real keys"
        images = {i["name"] for i in kustomization.get("images", [])}
        used = {c["image"].split(":")[0] for f in resources
                for d in load_yaml(K8S_DIR / folder / f) if pod_spec(d)
                for c in all_containers(pod_spec(d))}
        assert used <= images, f"{folder}: kustomize cannot retarget {used - images}"
    (fleet,) = load_yaml(K8S_DIR / "fleet" / "kustomization.yaml")
    assert {"deployment.yaml", "service.yaml"} <= set(fleet["resources"])


# ---- everything: settings envd accepts ----------------------------------------------------

def test_every_daemon_variable_is_one_envd_reads(daemon_variables):
    assert {"ENVD_BIND", "ENVD_ENDPOINT", "ENVD_THREADS"} <= daemon_variables
    found = daemons()
    assert len(found) >= 5, found
    for process in found:
        unknown = {k for k in process.env if k.startswith("ENVD_")} - daemon_variables
        assert not unknown, f"{process}: envd --help knows no {sorted(unknown)}"


def test_every_client_variable_is_one_the_client_reads(client_variables):
    found = clients()
    assert len(found) >= 4, found
    for process in found:
        unknown = set(process.env) - client_variables
        assert not unknown, f"{process}: the envd client reads no {sorted(unknown)}"
        assert process.env.get("ENVD_ENDPOINT"), f"{process}: says where the daemon is"


def test_every_daemon_configuration_is_accepted(curve_files):
    """The daemon's own Config (flags and ENVD_* variables, as `envd` builds
    it) accepts every configuration, CURVE key files standing in for the
    mounted ones.  A tcp bind reachable from the network without keys or
    --insecure would fail here, as the daemon would refuse to start."""
    from envd.server import config as server_config
    for process in daemons():
        environ = dict(process.env)
        if any(v in environ for v in CURVE_VARIABLES):
            assert all(v in environ for v in CURVE_VARIABLES), process
            environ.update(curve_files)
        try:
            args, unknown = _daemon_parser().parse_known_args(process.args)
            assert not unknown, f"{process}: envd has no flag {unknown}"
            config = server_config.from_args(args, environ=environ)
        except (ValueError, argparse.ArgumentError) as exc:
            pytest.fail(f"{process}: envd would refuse to start: {exc}")
        assert IPC_ENDPOINT in config.bind, f"{process}: health checks ask over {IPC_ENDPOINT}"
        if any(b.startswith("tcp://") for b in config.bind):
            assert config.curve, f"{process}: tcp without CURVE"


def test_health_checks_ask_envd_status_over_the_daemons_ipc_socket(status_options):
    checks = status_checks()
    assert len(checks) >= 7, checks
    for where, argv, check_timeout, binds in checks:
        assert argv[:2] == ["envd", "status"], where
        options = argv[2:]
        given = {o for o in options if o.startswith("--")}
        assert given <= status_options, f"{where}: envd status has no {given - status_options}"
        endpoint = options[options.index("--endpoint") + 1]
        assert endpoint.startswith("ipc://"), f"{where}: ipc needs no CURVE keys"
        assert endpoint in binds, f"{where}: asks {endpoint}, the daemon serves {binds}"
        status_timeout = float(options[options.index("--timeout") + 1]) \
            if "--timeout" in options else 5.0
        assert status_timeout < check_timeout, \
            f"{where}: envd status --timeout {status_timeout} must end before the check's " \
            f"{check_timeout} s, or a slow answer reads as a killed probe"


def test_example_trainer_steps_through_the_daemon_at_envd_endpoint(daemon, tmp_path):
    """The script the compose file and the manifests run, as they run it:
    the endpoint from ENVD_ENDPOINT; zero-copy here (same host, uid, /dev/shm)."""
    done = run_tool([sys.executable, str(ROOT / "examples" / "compose_trainer.py"),
                     "--num-envs", "16", "--steps", "50", "--wait", "10"],
                    cwd=tmp_path, timeout=120,  # not the checkout: its envd/ would shadow
                    env={**_clean_env(), "ENVD_ENDPOINT": daemon.endpoint})
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"CartPole-v1: 50 steps x 16 envs in \S+ s = [\d,]+ env steps/s; "
                        r"\d+ episodes, mean return \S+; transport shm", last), last


def test_deployment_guide_covers_the_files():
    """docs/deployment.md names every file and the commands these rest on."""
    guide = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    for needed in ("deploy/Dockerfile", "docker-compose.yml", "deploy/k8s/sidecar",
                   "deploy/k8s/fleet", "secrets.template.yaml", "envd keygen",
                   "dns+tcp://envd-fleet.", "--profile tcp", "shm_size", "ipc: shareable",
                   "kubectl rollout restart", "podman build --format docker",
                   "podman healthcheck run", "--ipc container:envd", "default_ulimits",
                   "PYTHON_IMAGE", "tests/deploy/base_image.py"):
        assert needed in guide, needed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/deployment.md" in readme
