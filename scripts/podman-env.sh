# shellcheck shell=bash
# Sourced (not run) by scripts/build-image.sh and scripts/test.d/40-image.sh: points podman at a
# fixed storage root of its own, so that its layer cache survives between runs (CI caches
# ~/.cache/libreyolo-server), and with settings that work on a root machine without systemd,
# cgroup v2 delegation or CAP_SYS_RESOURCE (a CI runner or a container):
#   storage driver overlay where this kernel lets us mount an overlay (a layer holds only its
#   diff), else vfs (no mounts needed, but every layer is a full copy of its image: a CPU image
#   build then peaks at about 22 GB of disk, measured with scripts/test.d/40-image.sh), runtime
#   runc (crun fails on hybrid cgroups), cgroupfs, events in a file, ulimits that such a machine
#   may grant, and no registry at all: short names resolve to local images only.
# Environment: LIBREYOLO_CONTAINERS (default ~/.cache/libreyolo-server/containers) is the root:
#   storage/ (vfs) or storage-overlay/ (images and layers), run/ (transient state), tmp/ (build
#   temporaries and the `RUN --mount=type=cache` folders), conf/ (the files below, rewritten on
#   every source). LIBREYOLO_PODMAN_DRIVER=overlay|vfs skips the probe.
# Defines: LIBREYOLO_PODMAN_DRIVER and libreyolo_podman_storage (the driver in use and its
#   graphroot); libreyolo_podman_bases DEBIAN_TAG — imports debian:TAG and debian:TAG-slim from
#   debootstrap when they are not in the storage yet (the only way in without a registry);
#   libreyolo_podman_prune (below) — removes what no tagged image needs.

LIBREYOLO_CONTAINERS=${LIBREYOLO_CONTAINERS:-$HOME/.cache/libreyolo-server/containers}
mkdir -p "$LIBREYOLO_CONTAINERS"/{run,tmp,conf}
# The probe: the mount podman's overlay driver makes (root, native overlayfs, no fuse).
libreyolo_podman_overlay_works() {
  local probe ok=1
  probe=$(mktemp -d "$LIBREYOLO_CONTAINERS/tmp/overlay-probe.XXXXXX") || return 1
  mkdir -p "$probe"/{lower,upper,work,merged}
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
       "$probe/merged" 2>/dev/null; then
    if umount "$probe/merged" 2>/dev/null || umount -l "$probe/merged" 2>/dev/null; then ok=0; fi
  fi
  rm -rf "$probe" 2>/dev/null || true
  return $ok
}
LIBREYOLO_PODMAN_DRIVER=${LIBREYOLO_PODMAN_DRIVER:-}
if [ -z "$LIBREYOLO_PODMAN_DRIVER" ]; then
  # An overlay store in use stays in use (a probe that fails once, e.g. on a full disk, must
  # not move the builds to an empty vfs store needing four times the space); else the probe.
  if [ -d "$LIBREYOLO_CONTAINERS/storage-overlay/overlay-images" ] || libreyolo_podman_overlay_works; then
    LIBREYOLO_PODMAN_DRIVER=overlay
  else
    LIBREYOLO_PODMAN_DRIVER=vfs
  fi
fi
case $LIBREYOLO_PODMAN_DRIVER in
  overlay) libreyolo_podman_storage=$LIBREYOLO_CONTAINERS/storage-overlay ;;
  vfs) libreyolo_podman_storage=$LIBREYOLO_CONTAINERS/storage ;;
  *) echo "podman-env: LIBREYOLO_PODMAN_DRIVER must be overlay or vfs, got '$LIBREYOLO_PODMAN_DRIVER'" >&2; return 1 ;;
esac
mkdir -p "$libreyolo_podman_storage"
cat > "$LIBREYOLO_CONTAINERS/conf/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$LIBREYOLO_CONTAINERS/run/events.log"
tmp_dir = "$LIBREYOLO_CONTAINERS/run/libpod-$LIBREYOLO_PODMAN_DRIVER"
EOF
cat > "$LIBREYOLO_CONTAINERS/conf/storage.conf" <<EOF
[storage]
driver = "$LIBREYOLO_PODMAN_DRIVER"
graphroot = "$libreyolo_podman_storage"
runroot = "$LIBREYOLO_CONTAINERS/run/$(basename "$libreyolo_podman_storage")"
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
  echo "podman-env: debootstrap bookworm into $rootfs (once; the images stay in $libreyolo_podman_storage)"
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

# libreyolo_podman_prune: frees what no tagged image needs. Leftovers fill a disk within a few
# runs, with vfs (every layer a full copy of its image: 2-3 GB for the builders) in one or two:
#  - buildah working containers (named ...-working-container[-N]) that an interrupted or failed
#    build left behind, each holding a copy of its step's image;
#  - untagged images that are no tagged image's ancestor: the build stages' COPY . / RUN images
#    of earlier runs and toolchains that a setup.sh change replaced. A build stage that no tagged
#    image descends from (the builder: the runtime stage only COPY --from's it) is pruned too,
#    so a caller that wants the builder cached tags it (scripts/test.d/40-image.sh tags
#    TAG-toolchain);
#  - the vfs store once overlay replaced it, unless a container of it still exists.
# A tagged image's ancestors (the parent chain, metadata steps included) stay: they are its
# build cache, and buildah matches each step against them (history alone lists <missing>).
# Prints what it removed and the space left; never fails the caller (sourced by set -euo
# pipefail scripts), and a podman listing that fails removes nothing.
libreyolo_podman_prune() {
  local containers listing keep id removed=0
  containers=$(podman ps -a --external --format '{{.ID}} {{.Names}}' 2>/dev/null |
    awk '$2 ~ /-working-container(-[0-9]+)?$/ {print $1}') || true
  for id in $containers; do podman rm -f "$id" >/dev/null 2>&1 && removed=$((removed + 1)); done
  if [ "$removed" -gt 0 ]; then echo "podman-env: removed $removed leftover build containers"; fi
  if [ "$LIBREYOLO_PODMAN_DRIVER" = overlay ] && [ -d "$LIBREYOLO_CONTAINERS/storage" ]; then
    local vfs_in_use
    vfs_in_use=$(podman --storage-driver vfs --root "$LIBREYOLO_CONTAINERS/storage" \
      --runroot "$LIBREYOLO_CONTAINERS/run/storage" ps -a --external -q 2>/dev/null) || vfs_in_use=unknown
    if [ -z "$vfs_in_use" ]; then
      echo "podman-env: removing the vfs image storage ($(du -sh "$LIBREYOLO_CONTAINERS/storage" 2>/dev/null | cut -f1)): overlay replaced it"
      rm -rf "$LIBREYOLO_CONTAINERS/storage" "$LIBREYOLO_CONTAINERS/run/storage" \
        "$LIBREYOLO_CONTAINERS/run/libpod-vfs" "$LIBREYOLO_CONTAINERS/run/libpod" || true
    else
      echo "podman-env: the vfs image storage has containers (or could not be listed): kept"
    fi
  fi
  removed=0
  # One listing: "ID PARENT NAMES" per image; the keep set is every tagged image and its chain.
  if listing=$(podman images -a --no-trunc --format '{{.ID}} {{.ParentId}} {{.Names}}' 2>/dev/null |
    sed 's/sha256://g'); then
    keep=$(echo "$listing" | awk '
      { parent[$1] = ($2 ~ /^\[/) ? "" : $2; names = $0; sub(/^[^[]*/, "", names)
        if (names != "[]" && names != "") tagged[$1] = 1 }
      END { for (t in tagged) { id = t; while (id != "" && !(id in seen)) { seen[id] = 1; print id; id = parent[id] } } }' |
      cut -c1-12 | sort -u) || keep=
    if [ -n "$keep" ]; then
      for id in $(echo "$listing" | awk '{print substr($1, 1, 12)}' | sort -u); do
        case $'\n'"$keep"$'\n' in *$'\n'"$id"$'\n'*) continue ;; esac
        # podman removes an image with children too (and its dangling parents): one pass.
        if podman rmi "$id" >/dev/null 2>&1; then removed=$((removed + 1)); fi
      done
    fi
  fi
  if [ "$removed" -gt 0 ]; then echo "podman-env: removed $removed images that no tagged image is built on"; fi
  echo "podman-env: $(du -sh "$libreyolo_podman_storage" 2>/dev/null | cut -f1) in image storage ($LIBREYOLO_PODMAN_DRIVER), $(df -h "$LIBREYOLO_CONTAINERS" | awk 'NR==2 {print $4}') free on its disk"
  return 0
}
