# Sourced by tests/run.sh and examples/demo.sh: install the Debian packages the build needs and
# this machine lacks (root, or sudo).
flashattn_deps="cmake ninja-build g++ pkg-config libcmocka-dev doxygen golang-go"
missing=""
for p in $flashattn_deps; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends $missing
fi
# The Python binding's tests need numpy, pytest and ml_dtypes (PyPI) in the python3 on PATH.
if ! python3 -c 'import numpy, pytest, ml_dtypes' >/dev/null 2>&1; then
  python3 -m pip install -q -r bindings/python/requirements-test.txt \
    || python3 -m pip install -q --break-system-packages -r bindings/python/requirements-test.txt
fi
