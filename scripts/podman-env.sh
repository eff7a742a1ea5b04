# shellcheck shell=bash
# Sourced (not run) by scripts/build-image.sh and scripts/test.d/40-image.sh: points podman at a
# fixed storage root of its own, so that its layer cache survives between runs (CI caches
# ~/.cache/libreyolo-server), and with settings that work on a root machine without systemd,
# cgroup v2 delegation or CAP_SYS_RESOURCE (a CI runner or a container):
#   storage driver vfs (no overlay mounts needed; it keeps a full copy of every layer, so budget
#   disk), runtime runc (crun fails on hybrid cgroups), cgroupfs, events in a file, ulimits that
#   such a machine may grant, and no registry at all: short names resolve to local images only.
# Environment: LIBREYOLO_CONTAINERS (default ~/.cache/libreyolo-server/containers) is the root:
#   storage/ (images and layers), run/ (transient state), tmp/ (build temporaries and the
#   `RUN --mount=type=cache` folders), conf/ (the files below, rewritten on every source).
# Defines: libreyolo_podman_bases DEBIAN_TAG — imports debian:TAG and debian:TAG-slim from
#   debootstrap when they are not in the storage yet (the only way in without a registry).

LIBREYOLO_CONTAINERS=${LIBREYOLO_CONTAINERS:-$HOME/.cache/libreyolo-server/containers}
mkdir -p "$LIBREYOLO_CONTAINERS"/{storage,run,tmp,conf}
cat > "$LIBREYOLO_CONTAINERS/conf/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$LIBREYOLO_CONTAINERS/run/events.log"
tmp_dir = "$LIBREYOLO_CONTAINERS/run/libpod"
EOF
cat > "$LIBREYOLO_CONTAINERS/conf/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$LIBREYOLO_CONTAINERS/storage"
runroot = "$LIBREYOLO_CONTAINERS/run/storage"
EOF
cat > "$LIBREYOLO_CONTAINERS/conf/registries.conf" <<EOF
unqualified-search-registries = []
short-name-mode = "permissive"
EOF
export CONTAINERS_CONF=$LIBREYOLO_CONTAINERS/conf/containers.conf
export CONTAINERS_STORAGE_CONF=$LIBREYOLO_CONTAINERS/conf/storage.conf
export CONTAINERS_REGISTRIES_CONF=$LIBREYOLO_CONTAINERS/conf/registries.conf
# buildah keeps `RUN --mount=type=cache` folders and layer temporaries under TMPDIR.
export TMPDIR=$LIBREYOLO_CONTAINERS/tmp

libreyolo_podman_bases() {
  local tag=${1:?usage: libreyolo_podman_bases DEBIAN_TAG}
  if podman image exists "debian:$tag" && podman image exists "debian:$tag-slim"; then
    return 0
  fi
  command -v debootstrap >/dev/null || { echo "podman-env: debootstrap not found (scripts/setup.sh installs it)" >&2; return 1; }
  local rootfs
  rootfs=$(mktemp -d "$LIBREYOLO_CONTAINERS/tmp/rootfs.XXXXXX")
  echo "podman-env: debootstrap bookworm into $rootfs (once; the images stay in $LIBREYOLO_CONTAINERS/storage)"
  if ! debootstrap --variant=minbase bookworm "$rootfs" >"$rootfs.log" 2>&1; then
    tail -20 "$rootfs.log" >&2
    rm -rf "$rootfs" "$rootfs.log"
    return 1
  fi
  rm -f "$rootfs.log"
  chmod 0755 "$rootfs"  # mktemp made it 0700: it becomes the image's "/"
  # The suites Docker's debian images list (debootstrap writes only the release itself): point
  # and security updates reach the builder's packages and so the libraries the image ships.
  cat > "$rootfs/etc/apt/sources.list" <<'SOURCES'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
  # What Docker's debian images also leave out: package caches and lists (apt-get update refills).
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  # The image configuration Docker's debian images carry (an import has none: no PATH at all).
  local change=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
                --change 'CMD ["bash"]')
  tar -C "$rootfs" -c . | podman import --quiet "${change[@]}" - "debian:$tag" >/dev/null
  # -slim: the same files less documentation, manual pages and translations (what Debian's
  # slim images drop through dpkg path-exclude rules; the runtime stage installs nothing).
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/groff/* "$rootfs"/usr/share/lintian/*
  tar -C "$rootfs" -c . | podman import --quiet "${change[@]}" - "debian:$tag-slim" >/dev/null
  rm -rf "$rootfs"
  echo "podman-env: imported debian:$tag and debian:$tag-slim"
}
