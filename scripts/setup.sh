#!/usr/bin/env bash
# Bootstrap a checkout for development and tests.  Safe to re-run: every step
# checks first and says "ok" when there is nothing to do, so a re-run with
# nothing changed takes a few seconds.
#
#   bash scripts/setup.sh          # then: source scripts/env.sh
#
# Steps:
#   etcd      Debian's etcd-server (etcd 3.4, has --enable-v2) unless `etcd` is on PATH
#   venv      python3 -m venv .venv (installs python3-venv via apt if needed)
#   azurite   azurite@3.37.0 into .tools/ with npm
#   pip       torch (CPU wheel pinned) and uv (pinned) with pip, then with uv: azure-cli, this package editable
#             with [train,test] (and its DEPENDENCIES from setup.py: the pinned official kubernetes client);
#             skipped while .venv/.elastictrain-stamp matches setup.py + the requirement line.
#             Why two installers: pip finds a machine's local torch wheel (uv does not look there, and PyPI's
#             torch==2.13.0 is the CUDA build); uv installs azure-cli's ~200 packages in seconds where pip took
#             ~150 s here (compiling included). If uv fails, pip.
#   checkov   checkov (pinned) in its own venv .tools/checkov: it pins many packages azure-cli pins otherwise
#             (290 MB once; then "ok"). Scans the planned ARM bodies in the contract tests.
#   lint      the gates azure-cli-extensions CI runs, pinned: azdev (its linter rules and style configs),
#             pylint, flake8 (tests/unit/test_publish_gates.py runs them)
#   egg-info  elastictrain.egg-info at the repo root (az reads a dev extension's metadata there)
#   devext    build/azext-dev/elastictrain/ -> symlinks, found by az via AZURE_EXTENSION_DEV_SOURCES
#   check     `az elastictrain --help` through the real .venv/bin/az
#
# Environment knobs:
#   ELASTICTRAIN_PIP_ARGS   extra pip arguments for the pip step, e.g.
#                           "--extra-index-url https://download.pytorch.org/whl/cpu"
#                           on a machine without a local CPU torch wheel.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

AZURITE_VERSION="3.37.0"
CHECKOV_VERSION="3.3.30"
CHECKOV_VENV=".tools/checkov"
PIP_FIRST=(torch==2.13.0 uv==0.13.9)  # with pip (see "pip" above)
PIP_REQUIREMENTS=(azure-cli==2.91.0 torch==2.13.0 -e ".[train,test]")
# azdev's own requirements (sphinx==1.6.7, tox, setuptools<80, ...) are for its other commands and clash with
# azure-cli's: its linter rules and style configs need only knack, PyYAML and requests, which azure-cli brings.
LINT_REQUIREMENTS=(pylint==4.1.4 flake8==7.5.0)
AZDEV_REQUIREMENT="azdev==0.2.13"
VENV=".venv"
STAMP="$VENV/.elastictrain-stamp"
LINT_STAMP="$VENV/.elastictrain-lint-stamp"
LOG_DIR="build/setup-logs"
DEV_EXT_DIR="build/azext-dev/elastictrain"

say() { printf 'setup: %-9s %s\n' "$1" "$2"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
elapsed() { local ms=$(( $(now_ms) - $1 )); printf '%d.%01ds' $((ms / 1000)) $(((ms % 1000) / 100)); }
# pip prints one harmless warning per package for index locations it cannot use.
filter_pip_noise() { grep -v -E "^WARNING: Location '.*' is ignored" || true; }
show_log_tail() { # <log> : last lines of a log, without pip's noise, on stderr
    printf -- '----- last lines of %s -----\n' "$1" >&2
    filter_pip_noise <"$1" | tail -n 40 >&2
    printf -- '-----\n' >&2
}

mkdir -p "$LOG_DIR"

# uv: the system's certificate store (as pip's), copies rather than hard links (its cache may be on another disk)
export UV_NATIVE_TLS=1 UV_LINK_MODE=copy
# uv compiles each module once after installing, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI machines),
# nothing else would, and every az process of the tests compiled azure-cli and the SDKs again (parallel phase 862 s
# instead of 492 s)
export UV_COMPILE_BYTECODE=1
# install_into <python> <args...>: uv into that interpreter's environment, or pip when uv fails (a machine
# that reaches its package index only through pip's configuration, say)
install_into() {
    local python="$1"
    shift
    # shellcheck disable=SC2086  # ELASTICTRAIN_PIP_ARGS is meant to word-split
    if [ -x "$VENV/bin/uv" ] && "$VENV/bin/uv" pip install --python "$python" ${ELASTICTRAIN_PIP_ARGS:-} "$@"; then
        return 0
    fi
    echo "setup: uv failed; installing with pip instead"
    # shellcheck disable=SC2086
    "$python" -m pip install --disable-pip-version-check ${ELASTICTRAIN_PIP_ARGS:-} "$@"
}

# --- apt helpers: sudo only when not root, apt-get update only when installing
APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these by hand: $*"
    local SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "not root and no sudo: install these by hand: $*"
        SUDO=(sudo)
    fi
    local log="$LOG_DIR/apt.log"
    if [ "$APT_UPDATED" -eq 0 ]; then
        "${SUDO[@]}" apt-get update >"$log" 2>&1 || { show_log_tail "$log"; die "apt-get update failed"; }
        APT_UPDATED=1
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >>"$log" 2>&1 || { show_log_tail "$log"; die "apt-get install $* failed"; }
}

# --- etcd --------------------------------------------------------------------
etcd_version() { etcd --version 2>/dev/null | sed -n 's/^etcd Version: *//p' | head -n 1; }
if command -v etcd >/dev/null 2>&1; then
    say etcd "ok ($(command -v etcd), $(etcd_version))"
else
    t0=$(now_ms)
    apt_install etcd-server
    command -v etcd >/dev/null 2>&1 || die "etcd-server installed but no etcd on PATH"
    say etcd "installed etcd-server ($(etcd_version)) in $(elapsed "$t0")"
fi
case "$(etcd_version)" in
    3.[0-5].*) ;;
    *) printf 'setup: warning: etcd %s may lack the v2 API (--enable-v2); the tests need etcd 3.4 or 3.5\n' \
           "$(etcd_version)" >&2 ;;
esac

# --- azurite -----------------------------------------------------------------
AZURITE_BIN=".tools/node_modules/.bin/azurite-blob"
AZURITE_PKG=".tools/node_modules/azurite/package.json"
if [ -x "$AZURITE_BIN" ] && grep -q "\"version\": *\"$AZURITE_VERSION\"" "$AZURITE_PKG" 2>/dev/null; then
    say azurite "ok (azurite@$AZURITE_VERSION in .tools)"
else
    command -v npm >/dev/null 2>&1 || die "npm not found (needed for azurite)"
    t0=$(now_ms)
    log="$LOG_DIR/npm.log"
    npm install --prefix .tools --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >"$log" 2>&1 \
        || { show_log_tail "$log"; die "npm install azurite@$AZURITE_VERSION failed"; }
    [ -x "$AZURITE_BIN" ] || die "npm finished but $AZURITE_BIN is missing"
    say azurite "installed azurite@$AZURITE_VERSION into .tools in $(elapsed "$t0")"
fi

# --- venv --------------------------------------------------------------------
# (a venv made while ensurepip was missing has no pip: it is recreated)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import pip' >/dev/null 2>&1; then
    say venv "ok ($VENV, $("$VENV/bin/python" -V 2>&1))"
else
    command -v python3 >/dev/null 2>&1 || die "python3 not found"
    t0=$(now_ms)
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        apt_install python3-venv
    fi
    python3 -m venv --clear "$VENV" >"$LOG_DIR/venv.log" 2>&1 \
        || { show_log_tail "$LOG_DIR/venv.log"; die "python3 -m venv failed"; }
    rm -f "$STAMP"
    say venv "created $VENV ($("$VENV/bin/python" -V 2>&1)) in $(elapsed "$t0")"
fi

# --- pip ---------------------------------------------------------------------
PIP_LINE="pip install ${PIP_FIRST[*]} && uv pip install ${PIP_REQUIREMENTS[*]}"
WANT_STAMP="$({ cat setup.py; printf '%s\n' "$PIP_LINE"; } | sha256sum | cut -d' ' -f1)"
PIP_RAN=0
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ]; then
    say pip "ok (stamp matches setup.py and the requirement line)"
else
    t0=$(now_ms)
    log="$LOG_DIR/pip.log"
    printf 'setup: %-9s %s ... ' pip "$PIP_LINE (log: $log)"
    # shellcheck disable=SC2086  # ELASTICTRAIN_PIP_ARGS is meant to word-split
    if { "$VENV/bin/python" -m pip install --disable-pip-version-check ${ELASTICTRAIN_PIP_ARGS:-} "${PIP_FIRST[@]}" \
         && install_into "$VENV/bin/python" "${PIP_REQUIREMENTS[@]}"; } >"$log" 2>&1; then
        printf 'done in %s\n' "$(elapsed "$t0")"
    else
        printf 'FAILED\n'
        show_log_tail "$log"
        die "pip install failed"
    fi
    printf '%s\n' "$WANT_STAMP" >"$STAMP"
    PIP_RAN=1
fi

# --- checkov -----------------------------------------------------------------
# Its own venv: checkov pins boto3, networkx, pydantic, ... at versions azure-cli's .venv must not get.
# Test tools (checkov, lint) only for the tests: the demo sets ELASTICTRAIN_SETUP_TEST_TOOLS=0.
TEST_TOOLS="${ELASTICTRAIN_SETUP_TEST_TOOLS:-1}"
if [ "$TEST_TOOLS" = 0 ]; then
    say checkov "skipped (test tool; ELASTICTRAIN_SETUP_TEST_TOOLS=0)"
elif [ -x "$CHECKOV_VENV/bin/checkov" ] && [ "$(cat "$CHECKOV_VENV/.version" 2>/dev/null)" = "$CHECKOV_VERSION" ]; then
    say checkov "ok (checkov $CHECKOV_VERSION in $CHECKOV_VENV)"
else
    command -v python3 >/dev/null 2>&1 || die "python3 not found"
    t0=$(now_ms)
    log="$LOG_DIR/checkov.log"
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        apt_install python3-venv
    fi
    { python3 -m venv --clear "$CHECKOV_VENV" \
      && install_into "$CHECKOV_VENV/bin/python" "checkov==$CHECKOV_VERSION"; } >"$log" 2>&1 \
        || { show_log_tail "$log"; die "installing checkov==$CHECKOV_VERSION into $CHECKOV_VENV failed"; }
    printf '%s\n' "$CHECKOV_VERSION" >"$CHECKOV_VENV/.version"
    say checkov "installed checkov $CHECKOV_VERSION into $CHECKOV_VENV in $(elapsed "$t0")"
fi

# --- lint --------------------------------------------------------------------
LINT_LINE="uv pip install ${LINT_REQUIREMENTS[*]} && uv pip install --no-deps $AZDEV_REQUIREMENT"
if [ "$TEST_TOOLS" = 0 ]; then
    say lint "skipped (test tools; ELASTICTRAIN_SETUP_TEST_TOOLS=0)"
elif [ -f "$LINT_STAMP" ] && [ "$(cat "$LINT_STAMP")" = "$LINT_LINE" ] && [ "$PIP_RAN" -eq 0 ]; then
    say lint "ok (${LINT_REQUIREMENTS[*]} $AZDEV_REQUIREMENT)"
else
    t0=$(now_ms)
    log="$LOG_DIR/pip-lint.log"
    { install_into "$VENV/bin/python" "${LINT_REQUIREMENTS[@]}" \
      && install_into "$VENV/bin/python" --no-deps "$AZDEV_REQUIREMENT"; } >"$log" 2>&1 \
        || { show_log_tail "$log"; die "pip install of the lint tools failed"; }
    printf '%s\n' "$LINT_LINE" >"$LINT_STAMP"
    say lint "installed ${LINT_REQUIREMENTS[*]} $AZDEV_REQUIREMENT (no deps) in $(elapsed "$t0")"
fi

# --- egg-info ----------------------------------------------------------------
# az reads a dev extension's name and version from <name>.egg-info.  pip's
# PEP 660 editable install may build it in a temporary folder only, so make
# sure one exists at the repo root and is not older than setup.py.
EGG_INFO="elastictrain.egg-info"
if [ -f "$EGG_INFO/PKG-INFO" ] && [ ! "setup.py" -nt "$EGG_INFO/PKG-INFO" ] && [ "$PIP_RAN" -eq 0 ]; then
    say egg-info "ok ($EGG_INFO)"
elif [ -f "$EGG_INFO/PKG-INFO" ] && [ ! "setup.py" -nt "$EGG_INFO/PKG-INFO" ]; then
    say egg-info "ok ($EGG_INFO written by pip)"
else
    log="$LOG_DIR/egg-info.log"
    "$VENV/bin/python" setup.py -q egg_info >"$log" 2>&1 \
        || { show_log_tail "$log"; die "python setup.py egg_info failed"; }
    [ -f "$EGG_INFO/PKG-INFO" ] || die "setup.py egg_info did not write $EGG_INFO"
    say egg-info "wrote $EGG_INFO (setup.py egg_info)"
fi

# --- dev extension folder ----------------------------------------------------
mkdir -p "$DEV_EXT_DIR"
changed=0
for name in azext_elastictrain "$EGG_INFO"; do
    target="../../../$name"
    if [ "$(readlink "$DEV_EXT_DIR/$name" 2>/dev/null || true)" != "$target" ]; then
        rm -rf "${DEV_EXT_DIR:?}/$name"
        ln -s "$target" "$DEV_EXT_DIR/$name"
        changed=1
    fi
    [ -e "$DEV_EXT_DIR/$name" ] || die "$DEV_EXT_DIR/$name -> $target is dangling"
done
if [ "$changed" -eq 1 ]; then
    say devext "linked $DEV_EXT_DIR (AZURE_EXTENSION_DEV_SOURCES=<repo>/build/azext-dev)"
else
    say devext "ok ($DEV_EXT_DIR)"
fi

# --- check through the real az -----------------------------------------------
# A private config dir under build/ keeps ~/.azure untouched and keeps az's
# command index warm between runs.
t0=$(now_ms)
log="$LOG_DIR/az-check.log"
# shellcheck source=scripts/env.sh
if ( source scripts/env.sh \
     && export AZURE_CONFIG_DIR="$ROOT/build/az-config-setup" AZURE_CORE_COLLECT_TELEMETRY=false \
     && "$ROOT/$VENV/bin/az" elastictrain --help ) >"$log" 2>&1; then
    say check "ok (az elastictrain --help in $(elapsed "$t0"))"
else
    show_log_tail "$log"
    die "az elastictrain --help failed through $VENV/bin/az"
fi
echo "setup: done. Use: source scripts/env.sh"
