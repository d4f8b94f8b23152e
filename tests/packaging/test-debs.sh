#!/usr/bin/env bash
# Consumer test of libflashattn's Debian packages:
#   1. build them (tests/packaging/build-debs.sh: CPU-only profile, lintian clean),
#   2. install them with dpkg -i and check what each one holds (multiarch libdir, SONAME, no RPATH,
#      stripped with its debug file in -dbgsym, no .la, the -dev link, .pc and CMake package),
#   3. build tests/packaging/consumer/consumer.c with `pkg-config --cflags --libs flashattn` and
#      through a CMake project using find_package(flashattn) + flashattn::flashattn, and run both on
#      the CPU backend (FLASHATTN_BACKEND=cpu): plan, finalize, execute a small fp32 problem,
#      check status, finiteness and a double-precision reference,
#      then run flashattn-info and flashattn-bench (flashattn-tools) from the system path,
#   4. purge the packages and check that every file they installed is gone.
# Needs root (or sudo) for dpkg. Exits non-zero on any failure; leaves nothing installed.
#
#   tests/packaging/test-debs.sh            (FLASHATTN_DEB_PROFILES as in build-debs.sh)
set -euo pipefail
trap 'echo "test-debs: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR
# (grep in a pipeline writes to /dev/null rather than using -q: -q can exit early, the writer then
# dies of SIGPIPE and pipefail reports the pipeline as failed.)

here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
export FLASHATTN_DEB_PROFILES="${FLASHATTN_DEB_PROFILES-pkg.flashattn.nocuda nocheck}"
packages="libflashattn0 libflashattn0-dbgsym libflashattn-dev libflashattn-doc flashattn-tools flashattn-tools-dbgsym"
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
libdir=/usr/lib/$ma
libdir_re="(/usr)?/lib/$ma"   # ldconfig and ldd may name it through the merged-/usr /lib link

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
say() { echo "test-debs: $*"; }
die() { echo "test-debs: FAIL: $*" >&2; exit 1; }
installed_now() {
  local p out=""
  for p in $packages; do
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -v '^not-installed$' >/dev/null && out="$out $p"
  done
  echo "$out"
}
purge() {
  local present
  present=$(installed_now)
  # shellcheck disable=SC2086
  [ -z "$present" ] || as_root dpkg --purge $present >/dev/null
}

work=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-test-debs.XXXXXX")
cleanup() {
  local rc=$?
  [ "${installed:-0}" = 0 ] || purge || true
  rm -rf "$work"
  [ "$rc" = 0 ] || echo "test-debs: failed (exit $rc)" >&2
}
trap cleanup EXIT

# Packages left by an interrupted earlier run would hide what this one installs.
stale=$(installed_now)
if [ -n "$stale" ]; then
  say "purging packages left installed before this test:$stale"
  purge
fi

# 1. Build (and lintian).
"$here/build-debs.sh" "$work/debs"
debs="" dbgsym=""
for f in "$work"/debs/libflashattn0_*.deb "$work"/debs/libflashattn-dev_*.deb \
         "$work"/debs/libflashattn-doc_*.deb \
         "$work"/debs/flashattn-tools_*.deb; do   # -doc is absent with the nodoc profile
  [ -e "$f" ] && debs="$debs ${f##*/}"
done
for f in "$work"/debs/libflashattn0-dbgsym_*.deb "$work"/debs/libflashattn0-dbgsym_*.ddeb \
         "$work"/debs/flashattn-tools-dbgsym_*.deb "$work"/debs/flashattn-tools-dbgsym_*.ddeb; do
  [ -e "$f" ] && dbgsym="$dbgsym ${f##*/}"
done
case "$debs" in *" libflashattn0_"*" libflashattn-dev_"*) ;; *) die "missing packages: got$debs" ;; esac
case "$debs" in *" flashattn-tools_"*) ;; *) die "missing package flashattn-tools: got$debs" ;; esac
[ -n "$dbgsym" ] || die "no libflashattn0-dbgsym package was built"

# 2. Install and inspect.
say "dpkg -i$debs$dbgsym"
installed=1
# shellcheck disable=SC2086
(cd "$work/debs" && as_root dpkg -i $debs $dbgsym >/dev/null)
for p in $(echo "$debs $dbgsym" | tr ' ' '\n' | sed 's/_.*//'); do
  dpkg-query -W -f='${db:Status-Status}' "$p" | grep -x installed >/dev/null || die "$p is not installed"
done
for p in $packages; do
  if dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -x installed >/dev/null; then
    dpkg -L "$p"
  fi
done | sort -u >"$work/installed-paths"

lib_files=$(dpkg -L libflashattn0 | grep -v '^/usr/share/doc/' | while read -r f; do [ -d "$f" ] || echo "$f"; done | sort)
want="$libdir/libflashattn.so.0
$(readlink -f "$libdir/libflashattn.so.0")"
[ "$lib_files" = "$(echo "$want" | sort)" ] ||
  die "libflashattn0 should hold only libflashattn.so.0 and its real file; it holds: $lib_files"
real=$(readlink -f "$libdir/libflashattn.so.0")
case "$real" in "$libdir"/libflashattn.so.0.*) ;; *) die "unexpected real file $real" ;; esac
readelf -d "$real" | grep 'Library soname: \[libflashattn.so.0\]' >/dev/null || die "SONAME is not libflashattn.so.0"
! readelf -d "$real" | grep -E 'RPATH|RUNPATH' >/dev/null || die "$real carries an RPATH/RUNPATH"
! readelf -S "$real" | grep '\.debug_info' >/dev/null || die "$real is not stripped"
build_id=$(readelf -n "$real" | sed -n 's/.*Build ID: *//p')
[ -n "$build_id" ] || die "$real has no build ID"
[ -f "/usr/lib/debug/.build-id/${build_id:0:2}/${build_id:2}.debug" ] ||
  die "libflashattn0-dbgsym lacks the debug file of build ID $build_id"
! grep -Eq '\.la$|\.a$' "$work/installed-paths" || die "a .la or static archive was installed"
[ "$(readlink "$libdir/libflashattn.so")" = libflashattn.so.0 ] || die "the -dev link is not libflashattn.so -> libflashattn.so.0"
dpkg -S "$libdir/libflashattn.so" | grep '^libflashattn-dev' >/dev/null || die "libflashattn.so is not in libflashattn-dev"
for f in /usr/include/flashattn/flashattn.h /usr/include/flashattn/flashattn_version.h \
         "$libdir/pkgconfig/flashattn.pc" "$libdir/cmake/flashattn/flashattnConfig.cmake" \
         "$libdir/cmake/flashattn/flashattnConfigVersion.cmake" "$libdir/cmake/flashattn/flashattnTargets.cmake"; do
  dpkg -S "$f" 2>/dev/null | grep '^libflashattn-dev' >/dev/null || die "$f is not in libflashattn-dev"
done
if dpkg-query -W -f='${db:Status-Status}' libflashattn-doc 2>/dev/null | grep -x installed >/dev/null; then
  [ -f /usr/share/doc/libflashattn-doc/html/index.html ] || die "libflashattn-doc has no html/index.html"
fi
ldconfig -p | grep -E "libflashattn\.so\.0 .*=> $libdir_re/libflashattn\.so\.0\$" >/dev/null || die "ldconfig does not know libflashattn.so.0"
# The toolkit that built the packages is in libflashattn0's description.
toolkit=$(dpkg -s libflashattn0 | sed -n 's/^ CUDA toolkit: //p')
say "libflashattn0 says: CUDA toolkit: $toolkit"
case " $FLASHATTN_DEB_PROFILES " in
  *" pkg.flashattn.nocuda "*) [ "$toolkit" = "none, a CPU-only build." ] || die "CPU-only packages name a toolkit: $toolkit" ;;
  *) case "$toolkit" in ""|none*) die "CUDA packages name no toolkit: '$toolkit'" ;; esac ;;
esac

# 3. Consumers, against the system paths only.
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH
expect_info=""
case " $FLASHATTN_DEB_PROFILES " in *" pkg.flashattn.nocuda "*) expect_info="cuda=none" ;; esac
export FLASHATTN_BACKEND=cpu FLASHATTN_EXPECT_BUILD_INFO="$expect_info"

flags=$(pkg-config --cflags --libs flashattn) || die "pkg-config cannot find flashattn"
say "cc consumer.c $flags"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror "$here/consumer/consumer.c" $flags -lm -o "$work/via-pkgconfig"
ldd "$work/via-pkgconfig" | grep -E "libflashattn\.so\.0 => $libdir_re/libflashattn\.so\.0 " >/dev/null ||
  die "via-pkgconfig does not load $libdir/libflashattn.so.0"
"$work/via-pkgconfig" || die "the pkg-config consumer failed"

say "cmake consumer with find_package(flashattn)"
cmake -S "$here/consumer" -B "$work/cmake-consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >"$work/cmake-consumer.log" 2>&1 ||
  { cat "$work/cmake-consumer.log"; die "configuring the CMake consumer failed"; }
cmake --build "$work/cmake-consumer" >>"$work/cmake-consumer.log" 2>&1 ||
  { cat "$work/cmake-consumer.log"; die "building the CMake consumer failed"; }
grep -q "$libdir/libflashattn.so" "$work/cmake-consumer/build.ninja" ||
  die "the CMake consumer did not link $libdir/libflashattn.so"
"$work/cmake-consumer/consumer" || die "the CMake consumer failed"

# The tools, from the system path: flashattn-info reports the automatic choice for a shape with
# its reason, flashattn-bench runs one small CPU measurement; both have manual pages.
tools_files=$(dpkg -L flashattn-tools | grep '^/usr/bin/' | sort | tr '\n' ' ')
[ "$tools_files" = "/usr/bin/flashattn-bench /usr/bin/flashattn-info " ] ||
  die "flashattn-tools should hold /usr/bin/flashattn-bench and flashattn-info; it holds: $tools_files"
for t in flashattn-info flashattn-bench; do
  [ -f "/usr/share/man/man1/$t.1.gz" ] || die "no manual page for $t"
  ! readelf -d "/usr/bin/$t" | grep -E 'RPATH|RUNPATH' >/dev/null || die "/usr/bin/$t carries an RPATH/RUNPATH"
done
say "flashattn-info --seqlen 128 --heads 2 --head-dim 64 --causal"
(unset FLASHATTN_BACKEND; flashattn-info --seqlen 128 --heads 2 --head-dim 64 --causal) | tee "$work/info.out"
grep -E '^auto: +forward on cpu, workspace [0-9]+ bytes: ' "$work/info.out" >/dev/null ||
  die "flashattn-info did not report the automatic choice"
grep -E '^build: +cuda=' "$work/info.out" >/dev/null || die "flashattn-info did not print the build"
flashattn-bench --backend cpu --seqlen 128 --heads 2 --warmup 0 --reps 1 >"$work/bench.out" 2>&1 ||
  { cat "$work/bench.out"; die "flashattn-bench failed"; }

# 4. Remove and check that nothing is left.
say "dpkg --purge"
purge
installed=0
left=$(installed_now)
[ -z "$left" ] || die "still installed:$left"
while read -r f; do
  if [ -d "$f" ] && [ ! -L "$f" ]; then
    case "$f" in /usr/include/flashattn | "$libdir"/cmake/flashattn | /usr/share/doc/libflashattn* | \
                 /usr/share/doc/flashattn-tools*)
      die "directory $f is left after purge" ;;
    esac
  elif [ -e "$f" ] || [ -L "$f" ]; then
    die "$f is left after purge"
  fi
done <"$work/installed-paths"
! ldconfig -p | grep libflashattn >/dev/null || die "ldconfig still lists libflashattn"
! pkg-config --exists flashattn 2>/dev/null || die "pkg-config still finds flashattn"

say "all checks passed ($(($(date +%s) - start)) s)"
