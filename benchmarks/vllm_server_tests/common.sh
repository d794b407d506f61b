# Shared by setup.sh and run.sh (sourced): locations and argument parsing.
#
#   HARNESS_DIR  this folder (the shim and the file list live here)
#   REPO_ROOT    the jaxllm repository this folder belongs to
#   WORK_DIR     --workdir DIR, else $VLLM_TESTS_DIR, else ./.vllm-tests (relative to the current directory)
#   VENV         $VLLM_TESTS_VENV, else $WORK_DIR/venv

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"

# Parses --workdir DIR / --workdir=DIR out of the arguments; the others are left in ARGS.
parse_workdir_arg() {
    WORK_DIR="${VLLM_TESTS_DIR:-./.vllm-tests}"
    ARGS=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --workdir) WORK_DIR="$2"; shift 2 ;;
            --workdir=*) WORK_DIR="${1#--workdir=}"; shift ;;
            *) ARGS+=("$1"); shift ;;
        esac
    done
    WORK_DIR="$(absolute_path "$WORK_DIR")"
    VENV="$(absolute_path "${VLLM_TESTS_VENV:-$WORK_DIR/venv}")"
}

# A path made absolute against the current directory (the path need not exist).
absolute_path() {
    case "$1" in
        /*) echo "$1" ;;
        *) echo "$PWD/${1#./}" ;;
    esac
}

# Copies the shim (pytest.ini, tests/utils.py, tests/conftest.py, stubs/) into the work directory, replacing the
# previous copy, so that edits to this folder apply to the next run.
install_shim() {
    rm -rf "$WORK_DIR/stubs"
    cp -R "$HARNESS_DIR/shim/." "$WORK_DIR/"
}
