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
#   pip       torch (CPU wheel, at setup.py's pin: scripts/pins.py reads it) and uv (pinned) with pip, then with
#             uv: azure-cli, this package editable with [train,test] (and its DEPENDENCIES from setup.py: the
#             pinned official kubernetes client); skipped while .venv/.elastictrain-stamp matches setup.py + the
#             requirement line.
#             Why two installers: pip finds a machine's local torch wheel (uv does not look there, and PyPI's
#             torch of that version is the CUDA build); uv installs azure-cli's ~200 packages in seconds where pip took
#             ~150 s here (compiling included). If uv fails, pip.
#   checkov   checkov (pinned) in its own venv .tools/checkov: it pins many packages azure-cli pins otherwise
#             (290 MB once; then "ok"). Scans the planned ARM bodies in the contract tests.
#   lint      the gates azure-cli-extensions CI runs, pinned: azdev (its linter rules and style configs),
#             pylint, flake8 (tests/unit/test_publish_gates.py runs them)
#   egg-info  elastictrain.egg-info at the repo root (az reads a dev extension's metadata there)
#   devext    build/azext-dev/elastictrain/ -> symlinks, found by az via AZURE_EXTENSION_DEV_SOURCES
#   check     `az elastictrain --help` through the real .venv/bin/az
#
# Reuse: what the azurite, venv (with pip and lint) and checkov steps install is kept once per machine in a cache
# folder, one entry per version (azurite-<version>, checkov-<version>, venv-<hash of setup.py, the pins, the lint
# pins, ELASTICTRAIN_PIP_ARGS and python3's version>), so another checkout on the machine (a CI run's fresh clone)
# takes it in seconds instead of installing again (~3 min on 2 cores: pip's torch, uv, compiling 19,000 modules).
# An entry is used only once complete (its marker is written last) and is checked when taken: azurite's and
# checkov's version, the venv's `uv pip freeze` equal to the one recorded when it was built. .tools/node_modules
# and .tools/checkov are links to their entry; .venv is hard links to its entry (a copy across file systems) with
# its scripts pointed at .venv, and this checkout installed editable into it. One setup at a time builds or
# takes an entry (flock); the two venv entries used last are kept. A clean machine builds the entries first.
#
# Environment knobs:
#   ELASTICTRAIN_PIP_ARGS   extra pip arguments for the pip step, e.g.
#                           "--extra-index-url https://download.pytorch.org/whl/cpu"
#                           on a machine without a local CPU torch wheel.
#   ELASTICTRAIN_CACHE_DIR  the cache folder (default ${XDG_CACHE_HOME:-~/.cache}/elastictrain); "off": install
#                           into this checkout only, as before.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

AZURITE_VERSION="3.37.0"
CHECKOV_VERSION="3.3.30"
CHECKOV_VENV=".tools/checkov"
# torch's pin is setup.py's ([train]): read from there, so that the wheel pip installs first is the one uv keeps
TORCH_REQUIREMENT="$(python3 scripts/pins.py torch)" \
    || { echo "setup: ERROR: cannot read torch's pin from setup.py (python3 scripts/pins.py torch)" >&2; exit 1; }
PIP_FIRST=("$TORCH_REQUIREMENT" uv==0.13.9)  # with pip (see "pip" above)
PIP_REQUIREMENTS=(azure-cli==2.91.0 "$TORCH_REQUIREMENT" -e ".[train,test]")
# azdev's own requirements (sphinx==1.6.7, tox, setuptools<80, ...) are for its other commands and clash with
# azure-cli's: its linter rules and style configs need only knack, PyYAML and requests, which azure-cli brings.
LINT_REQUIREMENTS=(pylint==4.1.4 flake8==7.5.0)
AZDEV_REQUIREMENT="azdev==0.2.13"
VENV=".venv"
STAMP="$VENV/.elastictrain-stamp"
LINT_STAMP="$VENV/.elastictrain-lint-stamp"
LOG_DIR="build/setup-logs"
DEV_EXT_DIR="build/azext-dev/elastictrain"

PIP_LINE="pip install ${PIP_FIRST[*]} && uv pip install ${PIP_REQUIREMENTS[*]}"
WANT_STAMP="$({ cat setup.py; printf '%s\n' "$PIP_LINE"; } | sha256sum | cut -d' ' -f1)"
LINT_LINE="uv pip install ${LINT_REQUIREMENTS[*]} && uv pip install --no-deps $AZDEV_REQUIREMENT"
CACHE_HOME="${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}"
CACHE_DIR="${ELASTICTRAIN_CACHE_DIR:-${CACHE_HOME:+$CACHE_HOME/elastictrain}}"
# Test tools (checkov, lint) only for the tests: the demo sets ELASTICTRAIN_SETUP_TEST_TOOLS=0.
TEST_TOOLS="${ELASTICTRAIN_SETUP_TEST_TOOLS:-1}"

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
    local uv="${UV:-$VENV/bin/uv}"
    if [ -x "$uv" ] && "$uv" pip install --python "$python" ${ELASTICTRAIN_PIP_ARGS:-} "$@"; then
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

# --- cache helpers: one entry per version, built once, then taken -----------------
cache_on() { [ -n "$CACHE_DIR" ] && [ "$CACHE_DIR" != off ] && mkdir -p "$CACHE_DIR" 2>/dev/null && [ -w "$CACHE_DIR" ]; }
# cache_lock <entry>: hold <entry>.lock (fd 9) until cache_unlock: one setup at a time builds or takes an entry
cache_lock() {
    exec 9>"$CACHE_DIR/$1.lock"
    if command -v flock >/dev/null 2>&1; then flock 9; fi
}
cache_unlock() { exec 9>&-; }
need_venv_module() {
    command -v python3 >/dev/null 2>&1 || die "python3 not found"
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv
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
azurite_ok() { # <prefix>: azurite@AZURITE_VERSION installed there
    [ -x "$1/node_modules/.bin/azurite-blob" ] \
        && grep -q "\"version\": *\"$AZURITE_VERSION\"" "$1/node_modules/azurite/package.json" 2>/dev/null
}
if azurite_ok .tools; then
    say azurite "ok (azurite@$AZURITE_VERSION in .tools)"
elif cache_on; then
    command -v npm >/dev/null 2>&1 || die "npm not found (needed for azurite)"
    t0=$(now_ms)
    entry="$CACHE_DIR/azurite-$AZURITE_VERSION"
    cache_lock "azurite-$AZURITE_VERSION"
    if [ -f "$entry/.complete" ] && azurite_ok "$entry"; then
        how="took azurite@$AZURITE_VERSION from $entry"
    else
        log="$LOG_DIR/npm.log"
        rm -rf "$entry"
        npm install --prefix "$entry" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >"$log" 2>&1 \
            || { show_log_tail "$log"; die "npm install azurite@$AZURITE_VERSION into $entry failed"; }
        azurite_ok "$entry" || die "npm finished but $entry has no azurite@$AZURITE_VERSION"
        touch "$entry/.complete"
        how="installed azurite@$AZURITE_VERSION into $entry"
    fi
    cache_unlock
    mkdir -p .tools
    rm -rf .tools/node_modules
    ln -s "$entry/node_modules" .tools/node_modules
    azurite_ok .tools || die "$AZURITE_BIN is not azurite@$AZURITE_VERSION"
    say azurite "$how, linked .tools/node_modules in $(elapsed "$t0")"
else
    command -v npm >/dev/null 2>&1 || die "npm not found (needed for azurite)"
    t0=$(now_ms)
    log="$LOG_DIR/npm.log"
    npm install --prefix .tools --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >"$log" 2>&1 \
        || { show_log_tail "$log"; die "npm install azurite@$AZURITE_VERSION failed"; }
    [ -x "$AZURITE_BIN" ] || die "npm finished but $AZURITE_BIN is missing"
    say azurite "installed azurite@$AZURITE_VERSION into .tools in $(elapsed "$t0")"
fi

# --- venv from the machine's cache ----------------------------------------------
# build_venv <dir>: what the venv, pip and lint steps below install, into a new venv <dir>, less this checkout
build_venv() {
    local dir="$1" py="$1/bin/python"
    python3 -m venv --clear "$dir" \
        && "$py" -m pip install --disable-pip-version-check ${ELASTICTRAIN_PIP_ARGS:-} "${PIP_FIRST[@]}" \
        && UV="$dir/bin/uv" install_into "$py" "${PIP_REQUIREMENTS[@]}" \
        && UV="$dir/bin/uv" install_into "$py" "${LINT_REQUIREMENTS[@]}" \
        && UV="$dir/bin/uv" install_into "$py" --no-deps "$AZDEV_REQUIREMENT" \
        && "$dir/bin/uv" pip uninstall --python "$py" elastictrain \
        && "$dir/bin/uv" pip freeze --python "$py" --exclude-editable >"$dir/.freeze"
}
# venv_from_cache: .venv as the cache's entry for these versions (built first if there is none), checked
venv_from_cache() {
    local key entry new t0 how script
    t0=$(now_ms)
    key="$({ printf '%s\n' "$WANT_STAMP" "$LINT_LINE" "${ELASTICTRAIN_PIP_ARGS:-}"
             python3 -c 'import sys; print(sys.executable, sys.version)'; } | sha256sum | cut -c1-16)"
    entry="$CACHE_DIR/venv-$key"
    case "$entry$ROOT" in *'#'*) return 1 ;; esac  # the path rewrite below uses '#'
    need_venv_module
    cache_lock "venv-$key"
    if [ "$(cat "$entry/.complete" 2>/dev/null)" = "$key" ] && [ -s "$entry/.freeze" ]; then
        how="took the venv from $entry"
    else
        rm -rf "$entry"
        printf 'setup: %-9s %s ... ' venv "building $entry: $PIP_LINE, lint tools (log: $LOG_DIR/pip.log)"
        if build_venv "$entry" >"$LOG_DIR/pip.log" 2>&1; then
            printf 'done in %s\n' "$(elapsed "$t0")"
        else
            printf 'FAILED\n'
            show_log_tail "$LOG_DIR/pip.log"
            rm -rf "$entry"
            cache_unlock
            return 1
        fi
        printf '%s\n' "$key" >"$entry/.complete"  # last: the entry is whole
        how="built the venv in $entry"
    fi
    touch "$entry"  # used last: kept
    new="$VENV.new"
    rm -rf "$new" "$VENV"
    cp -al "$entry" "$new" 2>/dev/null || { rm -rf "$new"; cp -a "$entry" "$new"; }
    cache_unlock
    rm -f "$new/.complete" "$new/.freeze"
    # its scripts and activate files name the entry's path (sed -i writes a new file: the entry keeps its own)
    for script in "$new"/bin/*; do
        if [ -f "$script" ] && [ ! -L "$script" ] && grep -qF "$entry" "$script"; then
            sed -i "s#$entry#$ROOT/$VENV#g" "$script"
        fi
    done
    mv "$new" "$VENV"
    # this checkout, editable; then checked: the same distributions as the entry recorded when it was built
    UV="$VENV/bin/uv" install_into "$VENV/bin/python" --no-deps -e ".[train,test]" >"$LOG_DIR/pip-editable.log" 2>&1 \
        || { show_log_tail "$LOG_DIR/pip-editable.log"; return 1; }
    if ! "$VENV/bin/uv" pip freeze --python "$VENV/bin/python" --exclude-editable 2>/dev/null \
            | cmp -s - "$entry/.freeze"; then
        echo "setup: the venv from $entry does not hold what it recorded (.freeze): removed it; installing here" >&2
        cache_lock "venv-$key"
        rm -rf "$entry"  # the next setup builds it again
        cache_unlock
        return 1
    fi
    grep -rqF "$entry" "$VENV/bin" && { echo "setup: $VENV/bin still names $entry; installing here" >&2; return 1; }
    printf '%s\n' "$WANT_STAMP" >"$STAMP"
    printf '%s\n' "$LINT_LINE" >"$LINT_STAMP"
    say venv "$how, linked as $VENV, this checkout editable, uv pip freeze checked, in $(elapsed "$t0")"
    # the two entries used last stay (a checkout's .venv is its own links: removing an entry breaks none)
    ls -1dt "$CACHE_DIR"/venv-*/ 2>/dev/null | tail -n +3 | while read -r old; do
        old="${old%/}"
        (if command -v flock >/dev/null 2>&1; then flock -n 8 || exit 0; fi; rm -rf "$old") 8>"$old.lock"
    done
}
venv_current() {
    [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT_STAMP" ] \
        && { [ "$TEST_TOOLS" = 0 ] || [ "$(cat "$LINT_STAMP" 2>/dev/null)" = "$LINT_LINE" ]; }
}
if ! venv_current && cache_on; then
    venv_from_cache || { rm -rf "$VENV" "$VENV.new"; say venv "not taken from the cache (above): installing here"; }
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
if [ "$TEST_TOOLS" = 0 ]; then
    say checkov "skipped (test tool; ELASTICTRAIN_SETUP_TEST_TOOLS=0)"
elif [ -x "$CHECKOV_VENV/bin/checkov" ] && [ "$(cat "$CHECKOV_VENV/.version" 2>/dev/null)" = "$CHECKOV_VERSION" ]; then
    say checkov "ok (checkov $CHECKOV_VERSION in $CHECKOV_VENV)"
elif cache_on; then
    t0=$(now_ms)
    entry="$CACHE_DIR/checkov-$CHECKOV_VERSION"
    cache_lock "checkov-$CHECKOV_VERSION"
    if [ -x "$entry/bin/checkov" ] && [ "$(cat "$entry/.version" 2>/dev/null)" = "$CHECKOV_VERSION" ]; then
        how="took checkov $CHECKOV_VERSION from $entry"
    else
        log="$LOG_DIR/checkov.log"
        need_venv_module
        rm -rf "$entry"
        { python3 -m venv --clear "$entry" && install_into "$entry/bin/python" "checkov==$CHECKOV_VERSION"; } >"$log" 2>&1 \
            || { show_log_tail "$log"; rm -rf "$entry"; die "installing checkov==$CHECKOV_VERSION into $entry failed"; }
        printf '%s\n' "$CHECKOV_VERSION" >"$entry/.version"  # last: the entry is whole
        how="installed checkov $CHECKOV_VERSION into $entry"
    fi
    cache_unlock
    mkdir -p "$(dirname "$CHECKOV_VENV")"
    rm -rf "$CHECKOV_VENV"
    ln -s "$entry" "$CHECKOV_VENV"
    say checkov "$how, linked $CHECKOV_VENV in $(elapsed "$t0")"
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
