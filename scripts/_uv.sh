# Sourced by scripts/dev and scripts/test: make sure `uv` is available.
# A fresh machine needs only Python 3.11+; uv is installed into .tools/ if absent.
ductor_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v uv >/dev/null 2>&1; then
  tools="$ductor_root/.tools"
  if [ ! -x "$tools/venv/bin/uv" ]; then
    echo "bootstrapping uv into $tools ..." >&2
    python3 -m venv "$tools/venv" >&2
    "$tools/venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv>=0.5" >&2
  fi
  export PATH="$tools/venv/bin:$PATH"
fi
export UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}"
