#!/bin/sh
# Installs the npm packages the tests use (the official MCP SDK client) into
# tests/node/, from the npm registry, when tests/node/package.json exists.
cd "$(dirname "$0")/node" 2>/dev/null || exit 0
[ -f package.json ] || exit 0
[ -d node_modules ] && [ node_modules -nt package.json ] && exit 0
command -v npm >/dev/null || { echo "npm-deps: npm not found" >&2; exit 1; }
echo "deps: npm install in tests/node"
npm install --no-audit --no-fund --silent && touch node_modules
