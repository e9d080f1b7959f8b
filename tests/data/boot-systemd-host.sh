#!/bin/bash
# Boots a real systemd as PID 1 of a new PID namespace, on an overlay of this machine's root, for the
# systemd deployer's tests. Run as: unshare --pid --fork --mount --uts --ipc boot-systemd-host.sh BASE PAYLOAD CGROUP
#   BASE     an empty directory: the overlay's writable layer and mount point live on a tmpfs mounted here
#   PAYLOAD  a directory whose tree is copied over the new root (units, sshd config, keys)
#   CGROUP   a fresh cgroup name: systemd manages only that subtree of this machine's hierarchies
# Writes go to the overlay's upper layer and /tmp, /run and /dev are fresh tmpfs mounts, so systemd's
# tmpfiles cleanup and everything the tests do stay inside; /sys and /proc/sys are read-only.
#   SERVE_TUNER_TEST_HIDE="DIR ..." mounts an empty tmpfs over each DIR inside the host (the controller's cache).
#   SERVE_TUNER_TEST_CGROUP=v2 boots on the unified hierarchy of a hybrid machine (/sys/fs/cgroup/unified
#   mounted over /sys/fs/cgroup in this private mount namespace), to test the cgroup-v2 path on it.
# Exit status 3: this machine refused a namespace, mount or cgroup (the test skips off CI, saying so).
set -euo pipefail
base=$1 payload=$2 cgroup=$3
refused() { echo "refused: $*" >&2; exit 3; }
if [ "${4:-}" != in-cgroup-namespace ]; then
    mount --make-rprivate / || refused "mount --make-rprivate / (no mount namespace privileges)"
    if [ "${SERVE_TUNER_TEST_CGROUP:-}" = v2 ] && [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
        [ -e /sys/fs/cgroup/unified/cgroup.procs ] || refused "SERVE_TUNER_TEST_CGROUP=v2 but no unified hierarchy"
        mount -t cgroup2 cgroup2 /sys/fs/cgroup || refused "mounting the unified cgroup hierarchy"
    fi
fi
if [ "${4:-}" != in-cgroup-namespace ] && [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    # cgroup v2: one hierarchy. A fresh cgroup delegated to the host's systemd (it moves itself into
    # init.scope and enables what controllers it is given), then a cgroup namespace rooted there.
    mkdir -p "/sys/fs/cgroup/$cgroup" || refused "creating a cgroup under /sys/fs/cgroup"
    echo $$ > "/sys/fs/cgroup/$cgroup/cgroup.procs" || refused "moving into a cgroup of the unified hierarchy"
    exec unshare --cgroup "$0" "$base" "$payload" "$cgroup" in-cgroup-namespace
elif [ "${4:-}" != in-cgroup-namespace ]; then
    # cgroup v1: into a fresh cgroup of every hierarchy, then a cgroup namespace rooted there: systemd
    # sees that cgroup as its root and creates its slices under it, not in this machine's hierarchy.
    for hierarchy in /sys/fs/cgroup/*/; do
        [ -e "$hierarchy/cgroup.procs" ] || continue
        mkdir -p "$hierarchy$cgroup"
        if [ -e "$hierarchy/cpuset.cpus" ]; then  # a v1 cpuset takes no process until it has CPUs and memory
            cat "$hierarchy/cpuset.cpus" > "$hierarchy$cgroup/cpuset.cpus"
            cat "$hierarchy/cpuset.mems" > "$hierarchy$cgroup/cpuset.mems"
        fi
        echo $$ > "$hierarchy$cgroup/cgroup.procs" || refused "moving into a cgroup of $hierarchy"
    done
    exec unshare --cgroup "$0" "$base" "$payload" "$cgroup" in-cgroup-namespace
fi
mount --make-rprivate /
mount -t tmpfs -o mode=700 tmpfs "$base" || refused "mounting a tmpfs"
mkdir -p "$base/upper" "$base/work" "$base/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$base/upper,workdir=$base/work" "$base/root" \
    || refused "mounting an overlay of / (the root filesystem may not allow it as a lower layer)"
root=$base/root
mount -t proc proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount --rbind /sys "$root/sys"
mount -o remount,bind,ro "$root/sys"
# The cgroup hierarchies mounted afresh inside the namespace show only its own subtree.
mount -t tmpfs -o mode=755 tmpfs "$root/sys/fs/cgroup"
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup" || refused "mounting the unified cgroup hierarchy inside"
else
for hierarchy in /sys/fs/cgroup/*/; do
    name=$(basename "$hierarchy")
    [ -L "${hierarchy%/}" ] && { ln -s "$(readlink "${hierarchy%/}")" "$root/sys/fs/cgroup/$name"; continue; }
    options=$(awk -v dir="${hierarchy%/}" '$2 == dir && $3 == "cgroup" {print $4}' /proc/self/mounts)
    [ -n "$options" ] || continue
    mkdir -p "$root/sys/fs/cgroup/$name"
    mount -t cgroup -o "$options" cgroup "$root/sys/fs/cgroup/$name" || refused "mounting the $name cgroup hierarchy"
done
fi
for dir in tmp run; do mount -t tmpfs -o mode=1777 tmpfs "$root/$dir"; done
chmod 755 "$root/run"
mount -t tmpfs -o mode=755 tmpfs "$root/dev"
for node in null zero full random urandom tty; do
    touch "$root/dev/$node"
    mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir -p "$root/dev/shm" "$root/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
cp -a "$payload/." "$root/"
# This machine's directories the host must not see (the controller's build cache): an empty tmpfs over each.
for hidden in ${SERVE_TUNER_TEST_HIDE:-}; do
    if [ -d "$root$hidden" ]; then mount -t tmpfs -o mode=755 tmpfs "$root$hidden"; fi
done
# Only what the tests need starts: the target below, not the machine's own services.
for unit in systemd-sysctl.service systemd-modules-load.service systemd-udevd.service systemd-udev-trigger.service \
            systemd-remount-fs.service systemd-timesyncd.service getty.target console-getty.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
cd "$root"
exec chroot . env -i container=serve-tuner-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --unit=serve-tuner-test.target --log-target=journal
