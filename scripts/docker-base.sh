#!/usr/bin/env bash
# Builds the registry-free Debian base image for docker/Dockerfile (BASE_IMAGE), for machines
# that cannot pull from a registry:
#
#   bash scripts/docker-base.sh [NAME]          # default NAME: local/debian:bookworm
#   docker build -f docker/Dockerfile --build-arg BASE_IMAGE=local/debian:bookworm -t pscluster-node .
#
# debootstrap (minbase, plus ca-certificates) from the Debian mirror apt already uses, then
# `docker import`. Needs root, debootstrap and a docker client that reaches a daemon (DOCKER_HOST
# is honoured). Measured on our 2-core machines: 25-70 s, a 117 MB image.
set -euo pipefail
name=${1:-local/debian:bookworm}
suite=${PSCLUSTER_DEBIAN_SUITE:-bookworm}
docker=${DOCKER:-/usr/bin/docker}
[ -x "$docker" ] || docker=$(command -v docker) || { echo "docker-base: no docker client (apt-get install docker.io)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "docker-base: debootstrap needs root" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "docker-base: debootstrap is missing (apt-get install debootstrap)" >&2; exit 2; }

mirror=${PSCLUSTER_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
fi
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

rootfs=$(mktemp -d /var/tmp/pscluster-debootstrap.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "docker-base: debootstrap $suite from $mirror" >&2
debootstrap --variant=minbase --include=ca-certificates "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
  tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
# apt inside the image uses the same mirror; no caches in the image.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | "$docker" import -c 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "docker-base: $name imported" >&2
