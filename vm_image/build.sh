#!/bin/sh
full|full [--out DIR] [--cache DIR]
# A thin wrapper so CI and Dockerfiles need not know the Python entry point. The builder uses
# only the Python standard library plus apt-get/dpkg-deb, which every Debian machine has.
set -eu
cd "$(dirname "$0")/.."
if ! command -v python3 >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3
fi
exec python3 -m vm_image "$@"
