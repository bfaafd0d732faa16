#!/bin/sh
# The browser tests drive Debian's Chromium with Playwright (no browser download).
# Installs it when missing and we may (root with apt-get); otherwise says why not.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the browser tests..."
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "chromium is not installed and cannot be installed here (needs root and apt-get):"
    echo "the browser tests will skip with that reason."
fi
