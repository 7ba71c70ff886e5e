"""A seccomp filter that keeps sandboxed jobs from making user namespaces, for bwrap's ``--seccomp FD``.

Unprivileged, bwrap's ``--disable-userns`` does this; as root the sandbox has no user namespace of its own (bwrap
runs privileged and ``setpriv`` drops to the tenant's uid), and an unprivileged uid may create user namespaces
on most kernels (``unshare -Ur``), which opens kernel surface meant for root. The filter:
- ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` in their flags: ``EPERM``;
- ``clone3``, whose flags are behind a pointer a filter cannot read: ``ENOSYS``, so libc falls back to
  ``clone`` (what container runtimes do);
- x32 system calls on x86_64: ``EPERM``; every other call, and other architectures than the filter's: allowed.

The program is classic BPF as ``struct sock_filter`` entries, native byte order.
"""

from __future__ import annotations

import errno
import platform
import struct

CLONE_NEWUSER = 0x10000000
# (AUDIT_ARCH_*, unshare, clone, clone3) per machine
_ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}
_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000
# offsets in struct seccomp_data: nr, arch, args[0] (its low 32 bits first on little-endian machines)
_NR, _ARCH, _ARG0 = 0, 4, 16


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def no_user_namespaces(machine: str | None = None) -> bytes | None:
    """The filter for this machine, or None where its system call numbers are not known here."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, unshare, clone, clone3 = arch
    deny, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    prog = [
        _ins(_LD_W_ABS, _ARCH),
        _ins(_JEQ_K, audit, 1, 0),  # 1
        _ins(_RET_K, _ALLOW),  # 2: another architecture's calls
        _ins(_LD_W_ABS, _NR),  # 3
        _ins(_JGE_K, _X32_BIT, 0, 1) if audit == 0xC000003E else _ins(_JEQ_K, 0xFFFFFFFF, 0, 1),  # 4
        _ins(_RET_K, deny),  # 5: x32
        _ins(_JEQ_K, clone3, 0, 1),  # 6
        _ins(_RET_K, enosys),  # 7
        _ins(_JEQ_K, unshare, 1, 0),  # 8
        _ins(_JEQ_K, clone, 0, 3),  # 9 -> 13
        _ins(_LD_W_ABS, _ARG0),  # 10
        _ins(_JSET_K, CLONE_NEWUSER, 0, 1),  # 11
        _ins(_RET_K, deny),  # 12
        _ins(_RET_K, _ALLOW),  # 13
    ]
    return b"".join(prog)
