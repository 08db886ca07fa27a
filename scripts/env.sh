# shellcheck shell=bash
# Source me (bash or zsh) to use this checkout's tools:
#
#     source scripts/env.sh
#
# Puts .venv/bin (az, python, pytest) and .tools/node_modules/.bin (azurite)
# first on PATH and points the real `az` at this checkout's extension via
# AZURE_EXTENSION_DEV_SOURCES (a dev extension; ~/.azure is left alone).
# Run `bash scripts/setup.sh` once first to create those folders.
# Sourcing it again does not grow PATH.

if [ -n "${BASH_SOURCE:-}" ]; then
    _et_env_file="${BASH_SOURCE[0]}"
elif [ -n "${ZSH_VERSION:-}" ]; then
    eval '_et_env_file="${(%):-%x}"'
else
    _et_env_file="${0}"
fi
case "${_et_env_file}" in
    *env.sh) ;;
    *) _et_env_file="${PWD}/scripts/env.sh" ;;  # plain sh cannot tell; assume the repo root
esac
if [ ! -f "${_et_env_file}" ]; then
    echo "scripts/env.sh: cannot locate the repository; source it from bash/zsh or from the repo root" >&2
    unset _et_env_file
    return 1 2>/dev/null || exit 1
fi

ELASTICTRAIN_ROOT="$(cd "$(dirname "${_et_env_file}")/.." && pwd -P)"
export ELASTICTRAIN_ROOT
unset _et_env_file

_et_path_prepend() {
    case ":${PATH}:" in
        *":$1:"*) ;;
        *) PATH="$1${PATH:+:${PATH}}" ;;
    esac
}
_et_path_prepend "${ELASTICTRAIN_ROOT}/.tools/node_modules/.bin"
_et_path_prepend "${ELASTICTRAIN_ROOT}/.venv/bin"
unset -f _et_path_prepend
export PATH

export AZURE_EXTENSION_DEV_SOURCES="${ELASTICTRAIN_ROOT}/build/azext-dev"
