#!/usr/bin/env bash
# Runs vLLM's OpenAI-server tests against `jaxllm serve`: one pytest process per test file.
#
#   benchmarks/vllm_server_tests/run.sh [--workdir DIR] [TEST_FILE ...]
#
# DIR is the work directory setup.sh prepared (default $VLLM_TESTS_DIR, else ./.vllm-tests). TEST_FILEs are relative
# to DIR (e.g. tests/entrypoints/openai/chat_completion/test_root_path.py); default: those in test_files.txt.
# Each file writes DIR/results/<file name>.xml (JUnit) and .log; server logs go to DIR/logs. Environment:
# FILE_TIMEOUT (s per file, default 1500), TEST_TIMEOUT (s per test, default 600), PYTEST_ADDOPTS (more pytest
# options). The shim is copied from this folder into DIR first, so edits to it apply.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_workdir_arg "$@"

default_test_files() {
    grep -v -e '^#' -e '^[[:space:]]*$' "$HARNESS_DIR/test_files.txt"
}

# Runs one test file; prints its name and pytest's last line.
run_test_file() {
    local file="$1"
    local name
    name="$(basename "$file" .py)"
    (cd "$WORK_DIR" && timeout "${FILE_TIMEOUT:-1500}" "$VENV/bin/python" -m pytest -p no:cacheprovider -rA \
        --timeout "${TEST_TIMEOUT:-600}" --tb=native --junitxml="results/$name.xml" "$file" \
        > "results/$name.log" 2>&1) || true
    echo "$name: $(tail -n 1 "$WORK_DIR/results/$name.log")"
}

if [ ! -d "$WORK_DIR/tests/entrypoints" ] || [ ! -x "$VENV/bin/python" ]; then
    echo "$WORK_DIR is not set up: run $HARNESS_DIR/setup.sh --workdir $WORK_DIR first" >&2
    exit 1
fi
install_shim
mkdir -p "$WORK_DIR/results" "$WORK_DIR/logs"
if [ ${#ARGS[@]} -gt 0 ]; then
    files=("${ARGS[@]}")
else
    mapfile -t files < <(default_test_files)
fi
for file in "${files[@]}"; do
    run_test_file "$file"
done
echo "per-file counts and failures: python3 $HARNESS_DIR/summarize.py --workdir $WORK_DIR"
