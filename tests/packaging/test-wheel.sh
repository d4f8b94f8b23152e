#!/usr/bin/env bash
# The Python package as a user installs it: in a fresh virtual environment, `pip install
# bindings/python` builds libflashattn with CMake (scikit-build-core, fetched by pip from PyPI into
# an isolated build environment) and bundles it; then the example runs with no FLASHATTN_LIBRARY,
# PKG_CONFIG_PATH or LD_LIBRARY_PATH, from a directory outside the checkout, and must load the
# bundled copy. Also checks what the wheel holds: the package's Python files and one library file,
# no headers, no symlink copies.
#
#   tests/packaging/test-wheel.sh        CPU-only (FLASHATTN_ENABLE_CUDA=OFF unless set: CI's time)
#
# Needs python3 with the venv module and network access to PyPI (numpy, scikit-build-core). Leaves
# nothing behind: the virtual environment and the wheel live in a temporary directory.
set -euo pipefail
trap 'echo "test-wheel: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
start=$(date +%s)
say() { echo "test-wheel: $*"; }
die() { echo "test-wheel: FAIL: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-test-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
export FLASHATTN_ENABLE_CUDA="${FLASHATTN_ENABLE_CUDA-OFF}"
unset FLASHATTN_LIBRARY PKG_CONFIG_PATH LD_LIBRARY_PATH PYTHONPATH
export PIP_DISABLE_PIP_VERSION_CHECK=1

python3 -m venv "$work/venv" ||
  die "python3 -m venv failed (Debian's python3: apt-get install python3-venv)"
py="$work/venv/bin/python"

# 1. Build the wheel from the source tree (what `pip install bindings/python` does first), keep it
# for inspection, then install it.
say "pip wheel bindings/python (FLASHATTN_ENABLE_CUDA=$FLASHATTN_ENABLE_CUDA)"
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$src/bindings/python" >"$work/pip-wheel.log" 2>&1 ||
  { tail -n 60 "$work/pip-wheel.log"; die "building the wheel failed"; }
wheel=$(ls "$work"/dist/libflashattn-*.whl)
say "built ${wheel##*/} ($(du -h "$wheel" | cut -f1))"
case "${wheel##*/}" in *-py3-none-*) ;; *) die "the wheel should be tagged py3-none-<platform>: ${wheel##*/}" ;; esac
"$py" - "$wheel" <<'EOF' || die "unexpected wheel contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
libs = [n for n in names if n.startswith("flashattn/") and "libflashattn" in n]
assert libs == ["flashattn/libflashattn.so.0"], "library files: %s" % libs
assert "flashattn/__init__.py" in names and "flashattn/torch_autograd.py" in names, names
stray = [n for n in names if not (n.startswith("flashattn/") or ".dist-info/" in n)]
assert not stray, "files outside the package: %s" % stray
EOF
"$py" -m pip install -q "$wheel" >"$work/pip-install.log" 2>&1 ||
  { cat "$work/pip-install.log"; die "installing the wheel failed"; }

# 2. The example, from outside the checkout (so the installed package is imported, not the source).
cp "$src/bindings/python/example.py" "$work/example.py"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
(cd "$work" && "$py" example.py) | tee "$work/example.out"
grep -F "($site/flashattn/libflashattn.so.0)" "$work/example.out" >/dev/null ||
  die "the example did not load the bundled library from $site/flashattn"
(cd "$work" && "$py" - <<'EOF') || die "the installed package's metadata or build info is wrong"
import flashattn, importlib.metadata as md
v = md.version("libflashattn")
assert flashattn.__version__ == v, (flashattn.__version__, v)
assert flashattn.version_string() == v, "wheel %s, library %s" % (v, flashattn.version_string())
info = flashattn.build_info()
print("test-wheel: libflashattn %s, build info %s" % (v, flashattn.build_info_string()))
EOF
if [ "$FLASHATTN_ENABLE_CUDA" = OFF ]; then
  (cd "$work" && "$py" -c 'import flashattn; assert flashattn.build_info()["cuda"] == "none"') ||
    die "FLASHATTN_ENABLE_CUDA=OFF still built CUDA"
fi

# 3. FLASHATTN_LIBRARY still wins over the bundled copy (explicit choice), and a wrong one fails loudly.
(cd "$work" && FLASHATTN_LIBRARY="$work/nonexistent.so" "$py" -c 'import flashattn; flashattn.version()' \
   >"$work/explicit.log" 2>&1) && die "a wrong FLASHATTN_LIBRARY was ignored"
grep -F "FLASHATTN_LIBRARY=$work/nonexistent.so could not be loaded" "$work/explicit.log" >/dev/null ||
  { cat "$work/explicit.log"; die "a wrong FLASHATTN_LIBRARY gave an unclear error"; }

# 4. Uninstall removes the library with the package.
"$py" -m pip uninstall -q -y libflashattn
[ ! -e "$site/flashattn" ] || die "pip uninstall left $site/flashattn"
say "passed ($(($(date +%s) - start)) s)"
