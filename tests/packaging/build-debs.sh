#!/usr/bin/env bash
# Build libflashattn's Debian packages from this checkout and check them with lintian.
#
#   tests/packaging/build-debs.sh [OUTDIR]        (default OUTDIR: build-debs/ in the checkout)
#
# The source tree is copied into a scratch directory first (dpkg-buildpackage writes into the
# source tree and its parent), so the checkout stays clean; only OUTDIR receives files: the .debs,
# the -dbgsym package, the source package (.dsc, .tar.xz), .buildinfo, .changes, build.log and
# lintian.txt. Missing build tools and build dependencies are installed with apt-get (root, or
# sudo).
#
# Environment:
#   FLASHATTN_DEB_PROFILES  build profiles; default "pkg.flashattn.nocuda nocheck" (CPU-only, no
#                           CTest run). Use "" for the CUDA build (needs Debian's nvidia-cuda-toolkit),
#                           "pkg.flashattn.localcuda nocheck" for one with NVIDIA's toolkit in
#                           FLASHATTN_CUDA_HOME (default /usr/local/cuda).
#   FLASHATTN_DEB_CMAKE_ARGS  extra CMake arguments (debian/rules), e.g. one generation's architectures.
#   FLASHATTN_DEB_OPTIONS   DEB_BUILD_OPTIONS; default "nocheck parallel=<cores>".
#   FLASHATTN_LINTIAN_FAIL_ON  lintian --fail-on value; default "error,warning".
set -euo pipefail
trap 'echo "build-debs: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
outdir=${1:-$src/build-debs}
profiles=${FLASHATTN_DEB_PROFILES-pkg.flashattn.nocuda nocheck}
options=${FLASHATTN_DEB_OPTIONS-nocheck parallel=$(nproc)}
fail_on=${FLASHATTN_LINTIAN_FAIL_ON:-error,warning}
start=$(date +%s)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
apt_install() {
  [ "$apt_updated" = 1 ] || { as_root apt-get update -qq; apt_updated=1; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# 1. Packaging tools.
missing=""
for p in dpkg-dev debhelper lintian; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "build-debs: installing:$missing"
  # shellcheck disable=SC2086
  apt_install $missing
fi

# 2. A clean copy of the source: the files git knows about (tracked, or untracked and not
# ignored), so build directories and other local clutter never reach the package. Build leftovers
# of the language tools are dropped even where no .gitignore rule covers them (an older checkout's
# .gitignore, a pip install that wrote *.egg-info): they would change the source package.
work=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-debs.XXXXXX")
trap 'rm -rf "$work"' EXIT
pkgsrc="$work/libflashattn"
mkdir -p "$pkgsrc"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
     grep -zvE '(^|/)([^/]*\.egg-info|__pycache__|\.pytest_cache|target|dist)/|\.(pyc|whl)$' |
     while IFS= read -r -d '' f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -xf - -C "$pkgsrc"
else
  tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$pkgsrc"
fi

# 3. Build dependencies for the chosen profiles.
cd "$pkgsrc"
if ! unmet=$(dpkg-checkbuilddeps -P "${profiles// /,}" 2>&1); then
  echo "build-debs: $unmet"
  [ "$apt_updated" = 1 ] || { as_root apt-get update -qq; apt_updated=1; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq --no-install-recommends \
    -P "${profiles// /,}" "$pkgsrc"
fi

# 4. Build the source package and the binary packages, unsigned (the source package lets lintian
# check debian/control, debian/copyright and the source format too).
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
echo "build-debs: DEB_BUILD_PROFILES='$profiles' DEB_BUILD_OPTIONS='$options' dpkg-buildpackage -us -uc"
if ! DEB_BUILD_PROFILES="$profiles" DEB_BUILD_OPTIONS="$options" \
     dpkg-buildpackage -us -uc >"$outdir/build.log" 2>&1; then
  tail -n 60 "$outdir/build.log" >&2
  echo "build-debs: dpkg-buildpackage failed; full log in $outdir/build.log" >&2
  exit 1
fi
grep -E '^dpkg-gensymbols|^dpkg-shlibdeps: warning' "$outdir/build.log" || true

# 5. Collect what the build wrote next to the source tree.
changes=$(ls "$work"/libflashattn_*.changes)
rm -f "$outdir"/*.deb "$outdir"/*.ddeb "$outdir"/*.changes "$outdir"/*.buildinfo "$outdir"/*.dsc \
      "$outdir"/*.tar.*
(cd "$work" && cp -- *.deb *.buildinfo *.changes *.dsc *.tar.* "$outdir"/ &&
   { cp -- *.ddeb "$outdir"/ 2>/dev/null || true; })

# 6. lintian on the .changes (the source package, every .deb, the -dbgsym and the .buildinfo).
echo "build-debs: lintian --fail-on $fail_on"
lintian_rc=0
lintian -I --show-overrides --fail-on "$fail_on" "$outdir/$(basename "$changes")" \
  >"$outdir/lintian.txt" 2>&1 || lintian_rc=$?
cat "$outdir/lintian.txt"
if [ "$lintian_rc" != 0 ]; then
  echo "build-debs: lintian failed (exit $lintian_rc)" >&2
  exit 1
fi

echo "build-debs: packages in $outdir ($(($(date +%s) - start)) s):"
(cd "$outdir" && find . -maxdepth 1 \( -name '*.deb' -o -name '*.ddeb' \) -printf '  %f\n' | sort)
