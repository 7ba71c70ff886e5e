"""The network of one local attempt (a single job or a whole gang): a network namespace of its own, and the one
path out of it that jobs legitimately need, to the control plane's API.

Started by the attempt's first launcher as a fork of itself, in a session of its own (``launch_limits.
start_holder``; ``<python> -I -S netns_holder.py <dir>`` runs it by hand). Standard library only, like the
launcher: it keeps working whatever happens to the control plane, and jobs outlive the control plane.

It forks once:
- the **inside** process makes a new network namespace (unprivileged: inside a new user namespace that maps the
  holder's uid to 0 and nothing else), brings its loopback up, binds the relay's listening socket there at the
  address jobs know the API by (``DLCLOUD_METRICS_URL``'s host and port, which is free there: the namespace is
  empty), and from then on only accepts connections and hands each one over to the outside process
  (``SCM_RIGHTS``). As root it drops to ``nobody`` once bound. Every process of the attempt joins this namespace
  (the launcher ``setns``-es each phase into it), so the replicas of a gang share one loopback, and nothing of
  the host's network — no host loopback service, no other job's port, no abstract unix socket of anyone else —
  is in reach.
- the **outside** process stays in the host's namespace and relays each connection it is handed to the API's
  address there, at most ``MAX_CONNECTIONS`` at a time: the API, and nothing else, is reachable from inside.

Files in ``<dir>`` (written atomically):
``network.json`` (input, written by the executor)
    {"listen": [host, port], "target": [host, port], "userns": bool, "ends": [paths], "egress": {"mode", "allow",
    "slirp4netns", "nft"}}; ``listen`` may be null (no relay); ``ends``: the launchers' exit records, all of
    which there (or their directories gone) end the holder by itself. Egress ``none``: nothing more.
    ``internet`` / ``allow``: the outside process starts ``slirp4netns`` (user-mode networking: the job's
    packets leave as this process's sockets, never through a route or a bridge on the host), and the inside one
    first loads nftables rules in the namespace: loopback and addresses the allow-list names pass; the host's
    own addresses (read from ``/proc/net`` before the fork), link-local ones (cloud metadata) and slirp4netns's
    gateway are refused; the allow-list's ranges and slirp4netns's DNS pass; then everything passes
    (``internet``) or nothing does (``allow``).
    ``volumes`` (``job_view.holder_volumes``; may be null): the inside process also makes a mount namespace with
    a tmpfs at ``volumes.root`` holding one overlay per job directory (``mount_volumes``), which the launchers
    join too, so that the sandbox binds overlays whose layers the kernel names ``/proc/self/fd/N``.
    ``publish`` {"address", "ports"}: for each port, the outside process listens on a free port of the address
    and pairs each connection with one the inside process makes to the port on the namespace's loopback.
``network-ready.json``
    {"pid", "proc_start_ticks", "inside_pid", "inside_start_ticks", "netns_inode", "mntns_inode", "published"}
    once the namespace is up: launchers wait for it, open ``/proc/<inside_pid>/ns/net`` (and ``mnt``) and check
    the start ticks before they trust it; ``published`` maps each published port to [address, host port].
``network-failed.json``
    {"message"} when the namespace could not be made; launchers then fail the attempt with that message.

Invariants: the inside process never connects anywhere; the outside one connects only to ``target``. Killing the
holder's process group (the executor does when the attempt has ended) ends both.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

CONFIG_FILE = "network.json"
READY_FILE = "network-ready.json"
FAILED_FILE = "network-failed.json"

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000, 0x80000
PR_SET_PDEATHSIG = 1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
NOBODY = 65534
MAX_CONNECTIONS = 64
CONNECT_TIMEOUT = 10.0
READY_TIMEOUT = 20.0
END_CHECK_SECONDS = 1.0  # how often the outside process looks whether the attempt is over


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def write_failed(directory: str, message: str) -> None:
    """Why the namespace could not be made, where the launchers look for it."""
    write_json_atomic(os.path.join(directory, FAILED_FILE), {"message": message})


def start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2 :].split()[19])


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_new_namespace(userns: bool, mounts: bool = False) -> None:
    """Unshare the network namespace (and, unprivileged, a user namespace mapping our uid to 0 in it; with
    ``mounts``, a mount namespace too)."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | (CLONE_NEWUSER if userns else 0) | (CLONE_NEWNS if mounts else 0)
    _check(libc.unshare(flags), "unshare")
    if userns:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req)[:18])[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def _mount(source: str, target: str, fstype: str | None, flags: int, options: str | None) -> None:
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    args = (source.encode(), target.encode(), fstype.encode() if fstype else None, flags)
    _check(libc.mount(*args, options.encode() if options else None), f"mounting {fstype or 'a bind'}")


# nothing that would tie the upper layer (the job's directory, kept across attempts) to this mount's lower one (new,
# empty, with every attempt): no index, no metacopy, no redirects written (renaming a merged directory, of which
# an empty lower leaves only the root, fails instead); accepted inside a user namespace too
OVERLAY_OPTIONS = "index=off,metacopy=off,redirect_dir=nofollow,nfs_export=off"


def _overlay(target: str, item: dict[str, Any], userns: bool) -> None:
    """One volume's overlay at ``target``, its layers opened here and named to the kernel by descriptor."""
    fds: list[int] = []

    def named(path: object) -> str:
        fds.append(os.open(str(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        return f"/proc/self/fd/{fds[-1]}"

    try:
        options = "lowerdir=" + ":".join(named(p) for p in item["lowers"])
        writable = bool(item.get("upper"))
        if writable:
            options += f",upperdir={named(item['upper'])},workdir={named(item['work'])},{OVERLAY_OPTIONS}"
        if userns:
            options += ",userxattr"
        _mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY), options)
    finally:
        for fd in fds:
            os.close(fd)


def mount_volumes(volumes: dict[str, Any], userns: bool) -> str:
    """The attempt's volumes, in this (new) mount namespace: a small tmpfs at ``volumes["root"]`` holding one
    overlay per volume (its one writable layer the job's directory on the host; a read-only one: the directory as
    its lower layer, over an empty one) and the small ``files`` given as text. Every layer is named to the kernel
    as ``/proc/self/fd/N``, so that a job's ``/proc/self/mountinfo`` shows ``overlay`` and those names, never a
    host path; the sandbox binds each volume where the job sees it. Where the kernel cannot make an overlay of
    a directory, the directory itself is bound there instead (returned: why, for the holder's log)."""
    root = str(volumes["root"])
    _mount("none", "/", None, MS_REC | MS_SLAVE, None)  # nothing mounted here reaches the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    fallback = ""
    for item in volumes.get("items") or ():
        target = os.path.join(root, str(item["name"]))
        os.mkdir(target, 0o755)
        try:
            _overlay(target, item, userns)
        except OSError as exc:  # no overlayfs here (an old kernel unprivileged, a data dir on NFS): plain binds
            fallback = fallback or f"overlays unavailable ({exc.strerror}): the job's directories are bound as they are"
            _bind(target, str(item.get("upper") or item["lowers"][0]), writable=bool(item.get("upper")))
    for name, text in (volumes.get("files") or {}).items():
        with open(os.path.join(root, str(name)), "w", encoding="utf-8") as f:
            f.write(str(text))
        os.chmod(os.path.join(root, str(name)), 0o644)
    return fallback


def _bind(target: str, source: str, writable: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC, None)
    if not writable:
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


SLIRP_GATEWAY, SLIRP_DNS = "10.0.2.2", "10.0.2.3"
ALWAYS_DENIED = ("169.254.0.0/16", "fe80::/10", SLIRP_GATEWAY)


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().splitlines()
    except OSError:
        return []


def host_addresses(fib_trie: str = "/proc/net/fib_trie", inet6: str = "/proc/net/if_inet6") -> list[str]:
    """Every address of this host's own interfaces (IPv4 local routes, IPv6 interface addresses)."""
    found: set[str] = set()
    last = ""
    for line in _lines(fib_trie):
        text = line.strip()
        if text.startswith("|-- "):
            last = text[4:]
        elif text == "/32 host LOCAL" and last:
            found.add(last)
    for line in _lines(inet6):
        raw = line.split()[0]
        found.add(str(ipaddress.ip_address(":".join(raw[i : i + 4] for i in range(0, 32, 4)))))
    return sorted(found)


def nft_rules(mode: str, allow: list[str], deny: list[str]) -> str:
    """The egress rules of the namespace's output chain: loopback; addresses the allow-list names one by one
    (a host's own address passes only so); the host's own addresses, link-local ones and slirp4netns's gateway
    refused; the allow-list's ranges; slirp4netns's DNS; then everything (``internet``) or nothing (``allow``).
    Refused connections fail at once (an ICMP "administratively prohibited"), not after a time-out."""
    exact = [a.split("/")[0] for a in allow if "/" not in a or a.endswith(("/32", "/128"))]
    ranges = [a for a in allow if a.split("/")[0] not in exact]
    lines = ["table inet dlcloud {", "  chain output {", "    type filter hook output priority 0; policy accept;"]
    lines.append('    oifname "lo" accept')
    for addrs, verdict in ((exact, "accept"), (deny, "reject with icmpx type admin-prohibited"), (ranges, "accept")):
        for v6, keyword in ((False, "ip"), (True, "ip6")):
            chosen = [a for a in addrs if (":" in a) == v6]
            if chosen:
                lines.append(f"    {keyword} daddr {{ {', '.join(chosen)} }} {verdict}")
    lines.append(f"    ip daddr {SLIRP_DNS} udp dport 53 accept")
    lines.append(f"    ip daddr {SLIRP_DNS} tcp dport 53 accept")
    if mode != "internet":
        lines.append("    reject with icmpx type admin-prohibited")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def load_rules(nft: str, rules: str) -> None:
    proc = subprocess.run([nft, "-f", "-"], input=rules.encode(), capture_output=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise OSError(f"nft refused the egress rules: {proc.stderr.decode(errors='replace').strip()[:500]}")


def start_slirp(egress: dict[str, Any], pid: int, userns: bool) -> None:
    """slirp4netns for the namespace of ``pid``, configured (tap0, 10.0.2.100/24, DNS 10.0.2.3) before it
    returns; it stays in the holder's process group, so it ends with it."""
    ready_r, ready_w = os.pipe()
    argv = [str(egress["slirp4netns"]), "--configure", "--mtu=65520", "--disable-host-loopback"]
    argv += [f"--ready-fd={ready_w}", "--enable-seccomp", "--netns-type=path"]
    if userns:
        argv.append(f"--userns-path=/proc/{pid}/ns/user")
    else:  # its own mount namespace, capabilities dropped; it fails inside a user namespace of one uid
        argv.append("--enable-sandbox")
    argv += [f"/proc/{pid}/ns/net", "tap0"]
    proc = subprocess.Popen(argv, pass_fds=(ready_w,), stdin=subprocess.DEVNULL)
    os.close(ready_w)
    readable, _, _ = select.select([ready_r], [], [], READY_TIMEOUT)
    ok = bool(readable) and os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    if not ok:
        proc.kill()
        raise OSError(f"slirp4netns did not bring the job's network up (exit code {proc.poll()})")


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def answer_publish(channel: socket.socket) -> None:
    """Inside: for each port the outside process asks for (a host connection to a published port waits), a
    connection to that port on the namespace's loopback, handed over (or ``e``: nothing listens there)."""
    while True:
        try:
            asked = channel.recv(2, socket.MSG_WAITALL)
        except OSError:
            os._exit(0)
        if len(asked) != 2:
            os._exit(0)  # the outside process is gone
        (port,) = struct.unpack("!H", asked)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT) as conn:
                conn.settimeout(None)
                socket.send_fds(channel, [b"k"], [conn.fileno()])
        except OSError:
            with contextlib.suppress(OSError):
                channel.sendall(b"e")


def inside(
    config: dict[str, Any], channel: socket.socket, ready_w: int, deny: list[str], published: socket.socket
) -> None:
    """The inside process: make the namespace, report, then hand over every connection made to the relay, and
    connect to the job's published ports when the outside process asks."""
    try:
        volumes = config.get("volumes")
        enter_new_namespace(bool(config.get("userns")), mounts=bool(volumes))
        if volumes:
            fallback = mount_volumes(volumes, bool(config.get("userns")))
            if fallback:
                print(f"netns_holder: {fallback}", file=sys.stderr, flush=True)
        loopback_up()
        egress = config.get("egress") or {}
        if egress.get("mode") in ("internet", "allow"):
            load_rules(str(egress["nft"]), nft_rules(str(egress["mode"]), list(egress.get("allow") or ()), deny))
        listen = config.get("listen")
        sock = _listener(str(listen[0]), int(listen[1])) if listen else None
        if os.getuid() == 0 and not config.get("userns"):
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        if os.getppid() == 1:
            os._exit(1)
        os.write(ready_w, b"ok")
    except BaseException as exc:
        os.write(ready_w, f"error: {exc}".encode()[:4000])
        os._exit(1)
    os.close(ready_w)
    threading.Thread(target=answer_publish, args=(published,), daemon=True).start()
    if sock is None:
        while True:
            signal.pause()
    while True:
        conn, _ = sock.accept()
        try:
            socket.send_fds(channel, [b"c"], [conn.fileno()])
        except OSError:
            os._exit(0)  # the outside process is gone
        finally:
            conn.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)


def relay(conn: socket.socket, target: tuple[str, int], slots: threading.BoundedSemaphore) -> None:
    try:
        with conn, socket.create_connection(target, timeout=CONNECT_TIMEOUT) as out:
            out.settimeout(None)
            conn.settimeout(None)
            back = threading.Thread(target=_pump, args=(out, conn), daemon=True)
            back.start()
            _pump(conn, out)
            back.join()
    except OSError:
        pass
    finally:
        slots.release()


class Publisher:
    """Outside: the host's listeners of the job's published ports; each connection is paired with one the inside
    process makes to the port in the namespace, then relayed both ways (at most MAX_CONNECTIONS at once, apart
    from the API relay's)."""

    def __init__(self, config: dict[str, Any], channel: socket.socket) -> None:
        publish = config.get("publish") or {}
        address = str(publish.get("address") or "127.0.0.1")
        relay_port = (config.get("listen") or [None, None])[1]  # the API's, inside: never published
        self.channel = channel
        self.lock = threading.Lock()
        # its own connections, apart from the API relay's: however many a published port holds open (a browser's
        # keep-alives, a flood from whoever reaches the address), the job still reaches the API
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        ports = [int(p) for p in publish.get("ports") or () if int(p) != relay_port]
        self.listeners = {port: _listener(address, 0) for port in ports}

    def published(self) -> dict[str, list[object]]:
        return {str(port): list(sock.getsockname()[:2]) for port, sock in self.listeners.items()}

    def accept(self, sock: socket.socket) -> None:
        port = next(p for p, s in self.listeners.items() if s is sock)
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        if not self.slots.acquire(blocking=False):
            conn.close()
            return
        threading.Thread(target=self.forward, args=(conn, port, self.slots), daemon=True).start()

    def forward(self, conn: socket.socket, port: int, slots: threading.BoundedSemaphore) -> None:
        try:
            with self.lock:
                self.channel.sendall(struct.pack("!H", port))
                _msg, fds, _flags, _addr = socket.recv_fds(self.channel, 16, 1)
            if not fds:
                conn.close()  # nothing listens on the port in the job's network
                return
            inner = socket.socket(fileno=fds[0])
            with conn, inner:
                back = threading.Thread(target=_pump, args=(inner, conn), daemon=True)
                back.start()
                _pump(conn, inner)
                back.join()
        except OSError:
            conn.close()
        finally:
            slots.release()


def attempt_over(ends: list[str]) -> bool:
    """Whether every launcher of the attempt recorded its end (or the attempt's directory is gone): the holder
    then ends by itself, whether or not the executor is there to end it."""
    return bool(ends) and all(os.path.exists(p) or not os.path.isdir(os.path.dirname(p)) for p in ends)


def outside(config: dict[str, Any], channel: socket.socket, publisher: Publisher) -> None:
    """The outside process: relay every connection the inside one hands over to the API's address, and forward
    the published ports' connections in."""
    target = config.get("target")
    ends = [str(p) for p in config.get("ends") or ()]
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    listeners = list(publisher.listeners.values())
    checked = time.monotonic()
    while True:
        readable = select.select([channel, *listeners], [], [], END_CHECK_SECONDS)[0]
        if time.monotonic() - checked >= END_CHECK_SECONDS:  # however busy its ports, an ended attempt ends it
            if attempt_over(ends):
                return
            checked = time.monotonic()
        for sock in readable:
            if sock is not channel:
                publisher.accept(sock)
        if channel not in readable:
            continue
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(channel, 16, 1)
        except OSError:
            return
        if not fds:
            return  # the inside process is gone: nothing holds the namespace any more
        conn = socket.socket(fileno=fds[0])
        for extra in fds[1:]:
            os.close(extra)
        if not target or not slots.acquire(blocking=False):
            conn.close()  # no API to reach, or too many at once: refused, never queued
            continue
        threading.Thread(target=relay, args=(conn, (str(target[0]), int(target[1])), slots), daemon=True).start()


def probe(directory: str, userns: bool) -> int:
    """``--probe DIR 0|1``: whether this host lets the holder make an overlay like a job directory's in ``DIR``
    (as root, or unprivileged with ``1``); prints ``ok``, else why not."""
    try:
        empty, upper, work = (os.path.join(directory, n) for n in ("volumes-empty", "upper", "volumes-work"))
        for d in (empty, upper, work, os.path.join(work, "probe"), os.path.join(directory, "volumes")):
            os.mkdir(d, 0o700)
        enter_new_namespace(userns, mounts=True)
        _mount("none", "/", None, MS_REC | MS_SLAVE, None)
        item = {"lowers": [empty], "upper": upper, "work": os.path.join(work, "probe")}
        _overlay(os.path.join(directory, "volumes"), item, userns)
        print("ok")
    except OSError as exc:
        print(exc.strerror or str(exc))
    return 0


def main(argv: list[str]) -> int:
    if argv[1] == "--probe":
        return probe(argv[2], argv[3] == "1")
    directory = argv[1]
    with open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as f:
        config = json.load(f)
    egress = config.get("egress") or {}
    filtered = egress.get("mode") in ("internet", "allow")
    deny = [*host_addresses(), *ALWAYS_DENIED] if filtered else []  # read here, in the host's namespace
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pub_ours, pub_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ours.close()
        pub_ours.close()
        os.close(ready_r)
        inside(config, theirs, ready_w, deny, pub_theirs)
        os._exit(0)
    theirs.close()
    pub_theirs.close()
    os.close(ready_w)
    readable, _, _ = select.select([ready_r], [], [], READY_TIMEOUT)
    answer = os.read(ready_r, 4096).decode(errors="replace") if readable else "error: timed out"
    os.close(ready_r)
    if answer == "ok" and filtered:
        try:
            start_slirp(egress, pid, bool(config.get("userns")))
        except OSError as exc:
            answer = f"error: {exc}"
    publisher = None
    if answer == "ok":
        try:
            publisher = Publisher(config, pub_ours)
        except OSError as exc:
            answer = f"error: the job's ports could not be published: {exc}"
    if answer != "ok" or publisher is None:
        write_failed(directory, answer.removeprefix("error: "))
        os.kill(pid, signal.SIGKILL)
        return 1
    write_json_atomic(
        os.path.join(directory, READY_FILE),
        {
            "pid": os.getpid(),
            "proc_start_ticks": start_ticks(os.getpid()),
            "inside_pid": pid,
            "inside_start_ticks": start_ticks(pid),
            "netns_inode": os.stat(f"/proc/{pid}/ns/net").st_ino,
            "mntns_inode": os.stat(f"/proc/{pid}/ns/mnt").st_ino if config.get("volumes") else None,
            "ready_at": time.time(),
            "published": publisher.published(),
        },
    )
    outside(config, ours, publisher)
    os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
