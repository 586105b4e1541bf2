#!/usr/bin/env bash
# Smoke-test a built envd-rl wheel as a user without a C compiler gets it:
# install it into a fresh virtualenv whose PATH holds no compiler (CC points
# nowhere, and only binary wheels are allowed, so a source build of envd or of
# a dependency fails loudly), then step an env in-process, start the daemon,
# step an env through it and ask `envd status`.
#
#     bash tests/packaging/wheel_smoke.sh dist/envd_rl-*.whl
#
# Exits non-zero on the first failure.  Nothing is left behind: the daemon is
# stopped and the scratch folder (virtualenv, socket) removed on exit.
set -euo pipefail

wheel="$(realpath "${1:?usage: wheel_smoke.sh WHEEL}")"
[ -f "$wheel" ] || { echo "wheel_smoke: no wheel at $wheel" >&2; exit 1; }
python="${PYTHON:-python3}"
python="$(command -v "$python")"

workdir="$(mktemp -d)"
daemon_pid=""
cleanup() {
    status=$?
    if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf "$workdir"
    exit "$status"
}
trap cleanup EXIT

# /usr/bin without compilers: links to every other program there.  (On this
# Debian /bin is /usr/bin.)  The names cover gcc, cc, c++, cpp, clang, tcc
# and the target-prefixed drivers (x86_64-linux-gnu-gcc-12, ...).
nocc="$workdir/usr-bin-without-compilers"
mkdir "$nocc"
compiler='^(cc|c\+\+|c89|c99|c89-gcc|c99-gcc|cpp|gcc|g\+\+|clang|clang\+\+|tcc|icc)(-[0-9.]+)?$|-(gcc|g\+\+|cpp|cc|c\+\+|clang)(-[0-9.]+)?$'
for program in /usr/bin/*; do
    name="$(basename "$program")"
    [[ "$name" =~ $compiler ]] || ln -s "$program" "$nocc/$name"
done

venv="$workdir/venv"
"$python" -m venv "$venv"
# The environment every later step runs in: nothing inherited but HOME (pip's
# cache) and the pip configuration variables, PATH = the venv's bin + $nocc.
clean_env=(env -i HOME="${HOME:-/root}" PATH="$venv/bin:$nocc" CC=/nonexistent CXX=/nonexistent)
[ -n "${PIP_CONFIG_FILE:-}" ] && clean_env+=(PIP_CONFIG_FILE="$PIP_CONFIG_FILE")
[ -n "${XDG_RUNTIME_DIR:-}" ] && clean_env+=(XDG_RUNTIME_DIR="$XDG_RUNTIME_DIR")
run() { "${clean_env[@]}" "$@"; }

# No compiler is reachable in that environment (this is what makes the check mean something).
sys_cc="$("$venv/bin/python" -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])')"
for tool in cc gcc c++ g++ clang "$sys_cc"; do
    if run bash -c "command -v '$tool'" >/dev/null 2>&1; then
        echo "wheel_smoke: a compiler ($tool) is still on the smoke test's PATH" >&2
        exit 1
    fi
done
echo "wheel_smoke: no compiler on PATH (cc, gcc, c++, g++, clang, $sys_cc not found); CC=/nonexistent"

cd "$workdir"  # away from any checkout: `import envd` must find the installed package
run python -m pip install --quiet --disable-pip-version-check --only-binary=:all: "$wheel"

run python - <<'PY'
import importlib.metadata, importlib.resources, sys
import numpy as np
import envd
assert envd.__file__.startswith(sys.prefix), f"envd imported from {envd.__file__}, not the venv"
assert (importlib.resources.files("envd") / "py.typed").is_file(), "py.typed not installed"
assert importlib.metadata.version("envd-rl") == envd.__version__
with envd.make("CartPole-v1", num_envs=8, seed=0) as env:
    obs, _ = env.reset(seed=0)
    obs, rew, term, trunc, _ = env.step(np.zeros(8, dtype=np.int64))
    assert obs.shape == (8, 4) and obs.dtype == np.float32 and rew.shape == (8,), (obs.shape, rew.shape)
print(f"wheel_smoke: in-process step ok (envd {envd.__version__} from {envd.__file__})")
PY

# Plugin authors compile against the installed header (docs/writing-envs.md).
include_dir="$(run python -m envd.native --include)"
[ -f "$include_dir/envd.h" ] || { echo "wheel_smoke: no envd.h in $include_dir" >&2; exit 1; }
echo "wheel_smoke: envd.h installed in $include_dir"

endpoint="ipc://$workdir/envd.sock"
# Not through run(): $! must be the daemon itself (env execs it), not a subshell.
"${clean_env[@]}" envd --bind "$endpoint" --threads 2 >"$workdir/daemon.log" 2>&1 &
daemon_pid=$!
# Wait for the daemon to answer (a loaded machine may be slow to start it).
deadline=$((SECONDS + 120))
until run envd status --endpoint "$endpoint" --timeout 2 >/dev/null 2>&1; do
    if ! kill -0 "$daemon_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        echo "wheel_smoke: the daemon did not come up; its log:" >&2
        cat "$workdir/daemon.log" >&2
        exit 1
    fi
    sleep 0.5
done
echo "wheel_smoke: daemon up at $endpoint"

run env ENDPOINT="$endpoint" python - <<'PY'
import os
import numpy as np
import envd
with envd.connect(os.environ["ENDPOINT"]) as client, \
        client.make("CartPole-v1", num_envs=4, seed=0) as env:
    env.reset(seed=0)
    obs, rew, term, trunc, _ = env.step(np.ones(4, dtype=np.int64))
    assert obs.shape == (4, 4) and rew.shape == (4,), (obs.shape, rew.shape)
print("wheel_smoke: client step through the daemon ok")
PY

run envd status --endpoint "$endpoint" --timeout 10
run envd status --endpoint "$endpoint" --timeout 10 --json >"$workdir/status.json"
run python -c "import json,sys; s=json.load(open(sys.argv[1])); assert isinstance(s, dict) and s, s" \
    "$workdir/status.json"

kill -TERM "$daemon_pid"
daemon_status=0
wait "$daemon_pid" || daemon_status=$?
daemon_pid=""
if [ "$daemon_status" -ne 0 ]; then
    echo "wheel_smoke: the daemon exited with $daemon_status on SIGTERM; its log:" >&2
    cat "$workdir/daemon.log" >&2
    exit 1
fi
echo "wheel_smoke: ok ($(basename "$wheel"))"
