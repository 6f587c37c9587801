# Sourced by scripts/demo.sh and scripts/test.sh: the project's own Python
# environment, `.venv` at the checkout's root, made with the standard `venv`
# module from $PYTHON (default python3).  Nothing is installed outside it, so a
# distribution's Python that refuses `pip install` (PEP 668) works as it is.
#
#   project_venv EXTRAS   makes .venv if needed and installs the package
#                         (editable, pure source) with EXTRAS ("" or "test")
#                         when pyproject.toml or setup.py changed since the last
#                         install, or the extras asked for were never installed.
# Afterwards $VENV_PY is the environment's interpreter.
# PROCESSOR_REINSTALL=1 forces the install; a venv made from another
# interpreter than $PYTHON is made again.

VENV_DIR=${PROCESSOR_VENV:-$PWD/.venv}
VENV_PY=$VENV_DIR/bin/python

_venv_fail() {
  echo "error: $*" >&2
  exit 1
}

_venv_base() {  # the interpreter a venv (or $PYTHON) really runs, resolved
  "$1" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))' 2>/dev/null
}

_venv_make() {
  local py=$1
  command -v "$py" >/dev/null 2>&1 || _venv_fail "PYTHON=$py: no such interpreter"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || _venv_fail "PYTHON=$py is $("$py" -V 2>&1); the processor needs Python >= 3.11"
  if ! "$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    local ver
    ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    _venv_fail "$py cannot make a virtual environment: install Debian's python$ver-venv (apt-get install python$ver-venv) or choose another PYTHON="
  fi
  rm -rf "$VENV_DIR"
  echo "== making the project environment $VENV_DIR from $py ($("$py" -V 2>&1))"
  "$py" -m venv "$VENV_DIR" || _venv_fail "$py -m venv $VENV_DIR failed"
}

project_venv() {
  local extras=$1 py=${PYTHON:-python3}
  if [ ! -x "$VENV_PY" ] || [ "$(_venv_base "$VENV_PY")" != "$(_venv_base "$py")" ]; then
    _venv_make "$py"
  fi
  # the stamp: what the last install was made from, and with which extras
  local stamp=$VENV_DIR/.processor-install want have
  want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
  have=$(head -n1 "$stamp" 2>/dev/null || true)
  if [ "${PROCESSOR_REINSTALL:-0}" = 1 ] || [ "$want" != "$have" ] \
     || { [ -n "$extras" ] && ! grep -qx "extra $extras" "$stamp" 2>/dev/null; }; then
    local spec=.
    [ -z "$extras" ] || spec=".[$extras]"
    echo "== installing $spec into $VENV_DIR"
    # PROCESSOR_MYPYC=0: an editable install is the pure source (setup.py)
    PROCESSOR_MYPYC=0 "$VENV_PY" -m pip install -q --disable-pip-version-check -e "$spec" \
      || _venv_fail "pip install into $VENV_DIR failed (see above)"
    {
      echo "$want"
      # the extras installed before stay installed when the files did not change
      [ "$want" != "$have" ] || grep '^extra ' "$stamp" 2>/dev/null || true
      [ -z "$extras" ] || echo "extra $extras"
    } | awk '!seen[$0]++' > "$stamp.new" && mv "$stamp.new" "$stamp"
  fi
}
