#!/usr/bin/env bash
# The Rust and Go bindings against an *installed* libflashattn, as a user builds them: `cmake
# --install` into a temporary prefix, the prefix then moved elsewhere (its flashattn.pc is
# relocatable: paths from ${pcfiledir}), and only PKG_CONFIG_PATH / LD_LIBRARY_PATH pointing there.
#
#   tests/packaging/test-installed-prefix.sh BUILD_DIR rust   cargo test of the workspace through
#       the pkg-config tool, then the example through build.rs's own .pc parser (PKG_CONFIG=false)
#   tests/packaging/test-installed-prefix.sh BUILD_DIR go     a separate module of its own (go.mod
#       with a require + replace of the binding's module path) that computes attention and checks it
#
# Run by CTest (bindings_rust_installed_prefix, bindings_go_own_module); no network, nothing left
# behind except cargo's target directory BUILD_DIR/bindings/rust-prefix-target.
set -euo pipefail
trap 'echo "test-installed-prefix: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR

build=$(cd "${1:?usage: $0 BUILD_DIR rust|go}" && pwd)
what=${2:?usage: $0 BUILD_DIR rust|go}
src=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "test-installed-prefix($what): $*"; }
die() { echo "test-installed-prefix($what): FAIL: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-prefix.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. Install, then move the prefix: a .pc with the install prefix baked in would now point nowhere.
cmake --install "$build" --prefix "$work/installed" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; die "cmake --install failed"; }
mv "$work/installed" "$work/prefix"
prefix=$work/prefix
pc=$(find "$prefix" -name flashattn.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || die "no flashattn.pc installed under $prefix"
grep -F '${pcfiledir}' "$pc" >/dev/null ||
  die "$pc is not relocatable (configure with -DFLASHATTN_PC_RELOCATABLE=ON, the default)"
libdir=$(dirname "$(dirname "$pc")")
[ -e "$libdir/libflashattn.so.0" ] || die "no libflashattn.so.0 in $libdir"
say "installed and moved to $prefix (flashattn.pc in ${pc#"$prefix"/})"

# Nothing from the build tree: the binding must find the library through the moved .pc alone.
unset FLASHATTN_LIB_DIR FLASHATTN_LIBRARY PKG_CONFIG_LIBDIR
export PKG_CONFIG_PATH=$(dirname "$pc") LD_LIBRARY_PATH=$libdir
export FLASHATTN_BACKEND=cpu

case $what in
  rust)
    export CARGO_TARGET_DIR=$build/bindings/rust-prefix-target CARGO_TERM_COLOR=never
    manifest=$src/bindings/rust/Cargo.toml
    say "cargo test (build.rs asks the pkg-config tool)"
    cargo test --offline --locked --manifest-path "$manifest" --workspace
    say "cargo run --example basic (build.rs parses flashattn.pc itself: PKG_CONFIG=false)"
    PKG_CONFIG=false cargo run --offline --locked --manifest-path "$manifest" -p flashattn --example basic \
      | tee "$work/example.out"
    grep '^libflashattn ' "$work/example.out" >/dev/null || die "the example printed no result line"
    example=$CARGO_TARGET_DIR/debug/examples/basic
    ldd "$example" | grep -F "libflashattn.so.0 => $libdir/libflashattn.so.0" >/dev/null ||
      { ldd "$example"; die "the example does not load $libdir/libflashattn.so.0"; }
    ;;
  go)
    # A fresh build cache: go's cache key of a cgo package does not cover the linker flags that
    # pkg-config gave, so a cache shared with bindings_go would link against the build tree's path.
    export GOCACHE=$work/go-cache GOPATH=$build/bindings/go/path GOFLAGS=-mod=mod GOPROXY=off \
           GOTOOLCHAIN=local GO111MODULE=on CGO_ENABLED=1 GOTELEMETRY=off
    module=github.com/libflashattn/libflashattn/bindings/go
    mkdir "$work/app"
    # The README's lines for a user's own module, verbatim in effect.
    (cd "$work/app" && go mod init example.com/attention-app >/dev/null 2>&1 &&
       go mod edit -require="$module@v0.0.0" -replace="$module=$src/bindings/go")
    cp "$src/tests/packaging/consumer/go/main.go" "$work/app/main.go"
    say "go run . in a module of its own ($work/app/go.mod requires $module)"
    (cd "$work/app" && go run .) | tee "$work/app.out"
    grep '^ok ' "$work/app.out" >/dev/null || die "the Go consumer did not report success"
    ;;
  *) die "unknown part '$what' (rust or go)" ;;
esac
say "passed"
