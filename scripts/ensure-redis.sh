#!/bin/sh
# Make sure redis-server and redis-cli are on PATH: the tests start their own
# Redis processes (a single node and a 3-master cluster) on free loopback ports.
# On Debian as root, install the redis-server package; otherwise fail and say how.
set -eu
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "ensure-redis: installing redis-server (Debian package)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
	command -v redis-server >/dev/null 2>&1 && exit 0
fi
echo "ensure-redis: redis-server and redis-cli are needed by the tests." >&2
echo "  Debian/Ubuntu: sudo apt-get install redis-server" >&2
echo "  macOS:         brew install redis" >&2
exit 1
