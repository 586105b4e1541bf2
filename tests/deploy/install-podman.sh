#!/usr/bin/env bash
# Install podman (with the runc runtime) and debootstrap from this machine's
# apt, then build the Python base image NAME that tests/deploy/test_containers.py
# builds deploy/Dockerfile on (base_image.py: Debian bookworm from the same apt
# mirror, since no image registry is reachable here).  Needs root (or sudo).
#
# Usage: tests/deploy/install-podman.sh NAME     (.ci/run calls it)
# Then:  ENVD_CONTAINER_BASE=NAME pytest tests/deploy/test_containers.py
set -euo pipefail
cd "$(dirname "$0")/../.."

name="${1:?usage: $0 IMAGE_NAME}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

start=$SECONDS
# runc: crun refuses these machines' hybrid cgroups.  catatonit: `init: true`.
# netavark and aardvark-dns: a network whose containers find each other by name;
# iptables: netavark sets the network up with it (a machine without it failed
# every networked container with "netavark: No such file or directory").
packages=(podman runc debootstrap catatonit netavark aardvark-dns iptables)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q ' installed$' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi
echo "podman $(podman version --format '{{.Client.Version}}') and debootstrap installed in $((SECONDS - start)) s"

$sudo "$(command -v python3)" tests/deploy/base_image.py "$name"
