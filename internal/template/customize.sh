#!/bin/sh
# Customises the base template after mmdebstrap installed its packages. $1 is the new rootfs.
# Run by mmdebstrap as a --customize-hook, with /proc, /sys and /dev mounted in the target.
set -eu
root="$1"

# The default user, as in E2B's base image: uid/gid 1000, home /home/user, bash, passwordless sudo.
chroot "$root" groupadd --gid 1000 user
chroot "$root" useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user \
	--shell /bin/bash --groups sudo user
printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' >"$root/etc/sudoers.d/user"
chmod 0440 "$root/etc/sudoers.d/user"
chroot "$root" visudo -c -q

# The node gives every sandbox its own hostname through the UTS namespace; this is the default.
echo vmon >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
HOSTS
echo 'LANG=C.UTF-8' >"$root/etc/default/locale"
# The build copied the host's resolver, which sandboxes cannot reach (private ranges are always
# denied). Guests resolve through 8.8.8.8 as on E2B, which a domain allowOut implicitly allows.
rm -f "$root/etc/resolv.conf"
echo 'nameserver 8.8.8.8' >"$root/etc/resolv.conf"

# `pip install` works as in E2B's base image (Debian marks its Python as externally managed).
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED

# Every SDK command runs through `bash -l -c`, so /etc/profile runs on each of them. Its
# `$(id -u)` forks and execs id each time, which under gVisor is most of a short command's cost;
# bash already knows its EUID. Other shells that read /etc/profile still fall back to id.
sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/' "$root/etc/profile"
grep -q 'EUID:-' "$root/etc/profile" || { echo "template: /etc/profile not patched" >&2; exit 1; }

# Fail the build if anything the template promises is missing.
for bin in bash python python3 pip pip3 node npm git curl sudo ps ip getfattr gcc make less vi ssh; do
	chroot "$root" sh -c "command -v $bin >/dev/null" || { echo "template: $bin missing" >&2; exit 1; }
done
test -x "$root/usr/lib/git-core/git-daemon" || { echo "template: git daemon missing" >&2; exit 1; }

# Keep the template small: no apt lists or caches, logs, or backup files of the build.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/debconf/*-old \
	"$root"/var/lib/dpkg/*-old "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/root/.cache
