#!/usr/bin/env bash
# Completes the GPU machine's device kit in .device-kit/ (staged there from the workplace's kit,
# git-ignored, carried to the machine) with what this project builds with beyond it:
#   - cpp-httplib (the HTTP port) and brotli, which cpp-httplib's pkg-config file requires
#     (Debian 12 debs, fetched with apt-get download);
#   - env.sh: debs added after the machine's first unpack are unpacked too, those .pc files point
#     at /opt/deps, and PKG_CONFIG_PATH includes it;
#   - googletest's source package is dropped (libgtest-dev has the libraries): the working tree
#     plus the kit must stay under the 64 MiB carry.
# Idempotent. Run from the repository root after staging the kit:  bash scripts/device-kit-extras.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kit=.device-kit
[ -f $kit/env.sh ] || { echo "device-kit-extras: $kit/env.sh missing (stage the kit first)"; exit 1; }
(cd $kit/debs && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 2>&1 \
  | grep -v "^W: Download is performed unsandboxed" || true)
rm -f $kit/debs/googletest_*_all.deb
# gRPC's and protobuf's static libraries (42 MiB unpacked, 6 MiB of the debs): the build links
# their shared ones (gRPC's CMake targets and FindProtobuf name the .so files), so the kit's copies
# are repacked without them to leave the carry room for the tree.
for d in libgrpc-dev libprotobuf-dev; do
  for f in $kit/debs/${d}_*.deb; do
    [ -f "$f" ] || continue
    # (no `grep -q` on the pipe: its early exit fails dpkg-deb under pipefail)
    [ "$(dpkg-deb -c "$f" | grep -c '\.a$')" -gt 0 ] || continue
    x=$(mktemp -d)
    dpkg-deb -R "$f" "$x"
    find "$x" -name '*.a' -delete
    sed -i '/\.a$/d' "$x/DEBIAN/md5sums" 2>/dev/null || true
    dpkg-deb -b "$x" "$f" >/dev/null
    rm -rf "$x"
  done
done
if ! grep -q "unpacked-all" $kit/env.sh; then
  python3 - $kit/env.sh <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
marker = "  touch /opt/deps/.unpacked\nfi\n"
extra = '''# Debs added to the kit after the first unpack on this machine (cpp-httplib and brotli).
for f in "$_kit"/debs/*.deb; do
  m=/opt/deps/.unpacked-$(basename "$f")
  [ -f "$m" ] || [ -f /opt/deps/.unpacked-all ] || { dpkg -x "$f" /opt/deps; touch "$m"; }
done
for pc in /opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig/{cpp-httplib,libbrotli*}.pc; do
  [ -f "$pc" ] && sed -i 's|^prefix=/usr$|prefix=/opt/deps/usr|' "$pc"
done
export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
'''
assert marker in s, "env.sh layout changed"
open(p, "w").write(s.replace(marker, marker + extra, 1))
PY
fi
kit_bytes=$(du -sb $kit | cut -f1)
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "device-kit-extras: kit $((kit_bytes / 1024)) KiB + tree $((tree_bytes / 1024)) KiB of the 65536 KiB carry"
