"""The QEMU command line, the accelerator choice and the flag parsing: pure, no QEMU needed."""

from __future__ import annotations

import dataclasses

import pytest

from vm_runner import cli
from vm_runner.cmdline import (
    Accel,
    Forward,
    VcpuMode,
    VmSpec,
    build_qemu_command,
    parse_forward,
    parse_memory,
    qga_socket_beside,
    resolve_accel,
)

MIB = 1024 * 1024


def make_spec(**overrides: object) -> VmSpec:
    fields: dict[str, object] = {
        "kernel": "/img/vmlinuz",
        "initrd": "/img/initramfs.cpio.gz",
        "min_vcpus": 1,
        "max_vcpus": 4,
        "memory_bytes": 512 * MIB,
        "accel": Accel.TCG,
        "qmp_socket": "/run/vm/qmp.sock",
        "control_socket": "/tmp/private/control.sock",
        # Most tests pin the flags both modes share; the online mode has its own tests below.
        "vcpu_mode": VcpuMode.HOTPLUG,
    }
    fields.update(overrides)
    return VmSpec(**fields)  # type: ignore[arg-type]


def option(argv: list[str], flag: str) -> list[str]:
    """Every value given to ``flag``, in order."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_minimal_spec_gives_the_whole_command_line():
    assert build_qemu_command(make_spec()) == [
        "qemu-system-x86_64",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-machine",
        "pc-q35-7.2,accel=tcg",
        "-smp",
        "1,maxcpus=4",
        "-m",
        "512M",
        "-kernel",
        "/img/vmlinuz",
        "-initrd",
        "/img/initramfs.cpio.gz",
        "-append",
        "console=ttyS0 panic=-1 quiet",
        "-netdev",
        "user,id=net0",
        "-device",
        "virtio-net-pci,netdev=net0",
        "-chardev",
        "socket,id=qmp,path=/run/vm/qmp.sock,server=on,wait=off",
        "-mon",
        "chardev=qmp,mode=control",
        "-chardev",
        "socket,id=control,path=/tmp/private/control.sock,server=on,wait=off",
        "-mon",
        "chardev=control,mode=control",
        "-chardev",
        "stdio,id=serial0,signal=off",
        "-serial",
        "chardev:serial0",
        "-no-reboot",
    ]


@pytest.mark.parametrize(
    ("overrides", "flag", "expected"),
    [
        ({"accel": Accel.KVM}, "-machine", ["pc-q35-7.2,accel=kvm"]),
        ({"machine_type": "pc-q35-8.2"}, "-machine", ["pc-q35-8.2,accel=tcg"]),
        ({"incoming_port": 4444}, "-incoming", ["tcp:0:4444"]),
        ({}, "-incoming", []),
        ({"min_vcpus": 2, "max_vcpus": 8}, "-smp", ["2,maxcpus=8"]),
        ({"min_vcpus": 3, "max_vcpus": 3}, "-smp", ["3,maxcpus=3"]),
        ({"memory_bytes": 2048 * MIB}, "-m", ["2048M"]),
        ({"initrd": None}, "-initrd", []),
        (
            {"kernel_args": ("loglevel=7", "nokaslr")},
            "-append",
            ["console=ttyS0 panic=-1 quiet loglevel=7 nokaslr"],
        ),
        (
            {"forwards": (Forward(address="127.0.0.1", host_port=19100, guest_port=9100),)},
            "-netdev",
            ["user,id=net0,hostfwd=tcp:127.0.0.1:19100-:9100"],
        ),
        (
            {
                "forwards": (
                    Forward(address="0.0.0.0", host_port=9100, guest_port=9100),
                    Forward(address="0.0.0.0", host_port=5432, guest_port=5432),
                )
            },
            "-netdev",
            ["user,id=net0,hostfwd=tcp:0.0.0.0:9100-:9100,hostfwd=tcp:0.0.0.0:5432-:5432"],
        ),
        (
            {"migration_port": 4445},
            "-chardev",
            [
                "socket,id=qmp,path=/run/vm/qmp.sock,server=on,wait=off",
                "socket,id=control,path=/tmp/private/control.sock,server=on,wait=off",
                "socket,id=migration-tcp,host=0.0.0.0,port=4445,server=on,wait=off",
                "stdio,id=serial0,signal=off",
            ],
        ),
        (
            {"serial_socket": "/tmp/s/serial.sock"},
            "-chardev",
            [
                "socket,id=qmp,path=/run/vm/qmp.sock,server=on,wait=off",
                "socket,id=control,path=/tmp/private/control.sock,server=on,wait=off",
                "socket,id=serial0,path=/tmp/s/serial.sock,server=on,wait=off",
            ],
        ),
        (
            {"qmp_socket": "/run/a,b/qmp.sock"},
            "-chardev",
            [
                "socket,id=qmp,path=/run/a,,b/qmp.sock,server=on,wait=off",
                "socket,id=control,path=/tmp/private/control.sock,server=on,wait=off",
                "stdio,id=serial0,signal=off",
            ],
        ),
        (
            {"disk": "/img/disk.img"},
            "-drive",
            ["file=/img/disk.img,if=virtio,format=raw,cache=none,aio=threads"],
        ),
        (
            {"disk": "/img/disk.img", "initrd": "/img/initrd.img"},
            "-append",
            ["console=ttyS0 panic=-1 quiet root=/dev/vda rw"],
        ),
    ],
    ids=[
        "kvm",
        "machine-type",
        "incoming",
        "no-incoming-by-default",
        "smp-min-and-max",
        "smp-fixed-size",
        "memory-in-mib",
        "no-initrd",
        "extra-kernel-args-last",
        "one-forward",
        "forwards-in-order",
        "qmp-on-tcp",
        "serial-socket",
        "comma-in-path-doubled",
        "disk-as-virtio",
        "disk-sets-root",
    ],
)
def test_spec_field_shapes_its_flag(overrides, flag, expected):
    assert option(build_qemu_command(make_spec(**overrides)), flag) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"min_vcpus": 0}, "1 <= min_vcpus <= max_vcpus"),
        ({"min_vcpus": 5, "max_vcpus": 4}, "1 <= min_vcpus <= max_vcpus"),
        ({"memory_bytes": 512 * MIB + 1}, "whole number of MiB"),
        ({"memory_bytes": 0}, "whole number of MiB"),
        ({"accel": Accel.AUTO}, "must be resolved"),
        ({"incoming_port": 0}, "outside 1..65535"),
        ({"migration_port": 70000}, "outside 1..65535"),
        ({"migration_port": 4444, "incoming_port": 4444}, "both 4444"),
    ],
    ids=[
        "zero-vcpus",
        "min-above-max",
        "memory-not-mib",
        "memory-zero",
        "accel-unresolved",
        "incoming-port-zero",
        "migration-port-too-big",
        "migration-port-is-incoming-port",
    ],
)
def test_inconsistent_spec_is_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_spec(**overrides)


@pytest.mark.parametrize(
    ("requested", "is_kvm_usable", "is_kvm_boot_known", "expected"),
    [
        (Accel.AUTO, False, False, Accel.TCG),
        (Accel.AUTO, True, False, Accel.TCG),
        (Accel.AUTO, False, True, Accel.TCG),
        (Accel.AUTO, True, True, Accel.KVM),
        (Accel.TCG, True, True, Accel.TCG),
        (Accel.KVM, True, False, Accel.KVM),
    ],
    ids=[
        "auto-no-kvm",
        "auto-kvm-opens-but-unproven",
        "auto-proven-but-no-device",
        "auto-kvm-proven",
        "tcg-forced",
        "kvm-forced",
    ],
)
def test_resolve_accel(requested, is_kvm_usable, is_kvm_boot_known, expected):
    resolved = resolve_accel(
        requested, is_kvm_usable=is_kvm_usable, is_kvm_boot_known=is_kvm_boot_known
    )
    assert resolved is expected


def test_forced_kvm_without_device_is_an_error():
    with pytest.raises(ValueError, match="/dev/kvm is not usable"):
        resolve_accel(Accel.KVM, is_kvm_usable=False, is_kvm_boot_known=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512Mi", 512 * MIB), ("1Gi", 1024 * MIB), ("65536Ki", 64 * MIB), ("1048576", MIB)],
    ids=["mebibytes", "gibibytes", "kibibytes", "bytes"],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["512M", "1.5Gi", "-1Mi", "lots"], ids=str)
def test_parse_memory_rejects(text):
    with pytest.raises(ValueError, match="Ki, Mi or Gi"):
        parse_memory(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("19100:9100", Forward(address="127.0.0.1", host_port=19100, guest_port=9100)),
        ("0.0.0.0:5432:5432", Forward(address="0.0.0.0", host_port=5432, guest_port=5432)),
    ],
    ids=["default-address", "explicit-address"],
)
def test_parse_forward(text, expected):
    assert parse_forward(text, default_address="127.0.0.1") == expected


@pytest.mark.parametrize("text", ["9100", "a:b", "0:9100", "9100:70000"], ids=str)
def test_parse_forward_rejects(text):
    with pytest.raises(ValueError, match="forward"):
        parse_forward(text, default_address="127.0.0.1")


def parse_args(*extra: str):
    base = ["--kernel", "k", "--min-vcpus", "1", "--max-vcpus", "2", "--qmp-socket", "/q"]
    return cli.make_parser().parse_args([*base, *extra])


def test_default_forwards_cover_node_exporter_and_postgres():
    spec = cli.spec_from_args(parse_args(), is_kvm_usable=False, control_socket="/c")
    assert spec.forwards == (
        Forward(address="127.0.0.1", host_port=9100, guest_port=9100),
        Forward(address="127.0.0.1", host_port=5432, guest_port=5432),
    )
    assert spec.memory_bytes == 512 * MIB
    assert spec.accel is Accel.TCG


def test_listen_address_applies_to_forwards_without_one():
    args = parse_args("--listen-address", "0.0.0.0", "--forward", "9100:9100")
    spec = cli.spec_from_args(args, is_kvm_usable=False, control_socket="/c")
    assert spec.forwards == (Forward(address="0.0.0.0", host_port=9100, guest_port=9100),)


def test_kvm_boots_flag_lets_auto_pick_kvm():
    args = parse_args("--kvm-boots")
    spec = cli.spec_from_args(args, is_kvm_usable=True, control_socket="/c")
    assert spec.accel is Accel.KVM


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.make_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    parser = cli.make_parser()
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help"
        for flag in action.option_strings:
            assert flag in text


def test_bad_flags_exit_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--kernel", "k", "--min-vcpus", "3", "--max-vcpus", "2", "--qmp-socket", "/q"])
    assert exit_info.value.code == 2
    assert "1 <= min_vcpus <= max_vcpus" in capsys.readouterr().err


def test_max_memory_adds_a_virtio_mem_device_plugged_at_zero_onlined_by_the_guest():
    argv = build_qemu_command(make_spec(max_memory_bytes=2048 * MIB))
    assert option(argv, "-m") == ["512M,maxmem=2048M"]
    assert option(argv, "-object") == ["memory-backend-ram,id=vmem0-ram,size=1536M"]
    assert "virtio-mem-pci,id=vmem0,memdev=vmem0-ram,block-size=2M,requested-size=0" in option(
        argv, "-device"
    )
    # The guest's memory-onliner chooses each block's zone; the kernel onlines nothing itself.
    assert option(argv, "-append") == ["console=ttyS0 panic=-1 quiet memhp_default_state=offline"]


@pytest.mark.parametrize("mode", list(VcpuMode))
def test_memory_hotplug_adds_the_memory_signal_port_beside_the_qmp_socket(mode):
    argv = build_qemu_command(
        make_spec(max_memory_bytes=2048 * MIB, vcpu_mode=mode, qga_socket="/run/vm/qmp.qga.sock")
    )
    assert "socket,id=memsig0,path=/run/vm/qmp.memory.sock,server=on,wait=off" in option(
        argv, "-chardev"
    )
    devices = option(argv, "-device")
    assert devices.count("virtio-serial-pci,id=vser0") == 1
    assert "virtserialport,bus=vser0.0,chardev=memsig0,name=org.vm-autoscaling.memory.0" in devices
    assert ("virtserialport,bus=vser0.0,chardev=qga0,name=org.qemu.guest_agent.0" in devices) is (
        mode is VcpuMode.ONLINE
    )


def test_no_serial_ports_without_memory_hotplug_or_qga():
    argv = build_qemu_command(make_spec())
    assert not [d for d in option(argv, "-device") if "virtio-serial" in d or "virtserialport" in d]


@pytest.mark.parametrize("max_memory", [None, 512 * MIB], ids=["unset", "equal"])
def test_no_memory_hotplug_without_room_above_memory(max_memory):
    argv = build_qemu_command(make_spec(max_memory_bytes=max_memory))
    assert option(argv, "-m") == ["512M"]
    assert option(argv, "-object") == []
    assert "memhp" not in option(argv, "-append")[0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_memory_bytes": 256 * MIB}, "must be >= memory"),
        ({"max_memory_bytes": 513 * MIB}, "whole number of memory blocks"),
        ({"max_memory_bytes": 1024 * MIB, "memory_block_bytes": 3 * MIB}, "power of two"),
    ],
    ids=["below-memory", "not-blocks", "block-not-power-of-two"],
)
def test_bad_memory_hotplug_specs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_spec(**overrides)


def test_migration_target_is_the_source_command_line_plus_incoming():
    """QEMU accepts a migration only onto the same machine type and device set: the target's
    argv is the source's, virtio-mem still at requested-size=0, with -incoming appended."""
    source = make_spec(max_memory_bytes=2048 * MIB, vcpu_mode=VcpuMode.ONLINE, qga_socket="/q")
    target = build_qemu_command(dataclasses.replace(source, incoming_port=4444))
    assert target == [*build_qemu_command(source), "-incoming", "tcp:0:4444"]
    assert "requested-size=0" in option(target, "-device")[0]


def test_incoming_and_machine_type_flags():
    args = parse_args(
        "--incoming-port", "4444", "--machine-type", "pc-q35-7.1", "--migration-socket", "/m"
    )
    spec = cli.spec_from_args(args, is_kvm_usable=False, control_socket="/c")
    assert (spec.incoming_port, spec.machine_type) == (4444, "pc-q35-7.1")
    assert "socket,id=migration,path=/m,server=on,wait=off" in option(
        build_qemu_command(spec), "-chardev"
    )
    default = cli.spec_from_args(parse_args(), is_kvm_usable=False, control_socket="/c")
    assert (default.incoming_port, default.machine_type) == (None, "pc-q35-7.2")


def test_max_memory_and_block_size_flags():
    args = parse_args("--memory", "1Gi", "--max-memory", "4Gi", "--memory-block-size", "128Mi")
    spec = cli.spec_from_args(args, is_kvm_usable=False, control_socket="/c")
    assert (spec.memory_bytes, spec.max_memory_bytes) == (1024 * MIB, 4096 * MIB)
    assert spec.memory_block_bytes == 128 * MIB


def test_online_mode_differs_from_hotplug_only_in_vcpus_and_the_qga_port():
    """All max vCPUs exist from boot (no free hot-plug slot), the kernel brings up min of them,
    and qemu-guest-agent's port is wired to the QGA socket; everything else is the same."""
    hotplug = build_qemu_command(make_spec())
    online = build_qemu_command(
        make_spec(vcpu_mode=VcpuMode.ONLINE, qga_socket="/run/vm/qmp.qga.sock")
    )
    expected = list(hotplug)
    expected[expected.index("1,maxcpus=4")] = "4,maxcpus=4"
    expected[expected.index("console=ttyS0 panic=-1 quiet")] = (
        "console=ttyS0 panic=-1 quiet maxcpus=1"
    )
    serial = expected.index("stdio,id=serial0,signal=off") - 1  # its -chardev
    expected[serial:serial] = [
        "-device",
        "virtio-serial-pci,id=vser0",
        "-chardev",
        "socket,id=qga0,path=/run/vm/qmp.qga.sock,server=on,wait=off",
        "-device",
        "virtserialport,bus=vser0.0,chardev=qga0,name=org.qemu.guest_agent.0",
    ]
    assert online == expected


def test_online_mode_user_kernel_args_come_after_maxcpus():
    spec = make_spec(
        vcpu_mode=VcpuMode.ONLINE, qga_socket="/q.sock", min_vcpus=2, kernel_args=("loglevel=7",)
    )
    assert option(build_qemu_command(spec), "-append") == [
        "console=ttyS0 panic=-1 quiet maxcpus=2 loglevel=7"
    ]


def test_online_mode_without_a_qga_socket_is_refused():
    with pytest.raises(ValueError, match="needs a QGA socket"):
        make_spec(vcpu_mode=VcpuMode.ONLINE)


@pytest.mark.parametrize(
    ("qmp", "qga"),
    [
        ("/run/vm/qmp.sock", "/run/vm/qmp.qga.sock"),
        (
            "/var/run/vm-autoscaling/qmp/1234-abcd.sock",
            "/var/run/vm-autoscaling/qmp/1234-abcd.qga.sock",
        ),
        ("/run/vm/monitor", "/run/vm/monitor.qga.sock"),
    ],
    ids=["qmp.sock", "pod-uid", "no-suffix"],
)
def test_qga_socket_sits_beside_the_qmp_socket(qmp, qga):
    assert qga_socket_beside(qmp) == qga


def test_vcpu_mode_defaults_to_online_with_the_qga_socket_beside_qmp():
    spec = cli.spec_from_args(parse_args(), is_kvm_usable=False, control_socket="/c")
    assert spec.vcpu_mode is VcpuMode.ONLINE
    assert spec.qga_socket == "/q.qga.sock"
    spec = cli.spec_from_args(
        parse_args("--qga-socket", "/elsewhere/ga.sock"), is_kvm_usable=False, control_socket="/c"
    )
    assert spec.qga_socket == "/elsewhere/ga.sock"


def test_hotplug_mode_has_no_qga_socket():
    spec = cli.spec_from_args(
        parse_args("--vcpu-mode", "hotplug"), is_kvm_usable=False, control_socket="/c"
    )
    assert (spec.vcpu_mode, spec.qga_socket) == (VcpuMode.HOTPLUG, None)
    assert "maxcpus=" not in option(build_qemu_command(spec), "-append")[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--vcpu-mode", "hotplug", "--qga-socket", "/g.sock"),
            "only used with --vcpu-mode online",
        ),
        (("--qga-socket", "/q"), "must differ from --qmp-socket"),
    ],
    ids=["qga-socket-in-hotplug-mode", "qga-socket-is-the-qmp-socket"],
)
def test_bad_qga_flags_exit_with_status_2(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--kernel", "k", "--min-vcpus", "1", "--max-vcpus", "2", "--qmp-socket", "/q",
                  *flags])  # fmt: skip
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
