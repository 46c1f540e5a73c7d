#!/bin/sh
# Installs the Debian packages vmon and its tests need. Idempotent and non-interactive; run as root.
#
#   make, git         build vmon
#   mmdebstrap        builds the base template from Debian packages
#   iproute2          ip netns / ip link, for debugging and the networking layer
#   iptables          sandbox uplink filtering (networking layer)
#   e2fsprogs         mkfs.ext4, for each sandbox's size-limited disk image
#   erofs-utils       mkfs.erofs, for root filesystem images a sandbox boots without a gofer
#   patch             applies vmon's patches to gVisor (scripts/install-runsc.sh)
#   libnss-myhostname makes *.localhost names resolve to loopback (E2B_DOMAIN=localhost setups)
#   busybox-static    the tiny rootfs of the runtime tests and the fixture images of the template tests
#   bash-static       the fixture images' /bin/bash (the SDK runs commands with bash)
#   ca-certificates, curl, file  used by the scripts and tests
#   python3-ipykernel the Jupyter kernel the code-interpreter service's Go tests drive
#   node-typescript   the parser the service's JavaScript runner uses for top-level await and import
#   openjdk-17-jdk-headless  java and jshell, for the service's Java runner tests
#   systemd           runs the units in deploy/systemd; its systemd-analyze checks them in the tests
#   postgresql        the database several drivers share (--database); the tests start their own
#                     server from its binaries (the package's own cluster is not used)
# Node.js and npm (for the SDK end-to-end tests) are expected to be installed already.
set -eu

PACKAGES="make git mmdebstrap iproute2 iptables e2fsprogs erofs-utils patch libnss-myhostname busybox-static bash-static ca-certificates curl file python3-ipykernel node-typescript openjdk-17-jdk-headless systemd postgresql"

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "all packages installed:$(printf ' %s' $PACKAGES)"
else
	echo "installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	# shellcheck disable=SC2086
	apt-get install -y -q --no-install-recommends $missing
fi

# libnss-myhostname only resolves names once "myhostname" is in the hosts line of nsswitch.conf.
if ! grep -Eq '^hosts:.*\bmyhostname\b' /etc/nsswitch.conf; then
	sed -i -E 's/^(hosts:.*)$/\1 myhostname/' /etc/nsswitch.conf
	echo "added myhostname to /etc/nsswitch.conf"
fi
