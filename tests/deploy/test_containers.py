"""The image built and run for real with podman: deploy/Dockerfile, and the
services of docker-compose.yml wired as the file wires them
(compose_on_podman.py says why plain podman commands and not podman-compose).

- The daemon container runs as its non-root user, without a compiler in the
  image, and passes its health check (the compose service's and the image's
  own).
- A trainer sharing its IPC namespace and socket volume steps over shared
  memory, bit-identical to in-process (step_digest.py); one in another IPC
  namespace gets the inline transport, still bit-identical.
- The tcp profile: CURVE between two containers and through the published
  port from this host; a key the daemon does not know is refused.
- `podman stop` drains: exit 0, no segment left in the shared /dev/shm.
- `podman kill` leaves segments behind in a /dev/shm that outlives the daemon
  (a pod, as deploy/k8s/sidecar's); the restarted daemon removes them.  As
  compose wires it, a start after a kill gets a fresh /dev/shm instead.
- The build context podman sends is what .dockerignore's emulation in
  deploy_files.py (which test_deploy_files.py relies on) says.

Needs root, podman and a base image: the image ENVD_CONTAINER_BASE names
(.ci/run builds one with install-podman.sh), else a base built here with
debootstrap.  Without them the tests are skipped, saying why; with CI set
they fail instead.  ENVD_CONTAINER_TIMINGS=FILE appends each
step's seconds and the image size to FILE.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path

import base_image
import pytest
import step_digest
from compose_on_podman import Podman, Project, build_image
from deploy_files import ROOT, DockerIgnore, compose_services, in_ci
from step_digest import in_process_digest

import envd

pytestmark = pytest.mark.timeout(1200)

#: The image's user (deploy/Dockerfile, docker-compose.yml).
ENVD_UID = 10001
#: Where the trainer containers find step_digest.py, and the mount that puts it there.
DIGEST_SCRIPT = "/opt/envd-test/step_digest.py"
DIGEST_MOUNT = ["--volume", f"{ROOT / 'tests' / 'deploy' / 'step_digest.py'}:{DIGEST_SCRIPT}:ro"]
#: (env id, envs, steps): discrete and continuous actions, episodes that end.
DIGEST_RUNS = [("CartPole-v1", 64, 300), ("Pendulum-v1", 16, 250)]
SEGMENT = re.compile(r"envd-\d+-[0-9a-f]+-\w+")
LOCK = re.compile(r"\.envd-\d+-[0-9a-f]+\.lock")


def _unavailable(reason: str):
    """Skip, saying why; in CI (which installs podman) fail instead."""
    if in_ci():
        pytest.fail(reason + " (CI is set: .ci/run installs podman and builds the base)")
    pytest.skip(reason)


def _record(what: str, value: str) -> None:
    path = os.environ.get("ENVD_CONTAINER_TIMINGS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{what}: {value}\n")


@pytest.fixture(scope="module")
def podman(tmp_path_factory) -> Podman:
    executable = shutil.which("podman")
    if executable is None:
        _unavailable("podman is not installed (tests/deploy/install-podman.sh installs it)")
    if os.geteuid() != 0:
        _unavailable("needs root: the containers run as uid 10001, and the test hands them key "
                     "files that uid owns (rootless podman would map it to another host uid)")
    engine = Podman(executable, tmp_path_factory.mktemp("podman"))
    done = engine("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    if done.returncode != 0:
        _unavailable(f"podman cannot run here: {done.stderr.strip()[-500:]}")
    return engine


@pytest.fixture(scope="module")
def base(podman):
    """The base image to build on: ENVD_CONTAINER_BASE, else one built now."""
    given = os.environ.get("ENVD_CONTAINER_BASE")
    if given:
        assert podman("image", "exists", given, check=False).returncode == 0, \
            f"ENVD_CONTAINER_BASE={given}: no such image (build it with " \
            "python tests/deploy/base_image.py NAME)"
        yield given
        return
    if shutil.which("debootstrap") is None:
        _unavailable("no base image: set ENVD_CONTAINER_BASE to one (python:3.11-slim where "
                     "a registry is reachable), or install debootstrap to build one")
    name = f"localhost/envd-test-base-{secrets.token_hex(4)}:bookworm"
    try:
        seconds = base_image.build(name, podman.executable)
        _record("base image (debootstrap + import)", f"{seconds:.0f} s")
        yield name
    finally:
        podman("rmi", "--force", name, check=False)


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory) -> Path:
    """ENVD_KEYS_DIR as docs/deployment.md lays it out, owned by the image's
    user (key files are mode 0600), plus a stranger's pair the daemon does not
    admit."""
    from envd import keys
    folder = tmp_path_factory.mktemp("keys")
    keys.generate(folder, "server")
    keys.generate(folder, "trainer")
    keys.generate(folder / "stranger", "stranger")
    (folder / "clients").mkdir()
    shutil.copy(folder / "trainer.key", folder / "clients" / "trainer.key")
    folder.chmod(0o755)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, ENVD_UID, ENVD_UID)
    return folder


@pytest.fixture(scope="module")
def services(keys_dir) -> dict[str, dict]:
    """docker-compose.yml's services with every default, keys from keys_dir."""
    return compose_services({"ENVD_KEYS_DIR": str(keys_dir)})


@pytest.fixture(scope="module")
def image(podman, base, services):
    tag = f"localhost/envd-test-{secrets.token_hex(4)}:0.1.0"
    try:
        _record("image build", f"{build_image(podman, services, tag, base):.0f} s")
        size = int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout)
        _record("image size", f"{size / 1e6:.0f} MB (on {base})")
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


@pytest.fixture
def project(request, podman, image, services):
    """One test's containers; removed afterwards, and checked to be gone."""
    stack = Project(podman, services, image)
    start = time.monotonic()
    try:
        yield stack
    finally:
        stack.close()
        _record(request.node.name, f"{time.monotonic() - start:.0f} s")
    assert stack.leftovers() == []


def _digest_in(stack: Project, service: str, env_id: str, num_envs: int, steps: int,
               **up_kwargs) -> dict:
    """step_digest.py run in a one-off container of service (its wiring,
    this entrypoint); its JSON line."""
    done = stack.up(service, name=f"{stack.container(service)}-{secrets.token_hex(3)}",
                    entrypoint=["python", DIGEST_SCRIPT],
                    command=["--env-id", env_id, "--num-envs", str(num_envs),
                             "--steps", str(steps)],
                    extra=DIGEST_MOUNT, detach=False, **up_kwargs)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hold_session(stack: Project, service: str, name: str, **kwargs) -> None:
    """A trainer container that makes a session, steps it and keeps it open."""
    stack.up(service, name=name, entrypoint=["python", DIGEST_SCRIPT],
             command=["--num-envs", "32", "--steps", "10", "--hold"],
             extra=DIGEST_MOUNT, **kwargs)
    deadline = time.monotonic() + 120
    while True:
        lines = [line for line in stack.logs(name).splitlines() if line.startswith("{")]
        if lines:
            break
        state = stack.podman.inspect(name, "{{.State.Status}}")
        assert state == "running" and time.monotonic() < deadline, \
            f"{name} ({state}) made no session:\n{stack.logs(name)}"
        time.sleep(0.5)
    assert json.loads(lines[0])["transport"] == "shm", lines[0]


def _envd_entries(listing: list[str]) -> tuple[list[str], list[str]]:
    """(segments, lock files) of envd daemons in a /dev/shm listing."""
    return ([n for n in listing if SEGMENT.fullmatch(n)],
            [n for n in listing if LOCK.fullmatch(n)])


# ---- the build context -----------------------------------------------------------------------

def test_build_context_is_what_dockerignore_lets_through(podman, base, tmp_path):
    """The files podman sends to a build of this repository are the ones
    deploy_files.DockerIgnore computes (which the static tests check for
    keys, virtualenvs and build outputs)."""
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text(f"FROM {base}\nCOPY . /context\n"
                             "RUN cd /context && find . -type f -printf '>%P\\n'\n")
    iid = tmp_path / "image-id"
    try:
        done = podman("build", "--network", "none", "--layers=false", "--file",
                      str(containerfile), "--iidfile", str(iid), str(ROOT), timeout=300)
    finally:
        if iid.exists():
            podman("rmi", "--force", iid.read_text().strip(), check=False)
    sent = sorted(line[1:] for line in done.stdout.splitlines() if line.startswith(">"))
    assert sent == DockerIgnore().context_files()
    assert not [f for f in sent if re.search(r"(^|/)(\.?venv|build|dist|__pycache__)/|\.key", f)]


# ---- the daemon ------------------------------------------------------------------------------

def test_daemon_container_runs_as_its_user_and_passes_its_health_check(project):
    project.up("envd")
    _record("daemon healthy after", f"{project.wait_healthy('envd'):.1f} s")
    name = project.container("envd")
    processes = project.podman("top", name, "huser", "user", "args").stdout.splitlines()[1:]
    assert any("envd" in p.split(None, 2)[2] for p in processes), processes
    for process in processes:
        host_user, user, _ = process.split(None, 2)
        assert (host_user, user) == (str(ENVD_UID), "envd"), processes
    owner = project.podman("exec", name, "stat", "-c", "%u %a", "/run/envd").stdout.split()
    assert owner == [str(ENVD_UID), "700"]
    # Clients in the image find the daemon at ENVD_ENDPOINT without being told.
    status = project.podman("exec", name, "envd", "status").stdout
    assert re.match(r"envd \S+ +pid \d+ .* sessions 0", status), status

    # The builder compiled the native core; the image carries no compiler.
    compilers = project.podman("exec", name, "sh", "-c",
                               "command -v gcc cc c99 x86_64-linux-gnu-gcc || true").stdout
    assert compilers.strip() == "", compilers
    # The image's own HEALTHCHECK, as `docker run IMAGE` gets it.
    plain = f"{project.name}-plain"
    project.containers.append(plain)
    project.podman("run", "--detach", "--name", plain, project.image, "--threads", "1")
    config = json.loads(project.podman("image", "inspect", "--format",
                                       "{{json .HealthCheck}}", project.image).stdout)
    assert config["Test"][:3] == ["CMD", "envd", "status"], config
    project.wait_healthy(plain)
    assert project.podman.inspect(plain, "{{.Config.User}}") == f"{ENVD_UID}:{ENVD_UID}"


# ---- trainers on the same host ---------------------------------------------------------------

def test_trainer_sharing_ipc_and_socket_steps_over_shm_bit_identically(project):
    project.up("envd")
    done = project.up("trainer", name=f"{project.container('trainer')}-example", detach=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("transport shm"), done.stdout
    for env_id, num_envs, steps in DIGEST_RUNS:
        got = _digest_in(project, "trainer", env_id, num_envs, steps)
        assert got == {"digest": in_process_digest(env_id, num_envs, steps, 0),
                       "transport": "shm"}, env_id


def test_trainer_in_another_ipc_namespace_gets_inline_transport(project):
    project.up("envd")
    for env_id, num_envs, steps in DIGEST_RUNS:
        got = _digest_in(project, "trainer", env_id, num_envs, steps, ipc="private")
        assert got == {"digest": in_process_digest(env_id, num_envs, steps, 0),
                       "transport": "inline"}, env_id


# ---- the tcp profile -------------------------------------------------------------------------

def test_tcp_profile_serves_curve_between_two_containers(project, keys_dir):
    project.up("envd-tcp")
    done = project.up("trainer-tcp", name=f"{project.container('trainer-tcp')}-example",
                      detach=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("transport inline"), done.stdout
    env_id, num_envs, steps = DIGEST_RUNS[0]
    got = _digest_in(project, "trainer-tcp", env_id, num_envs, steps)
    assert got == {"digest": in_process_digest(env_id, num_envs, steps, 0),
                   "transport": "inline"}

    # The published port: this host steps through it with the trainer's keys
    # (inline: the host's /dev/shm is not the container's).
    published = project.podman("port", project.container("envd-tcp"), "5555/tcp").stdout.split()
    assert published and published[0].startswith("127.0.0.1:"), published
    with envd.connect(f"tcp://{published[0]}", timeout=30.0,
                      server_key=str(keys_dir / "server.key"),
                      client_key=str(keys_dir / "trainer.key_secret")) as client, \
            client.make(env_id, num_envs=num_envs, seed=0) as env:
        assert env.transport == "inline"
        assert step_digest.digest(env, steps, 0) == got["digest"]

    # A key pair the daemon does not admit fails the handshake.
    stranger = project.up(
        "trainer-tcp", name=f"{project.container('trainer-tcp')}-stranger", detach=False,
        command=["--num-envs", "4", "--steps", "1", "--wait", "0"],
        extra=["--volume", f"{keys_dir / 'stranger'}:/run/secrets/stranger:ro",
               "--env", "ENVD_CLIENT_KEY=/run/secrets/stranger/stranger.key_secret"])
    assert stranger.returncode != 0
    assert "AuthenticationError" in stranger.stderr, stranger.stdout + stranger.stderr


# ---- stopping ----------------------------------------------------------------------------------

def test_podman_stop_drains_with_exit_0_and_leaves_no_segment(project):
    project.up("envd")
    holder = f"{project.container('trainer')}-holder"
    _hold_session(project, "trainer", holder)
    segments, locks = _envd_entries(project.shm_listing(holder))
    assert len(segments) == 1 and len(locks) == 1, project.shm_listing(holder)

    name = project.container("envd")
    start = time.monotonic()
    project.podman("stop", "--time", "60", name, timeout=90)
    _record("podman stop (drain)", f"{time.monotonic() - start:.1f} s")
    assert project.podman.inspect(name, "{{.State.ExitCode}}") == "0", project.logs(name)
    logs = project.logs(name)
    assert "SIGTERM: draining" in logs and "envd stopped" in logs, logs
    # The trainer still sees the /dev/shm it shared with the daemon.
    assert _envd_entries(project.shm_listing(holder)) == ([], []), project.shm_listing(holder)


def test_podman_kill_leaves_segments_that_the_restarted_daemon_removes(project):
    """In a pod, as deploy/k8s/sidecar runs it, /dev/shm belongs to the pod
    and outlives a daemon container killed with SIGKILL."""
    pod = project.create_pod("sidecar", "--share", "ipc,net,uts",
                             "--shm-size", "256m")
    daemon = f"{pod}-envd"
    project.up("envd", name=daemon, pod=pod)
    project.wait_healthy(daemon)
    holder = f"{pod}-holder"
    _hold_session(project, "trainer", holder, pod=pod)
    before = _envd_entries(project.shm_listing(holder))
    assert len(before[0]) == 1 and len(before[1]) == 1, before

    project.podman("kill", daemon)
    project.podman("wait", daemon, timeout=60)
    assert project.podman.inspect(daemon, "{{.State.ExitCode}}") == "137"
    assert _envd_entries(project.shm_listing(holder)) == before, "stale after the kill"

    start = time.monotonic()
    project.podman("start", daemon)
    project.wait_healthy(daemon)
    _record("restart after kill, healthy after", f"{time.monotonic() - start:.1f} s")
    segments, locks = _envd_entries(project.shm_listing(holder))
    assert segments == [] and len(locks) == 1 and locks != before[1], (segments, locks)
    assert f"removed 1 segment(s) left behind by dead daemons: {before[0][0]}" \
        in project.logs(daemon)
    # And the restarted daemon serves zero-copy again.
    env_id, num_envs, steps = DIGEST_RUNS[0]
    got = _digest_in(project, "trainer", env_id, num_envs, steps, pod=pod)
    assert got == {"digest": in_process_digest(env_id, num_envs, steps, 0), "transport": "shm"}


def test_compose_daemon_killed_and_started_again_serves_new_trainers_over_shm(project):
    """As docker-compose.yml wires them, /dev/shm belongs to the daemon's
    container: a start after a kill gets a fresh one, without the dead
    daemon's segments.  A trainer that joined the old one keeps it (and its
    segments, until it exits): docs/deployment.md says to restart trainers
    with the daemon.  A new trainer gets zero-copy again."""
    project.up("envd")
    name = project.container("envd")
    holder = f"{project.container('trainer')}-holder"
    _hold_session(project, "trainer", holder)
    before = _envd_entries(project.shm_listing(holder))
    assert len(before[0]) == 1, before

    project.podman("kill", name)
    project.podman("wait", name, timeout=60)
    project.podman("start", name)
    project.wait_healthy(name)
    segments, locks = _envd_entries(project.shm_listing(name))
    assert segments == [] and len(locks) == 1 and locks != before[1], (segments, locks)
    assert _envd_entries(project.shm_listing(holder)) == before
    env_id, num_envs, steps = DIGEST_RUNS[0]
    got = _digest_in(project, "trainer", env_id, num_envs, steps)
    assert got == {"digest": in_process_digest(env_id, num_envs, steps, 0), "transport": "shm"}
