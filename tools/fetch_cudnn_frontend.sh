#!/bin/bash
# tools/fetch_cudnn_frontend.sh — puts NVIDIA's cudnn-frontend headers (PyPI's nvidia-cudnn-frontend wheel) under .dev/cudnn-frontend/include, for ./configure --with-cudnn-attention=frontend on a machine without network (carry .dev there).
# Usage: tools/fetch_cudnn_frontend.sh [VERSION]   (default 1.32.0; needs pip and network here)
set -euo pipefail
version=${1:-1.32.0}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp" "nvidia-cudnn-frontend==$version"
wheel=$(ls "$tmp"/nvidia_cudnn_frontend-*.whl)
python3 -m zipfile -e "$wheel" "$tmp/unpacked"
if [ ! -f "$tmp/unpacked/include/cudnn_frontend.h" ]; then
    echo "fetch_cudnn_frontend.sh: $wheel has no include/cudnn_frontend.h" >&2
    exit 1
fi
rm -rf .dev/cudnn-frontend
mkdir -p .dev/cudnn-frontend
cp -r "$tmp/unpacked/include" .dev/cudnn-frontend/include
echo "$version" > .dev/cudnn-frontend/VERSION
echo "cudnn-frontend $version headers in .dev/cudnn-frontend/include"
