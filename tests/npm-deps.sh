#!/bin/sh
# Installs the npm packages the tests use (the official MCP SDK client) into
# tests/node/ from the npm registry. Node.js may come from Debian or from a
# vendor package that bundles npm (this image has NodeSource's nodejs, which
# conflicts with Debian's npm), so Debian's nodejs/npm are installed only when
# no npm is found at all.
cd "$(dirname "$0")/node" 2>/dev/null || exit 0
[ -f package.json ] || exit 0
if ! command -v npm >/dev/null 2>&1; then
    echo "deps: installing Debian nodejs npm"
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null ||
        { echo "npm-deps: cannot install npm" >&2; exit 1; }
fi
[ -d node_modules ] && [ node_modules -nt package.json ] && [ node_modules -nt package-lock.json ] && exit 0
echo "deps: npm ci in tests/node"
npm ci --no-audit --no-fund --loglevel=error >/dev/null && touch node_modules ||
    { echo "npm-deps: npm ci failed" >&2; exit 1; }
