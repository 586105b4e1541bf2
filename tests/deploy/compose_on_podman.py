"""docker-compose.yml's services run with plain podman commands, for
tests/deploy/test_containers.py.

Why not podman-compose: neither Debian bookworm's podman-compose 1.0.3 nor
PyPI's 1.6.0 passes a service's ``ipc`` on to podman (checked in their
sources), so the trainer would silently get an IPC namespace of its own and
the arrays would travel inline.  With podman 4.3 (bookworm) podman-compose
also skips ``condition: service_healthy``, and without systemd nothing runs
health checks on a schedule: this module runs them itself.  So this module reads the compose file itself (through
deploy_files.compose_services, variables applied) and turns each key into the
podman flag with the same meaning.  A key it does not know fails loudly: a
new key in docker-compose.yml must be taught here, never dropped.

Podman on hosts like these CI machines (no systemd, hybrid cgroups, no
CAP_SYS_RESOURCE) needs the runc runtime, the cgroupfs manager and ulimits at
or below the host's.  They go into a containers.conf of this run
(``CONTAINERS_CONF``), so that pods' infra containers get them too.

Every name a Project creates starts with its unique name, and close()
removes them all, on failure too.
"""
from __future__ import annotations

import json
import os
import re
import resource
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from deploy_files import COMPOSE_FILE, compose_environment, compose_mounts

#: podman's nproc default is above what runc may set on these machines (4096
#: works, 50000 does not, although the host's limit is 96364); the daemon and
#: its trainers need a few dozen.
NPROC_LIMIT = 4096
#: nofile where the host has no limit (podman's own default).
NOFILE_UNLIMITED = 1048576
#: Seconds a container gets to pass its health check: the compose file's
#: start_period plus a margin for a loaded 2-core machine.
HEALTHY_WITHIN = 120.0


class PodmanError(AssertionError):
    """A podman command failed (an AssertionError: the test failed, with why)."""


def host_settings() -> str:
    """containers.conf text: runc where it is installed, cgroupfs without
    systemd, and ulimits no higher than this process's (podman's defaults
    are higher, and raising a limit inside the container is refused)."""
    nofile, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc_soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    nofile = NOFILE_UNLIMITED if nofile == resource.RLIM_INFINITY else nofile
    nproc = NPROC_LIMIT if nproc_soft == resource.RLIM_INFINITY else min(nproc_soft, NPROC_LIMIT)
    lines = ["[containers]",
             f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]',
             "[engine]"]
    if shutil.which("runc"):
        lines.append('runtime = "runc"')
    if not Path("/run/systemd/system").is_dir():
        lines.append('cgroup_manager = "cgroupfs"')
    return "\n".join(lines) + "\n"


class Podman:
    """The podman command with this run's containers.conf."""

    def __init__(self, executable: str, workdir: Path):
        conf = workdir / "containers.conf"
        conf.write_text(host_settings(), encoding="utf-8")
        self.executable = executable
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True,
                 input: str | None = None) -> subprocess.CompletedProcess:
        argv = [self.executable, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  env=self.env, input=input, check=False)
        except subprocess.TimeoutExpired as exc:
            raise PodmanError(f"{' '.join(argv)}: no answer within {timeout} s") from exc
        if check and done.returncode != 0:
            raise PodmanError(f"{' '.join(argv)} exited {done.returncode}:\n"
                              f"{done.stdout[-3000:]}\n{_quiet(done.stderr)[-3000:]}")
        return done

    def inspect(self, name: str, template: str) -> str:
        return self("inspect", "--format", template, name).stdout.strip()


def _quiet(stderr: str) -> str:
    """stderr without podman's complaint, on every run of a container with a
    health check, that no systemd is there to schedule it."""
    return "\n".join(line for line in stderr.splitlines()
                     if "unable to get systemd connection" not in line)


def _seconds(duration: str) -> int:
    """A compose duration ('60s', '1m30s', '15s') in whole seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([hms])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * units[u] for n, u in parts)


def _shm_size(size: str) -> str:
    """compose's '2gb' as podman's '2g'."""
    match = re.fullmatch(r"(\d+)\s*([bkmg]?)b?", str(size).lower())
    assert match, f"shm_size {size!r}"
    return match.group(1) + match.group(2)


class Project:
    """One run of docker-compose.yml's services under a unique name.

    services: deploy_files.compose_services(environ), variables applied.
    image: the tag that stands for the services' ``image`` (build_image
    built it under a name of this run, not compose's envd:0.1.0).
    """

    #: Keys of a service this translates (see container_args); others fail.
    KNOWN_KEYS = frozenset({"build", "image", "user", "init", "read_only", "tmpfs", "cap_drop",
                            "security_opt", "ipc", "shm_size", "stop_signal", "stop_grace_period",
                            "restart", "healthcheck", "environment", "volumes", "depends_on",
                            "entrypoint", "command", "profiles", "ports"})

    def __init__(self, podman: Podman, services: dict[str, dict], image: str):
        self.podman = podman
        self.services = services
        self.image = image
        self.name = f"envd-test-{secrets.token_hex(4)}"
        self.network = f"{self.name}_default"
        self.containers: list[str] = []
        self.volumes: list[str] = []
        self.pods: list[str] = []
        self.network_created = False
        self.pause_images: set[str] | None = None  # podman's before our first pod
        self.started: dict[str, str] = {}  # service -> its latest container

    # ---- names ------------------------------------------------------------------------
    def container(self, service: str) -> str:
        return f"{self.name}-{service}"

    def volume(self, name: str) -> str:
        return f"{self.name}_{name}"

    # ---- translation ------------------------------------------------------------------
    def container_args(self, service: str, *, name: str, ipc: str | None = None,
                       pod: str | None = None,
                       entrypoint: list[str] | None = None) -> list[str]:
        """`podman run` flags (before the image) for service, as compose would
        run it, in a container called name.  ipc and entrypoint, when given,
        replace the service's.  pod puts the container in that pod, which then
        holds its network and IPC namespaces and /dev/shm (as a Kubernetes Pod
        does), in place of the service's network, ipc, shm_size and ports.
        Creates the project's named volumes the service mounts, on first use."""
        spec = self.services[service]
        unknown = set(spec) - self.KNOWN_KEYS
        assert not unknown, f"{service}: compose keys {sorted(unknown)} have no podman " \
                            "translation in compose_on_podman.py yet"
        args = ["--name", name]
        if pod:
            args += ["--pod", pod]
        else:
            args += ["--network", self.network, "--network-alias", service]
        if "user" in spec:
            args += ["--user", spec["user"]]
        if spec.get("init"):
            args.append("--init")
        if spec.get("read_only"):
            args.append("--read-only")
        for path in _as_list(spec.get("tmpfs")):
            args += ["--tmpfs", path]
        for cap in spec.get("cap_drop", []):
            args += ["--cap-drop", cap]
        for option in spec.get("security_opt", []):
            args += ["--security-opt", option]
        ipc = spec.get("ipc") if ipc is None else ipc
        if ipc and not pod:
            if ipc.startswith("service:"):
                joined = ipc.split(":", 1)[1]
                ipc = "container:" + self.started.get(joined, self.container(joined))
            args += ["--ipc", ipc]
        if "shm_size" in spec and not pod:
            args += ["--shm-size", _shm_size(spec["shm_size"])]
        if "stop_signal" in spec:
            args += ["--stop-signal", spec["stop_signal"]]
        if "stop_grace_period" in spec:
            args += ["--stop-timeout", str(_seconds(spec["stop_grace_period"]))]
        if "restart" in spec:
            args += ["--restart", spec["restart"]]
        args += self._healthcheck_args(spec.get("healthcheck"))
        for key, value in compose_environment(spec).items():
            args += ["--env", f"{key}={value}"]
        for mount in compose_mounts(spec):
            if mount.named_volume:
                source = self.volume(mount.source)
                if source not in self.volumes:
                    self.podman("volume", "create", source)
                    self.volumes.append(source)
            else:
                source = str((COMPOSE_FILE.parent / mount.source).resolve())
            args += ["--volume", f"{source}:{mount.target}" + (":ro" if mount.read_only else "")]
        for port in [] if pod else spec.get("ports", []):
            # Published on a free host port, never the fixed one: other tests
            # and agents on this host may hold it.  The container side is kept.
            args += ["--publish", "127.0.0.1::" + str(port).rsplit(":", 1)[-1]]
        entrypoint = _as_list(spec.get("entrypoint")) if entrypoint is None else entrypoint
        if entrypoint:
            args += ["--entrypoint", json.dumps(entrypoint)]
        return args

    @staticmethod
    def _healthcheck_args(check: dict | None) -> list[str]:
        if not check:
            return []
        test = check["test"]
        assert test[0] == "CMD", "exec-form health checks only"
        args = ["--health-cmd", json.dumps(test[1:])]
        for key, flag in (("interval", "--health-interval"), ("timeout", "--health-timeout"),
                          ("start_period", "--health-start-period")):
            if key in check:
                args += [flag, f"{_seconds(check[key])}s"]
        if "retries" in check:
            args += ["--health-retries", str(check["retries"])]
        return args

    # ---- lifecycle --------------------------------------------------------------------
    def up(self, service: str, *, name: str | None = None, command: list[str] | None = None,
           entrypoint: list[str] | None = None, ipc: str | None = None,
           pod: str | None = None, extra: Sequence[str] = (), detach: bool = True,
           timeout: float = 300) -> subprocess.CompletedProcess:
        """Start service in a container called name (default: the service's
        container) once its service_healthy dependencies are healthy.
        command, entrypoint, ipc and pod as in container_args; extra: more
        podman flags.  detach=False runs it to completion (then removes the
        container) and returns the result, whatever the exit status."""
        for dependency, condition in (self.services[service].get("depends_on") or {}).items():
            if condition.get("condition") == "service_healthy":
                self.wait_healthy(self.started.get(dependency, self.container(dependency)))
        if not self.network_created and not pod:
            self.podman("network", "create", self.network)
            self.network_created = True
        name = name or self.container(service)
        self.containers.append(name)
        self.started[service] = name
        argv = ["run", "--detach" if detach else "--rm",
                *self.container_args(service, name=name, ipc=ipc, pod=pod, entrypoint=entrypoint),
                *extra, self.image,
                *(self.services[service].get("command") or [] if command is None else command)]
        return self.podman(*argv, timeout=timeout, check=detach)

    def wait_healthy(self, container: str, within: float = HEALTHY_WITHIN) -> float:
        """Run a container's health check until it passes (no systemd here to
        schedule it); returns the seconds that took.  Fails with the logs.
        container: a container name, or a service (its container)."""
        name = self.container(container) if container in self.services else container
        start = time.monotonic()
        while True:
            if self.podman("healthcheck", "run", name, check=False).returncode == 0:
                status = self.podman.inspect(name, "{{.State.Health.Status}}")
                assert status == "healthy", status
                return time.monotonic() - start
            if time.monotonic() - start > within:
                raise PodmanError(f"{name} not healthy within {within} s:\n{self.logs(name)}")
            time.sleep(1.0)

    def logs(self, container: str) -> str:
        done = self.podman("logs", container, check=False)
        return done.stdout + _quiet(done.stderr)

    def shm_listing(self, container: str) -> list[str]:
        """The names in /dev/shm as a running container sees it."""
        return sorted(self.podman("exec", container, "ls", "-A", "/dev/shm").stdout.split())

    def create_pod(self, pod: str, *args: str) -> str:
        """A pod of this project (podman pod create ARGS); its name."""
        name = f"{self.name}-{pod}"
        if self.pause_images is None:
            self.pause_images = self._pause_images()
        self.pods.append(name)
        self.podman("pod", "create", "--name", name, *args)
        return name

    def leftovers(self) -> list[str]:
        """Containers, pods, volumes and networks of this project still there."""
        found = []
        for kind in ("container", "pod", "volume", "network"):
            listing = self.podman(kind, "ls", *(["--all"] if kind == "container" else []),
                                  "--format", "{{.Name}}" if kind != "container" else
                                  "{{.Names}}", check=False).stdout.split()
            found += [f"{kind} {n}" for n in listing if n.startswith(self.name)]
        return found

    def close(self) -> None:
        """Remove everything this project created (containers first)."""
        for name in reversed(self.containers):
            self.podman("rm", "--force", "--time", "0", "--ignore", name, check=False)
        for name in self.pods:
            self.podman("pod", "rm", "--force", "--ignore", name, check=False)
        for name in self.volumes:
            self.podman("volume", "rm", "--force", name, check=False)
        if self.network_created:
            self.podman("network", "rm", "--force", self.network, check=False)
        if self.pause_images is not None:  # podman builds its pods' infra image on first use
            for image in self._pause_images() - self.pause_images:
                self.podman("rmi", "--force", image, check=False)

    def _pause_images(self) -> set[str]:
        return set(self.podman("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter",
                               "reference=localhost/podman-pause", check=False).stdout.split())


def build_image(podman: Podman, services: dict[str, dict], tag: str,
                python_image: str | None) -> float:
    """Build the services' image as compose would (their build section:
    context, dockerfile, args) as tag, on python_image when given; returns
    the seconds it took.  --network host: the build's pip reaches the package
    index as the host does.  --format docker: OCI images drop HEALTHCHECK.
    --layers=false: no intermediate images are left behind."""
    builds = {json.dumps(s["build"], sort_keys=True) for s in services.values() if "build" in s}
    assert len(builds) == 1, "every service builds the one image"
    build = json.loads(builds.pop())
    args = ["build", "--network", "host", "--format", "docker", "--layers=false",
            "--file", str(COMPOSE_FILE.parent / build["dockerfile"]), "--tag", tag]
    for key, value in (build.get("args") or {}).items():
        args += ["--build-arg", f"{key}={value}"]
    if python_image:
        args += ["--build-arg", f"PYTHON_IMAGE={python_image}"]
    start = time.monotonic()
    podman(*args, str((COMPOSE_FILE.parent / build["context"]).resolve()), timeout=900)
    return time.monotonic() - start


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
