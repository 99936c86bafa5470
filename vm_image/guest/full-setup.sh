#!/bin/sh
# Runs inside the debootstrapped root (chroot) to finish the full image. Idempotent enough to rerun.
set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

# Nothing may start services inside the build chroot; PostgreSQL is started by hand below.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d

# dbus is for systemd-logind, which turns the ACPI power button (QMP system_powerdown) into a
# clean poweroff; minbase lacks it. qemu-guest-agent: Debian's unit starts it (via udev) when
# the VM has the org.qemu.guest_agent.0 port (vm_runner --vcpu-mode online).
apt-get install -y --no-install-recommends \
    linux-image-cloud-amd64 initramfs-tools systemd-sysv udev dbus iproute2 procps \
    postgresql postgresql-contrib prometheus-node-exporter qemu-guest-agent
apt-get clean

echo vm > /etc/hostname
echo '/dev/vda / ext4 defaults,noatime 0 1' > /etc/fstab
passwd -d root
for unit in systemd-networkd.service cpu-onliner.service memory-onliner.service \
        prometheus-node-exporter.service postgresql.service; do
    systemctl enable "$unit"
done
# Fail the build, not the boot, if the onliner would not start (it is what makes vCPUs usable).
test -L /etc/systemd/system/multi-user.target.wants/cpu-onliner.service
test -x /usr/local/sbin/cpu-onliner
test -L /etc/systemd/system/multi-user.target.wants/memory-onliner.service
test -x /usr/local/sbin/memory-onliner
# Root shell on the serial console without a password: the console is the test's keyboard.
mkdir -p /etc/systemd/system/serial-getty@ttyS0.service.d
# $TERM is for systemd to expand when it starts agetty, not for this shell.
# shellcheck disable=SC2016
printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %%I $TERM\n' \
    > /etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf

# PostgreSQL reachable through the user-net forward, by password from any address: QEMU shows a
# forwarded connection as from 10.0.2.2 only when it came from loopback; others keep their own.
PGVER=$(ls /etc/postgresql)
CONF=/etc/postgresql/$PGVER/main
echo "listen_addresses = '*'" > "$CONF/conf.d/listen.conf"
echo 'host all all 0.0.0.0/0 scram-sha-256' >> "$CONF/pg_hba.conf"
echo 'host all all ::/0 scram-sha-256' >> "$CONF/pg_hba.conf"
pg_ctlcluster "$PGVER" main start
su postgres -c "psql -q -c \"CREATE ROLE bench LOGIN PASSWORD 'bench'\""
su postgres -c "createdb -O bench pgbench"
su postgres -c "PGPASSWORD=bench /usr/lib/postgresql/$PGVER/bin/pgbench -i -s ${PGBENCH_SCALE:-10} -h 127.0.0.1 -U bench pgbench"
pg_ctlcluster "$PGVER" main stop

rm -f /usr/sbin/policy-rc.d
