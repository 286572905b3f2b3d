"""The first program inside a kvlab sandbox; :mod:`kvlab.grading.sandbox` starts it.

It runs as ``python -I -S sandbox_shim.py SPEC -- COMMAND...`` (standard library only, no site:
it must not import kvlab or torch, and it starts in milliseconds). It first joins the run's pids
cgroup if it was given one, so every process of the run is counted. In namespace mode
``unshare`` has already put it in new user, mount, network, IPC and UTS namespaces, where it is
root with every capability. It then

1. hides the host's /tmp, /var/tmp and /run behind empty tmpfs mounts (keeping the working
   folder, the protected paths and the interpreter where they are), replaces /dev by a small
   one (null, zero, full, random, urandom, tty, the GPUs, its own shm and pts), remounts every
   other mount read-only but the working folder, makes the protected paths read-only bind
   mounts, and brings loopback up if asked;
2. enters a new PID namespace and forks a small init (PID 1) that mounts a read-only /proc of
   its own and reaps orphans; when the command ends, init ends, and the kernel kills every
   process left in the namespace, so nothing the submission forked outlives the run;
3. forks the command (PID 2): resets every signal, sets the resource limits, drops every
   capability (so the submission cannot unmount or remount what step 1 did; a user namespace
   of its own only gets it locked copies of those mounts), chdirs and execs.

The shim itself stays outside the PID namespace as the process the judge holds. It enforces
the wall time (SIGKILL to init, so the whole tree dies), writes one JSON line about how the
command ended (wait status, CPU seconds, peak memory, whether the wall time stopped it) to the
status pipe, and then ends the way the command ended: same exit code, or killed by the same
signal, so ``Popen.returncode`` reads as if the command had run directly.

In fallback mode (no namespaces) only the limits, the process group and the wall time apply.

Setup problems go to the "ready" pipe (``setup: ...``, or ``exec: errno: ...`` when the command
cannot be started) ahead of EOF, which the command's exec causes (the pipe is close-on-exec);
``note: ...`` lines there are things that were skipped but are not fatal.
"""

import ctypes
import json
import os
import resource
import signal
import socket
import struct
import sys
import time

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_RELATIME = 1 << 21
# statvfs f_flag bits that a remount inside a user namespace must keep (the kernel locks them).
ST_TO_MS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECBIT_NOROOT = 1 | 2  # NOROOT and NOROOT_LOCKED: uid 0 gains no capabilities at exec
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 1

RLIMITS = {
    "memory_bytes": resource.RLIMIT_AS,
    "cpu_seconds": resource.RLIMIT_CPU,
    "processes": resource.RLIMIT_NPROC,
    "open_files": resource.RLIMIT_NOFILE,
    "output_bytes": resource.RLIMIT_FSIZE,
}

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not be set up as asked (the judge falls back or gives up)."""


def _call(name, *args):
    result = getattr(_libc, name)(*args)
    if result == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _mount(source, target, fstype, flags, data=None):
    enc = [None if x is None else os.fsencode(x) for x in (source, target, fstype, data)]
    _libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    try:
        _call("mount", enc[0], enc[1], enc[2], flags, enc[3])
    except OSError as err:
        raise SetupError(f"mount {fstype or ''} {source} on {target}: {err.strerror}") from None


def _prctl(option, arg2=0):
    _libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    _call("prctl", option, arg2, 0, 0, 0)


def _bind_readonly(path):
    """Bind ``path`` onto itself, then remount that bind read-only, keeping locked flags."""
    _mount(path, path, None, MS_BIND | MS_REC)
    _remount_readonly(path)


def _inside(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _hide_private_dirs(private, keep, size, notes, overlay=(), readonly=False):
    """An empty tmpfs on each folder; paths in ``keep`` under one stay where they were, and
    each ``(source, target)`` of ``overlay`` whose target lies under one is bound there.

    A kept path is opened (O_PATH) before its folder is covered and bound back from
    ``/proc/self/fd``, which still reaches the covered original. ``readonly``: the folders are
    hidden, not the run's own (a small tmpfs, remounted read-only with the rest).
    """
    for folder in private:
        inner = [(p, p) for p in keep if _inside(p, folder)]
        inner += [(src, dst) for src, dst in overlay if _inside(dst, folder)]
        handles = [(dst, os.open(src, os.O_PATH | os.O_CLOEXEC)) for src, dst in inner]
        options = "size=1m,mode=755" if readonly else f"size={size},mode=1777"
        try:
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, options)
        except SetupError as err:
            if readonly:  # a folder that must be hidden and cannot be: the run does not start
                for _, fd in handles:
                    os.close(fd)
                raise
            notes.append(f"{folder} stays the host's ({err})")
            for _, fd in handles:
                os.close(fd)
            continue
        for path, fd in handles:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)
        if readonly:
            _remount_readonly(folder)


def _enter_namespaces(uid, gid):
    """New user, mount, network, IPC and UTS namespaces for a judge that is root, whose root is
    the real root (for the mounts) and which maps one more user, ``uid``, that the command
    becomes. Only a process outside the new user namespace may write such a map: a forked
    helper does, then ends (``unshare --map-users`` would need newuidmap)."""
    ready_r, ready_w = os.pipe()
    shim = os.getpid()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        os.read(ready_r, 1)
        try:
            for name, outer in (("uid_map", uid), ("gid_map", gid)):
                with open(f"/proc/{shim}/{name}", "w") as f:
                    f.write(f"0 0 1\n{outer} {outer} 1\n")
        except OSError:
            os._exit(1)
        os._exit(0)
    os.close(ready_r)
    try:
        _call("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
    finally:
        os.write(ready_w, b"x")
        os.close(ready_w)
    _, status = os.waitpid(helper, 0)
    if status != 0:
        raise SetupError(f"could not map user {uid} into the sandbox's user namespace")


def _workdir_tmpfs(path, size, owner):
    """The working folder as a tmpfs of ``size`` bytes (what the run may write there, all
    files together), owned by the user the command runs as."""
    options = f"size={size},mode=700"
    if owner is not None:
        options += f",uid={owner[0]},gid={owner[1]}"
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)


DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
GPU_DEVICES = ("nvidia*", "dri", "kfd")  # GPU labs need these; nothing else of the host's /dev


def _minimal_dev(size, notes):
    """A /dev of a few harmless devices (and the GPUs), a /dev/shm of the run's own and a new
    /dev/pts. The host's /dev holds its disks: the submission's uid may be the real root's."""
    import fnmatch

    names = [d for d in DEVICES if os.path.exists("/dev/" + d)]
    names += sorted(
        n for n in os.listdir("/dev") if any(fnmatch.fnmatch(n, g) for g in GPU_DEVICES)
    )
    handles = [(n, os.open("/dev/" + n, os.O_PATH | os.O_CLOEXEC)) for n in names]
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=755")
    for name, fd in handles:
        target = "/dev/" + name
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)
    os.mkdir("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    os.mkdir("/dev/pts")
    try:
        _mount(
            "devpts",
            "/dev/pts",
            "devpts",
            MS_NOSUID | MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=620",
        )
        os.symlink("pts/ptmx", "/dev/ptmx")
    except SetupError as err:
        notes.append(f"no terminals in /dev/pts ({err})")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, "/dev/" + name)


def _mount_points():
    """Every mount point this mount namespace has, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            raw = line.split()[4]
            points.append(
                raw.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                .replace("\\134", "\\")
            )
    return points


def _everything_readonly(writable, own, notes):
    """Remount every mount read-only but the ``writable`` paths (and what lies inside them) and
    the run's ``own`` tmpfs mounts (not what was bound back inside those).

    Without it, a submission whose uid maps to the judge's could write wherever the judge can:
    its home, the grades, and (for a root judge) the whole machine.
    """
    for path in writable:
        _mount(path, path, None, MS_BIND | MS_REC)
    failed = []
    for point in _mount_points():
        if point == "/proc" or point.startswith("/proc/"):
            continue  # covered by the run's own /proc, mounted read-only
        if point in own or any(_inside(point, w) for w in writable):
            continue
        if not os.path.exists(point):
            continue  # under a folder hidden by the run's own tmpfs: out of reach already
        try:
            _remount_readonly(point)
        except (OSError, SetupError) as err:
            failed.append(f"{point} ({getattr(err, 'strerror', None) or err})")
    if failed:
        notes.append("still writable: " + ", ".join(failed))


def _remount_readonly(path):
    kept = 0
    flags = os.statvfs(path).f_flag
    for st, ms in ST_TO_MS.items():
        if flags & st:
            kept |= ms
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _loopback_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", _ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        _ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def _ioctl(sock, request, arg):
    import fcntl

    return fcntl.ioctl(sock.fileno(), request, arg)


def _drop_capabilities(user=None):
    """Leave the command no capability now or after exec, so it cannot undo the mounts; with
    ``user`` (uid, gid), become that unprivileged user too (no supplementary groups)."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _prctl(PR_SET_SECUREBITS, SECBIT_NOROOT)
    if user is not None:
        os.setgroups([])
        os.setresgid(user[1], user[1], user[1])
        os.setresuid(user[0], user[0], user[0])
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}
    _call("capset", ctypes.c_char_p(header), data)


def _set_limits(limits, extra_processes):
    for name, which in RLIMITS.items():
        value = limits.get(name)
        if value is None:
            continue
        if name == "cpu_seconds":
            # SIGXCPU at the soft limit (the report can name it); SIGKILL a little later for
            # code that catches or ignores it.
            resource.setrlimit(which, (value, value + 5))
            continue
        if name == "processes":
            value += extra_processes
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _open_fds():
    return [int(name) for name in os.listdir("/proc/self/fd")]


def _keep_only(open_fds, keep):
    """Close every descriptor in ``open_fds`` but ``keep`` and stderr; stdin and stdout become
    /dev/null. The shim and init must not hold the judge's pipes open after the command has them.
    """
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for fd in open_fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _exec_command(spec, argv, ready, drop_caps):
    """In the command's process: limits, capabilities, folder, then exec (never returns)."""
    try:
        _set_limits(spec["limits"], spec.get("extra_processes", 0))
        if drop_caps:
            _drop_capabilities(spec.get("drop_to"))
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
        os.chdir(spec["workdir"])
    except (OSError, ValueError, SetupError) as err:
        os.write(ready, f"setup: {err}\n".encode())
        os._exit(125)
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals stay ignored across exec.
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        os.write(ready, f"exec: {err.errno}: {err.strerror}: {argv[0]}\n".encode())
    os._exit(127)


def _init(spec, argv, ready, report_to):
    """PID 1 of the new namespace: /proc, then the command; reap until it ends."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _call("unshare", CLONE_NEWNS)  # this /proc is for the namespace, not for the shim
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
        except SetupError as err:
            os.write(ready, f"note: /proc shows the host's processes ({err})\n".encode())
    except OSError as err:
        os.write(ready, f"setup: {err}\n".encode())
        os._exit(125)
    fds = _open_fds()
    command = os.fork()
    if command == 0:
        os.close(report_to)
        _exec_command(spec, argv, ready, drop_caps=True)
    os.close(ready)
    _keep_only(fds, {report_to})
    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
    ):
        signal.signal(sig, signal.SIG_IGN)  # the submission may signal PID 1: it is not a way out
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == command:
            os.write(report_to, json.dumps(_summary(status, usage)).encode())
            os._exit(0)  # the kernel now kills whatever the command left running


def _kill_my_group():
    """SIGKILL every other process of the shim's process group (the fallback's whole run).

    The command shares the shim's group, so a judge's ``killpg(process.pid)`` reaches all of
    it; the shim itself must survive to report, so it cannot use killpg.
    """
    me, group = os.getpid(), os.getpgrp()
    for _ in range(100):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                found = True
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.005)


def _summary(status, usage):
    return {
        "status": status,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_kib": usage.ru_maxrss,
    }


def _end_like(status):
    """Leave with the command's exit code, or die of the signal that killed it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _prctl(PR_SET_DUMPABLE, 0)  # no core file of the shim itself
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv):
    spec = json.loads(argv[1])
    command = argv[3:]
    ready, status_fd = spec["ready_fd"], spec["status_fd"]
    _check_in(spec, ready, status_fd)
    namespaces = spec["mode"] == "namespace"
    try:
        notes = _set_up(spec, namespaces)
    except (OSError, SetupError) as err:
        os.write(ready, f"setup: {err}\n".encode())
        os._exit(125)
    for note in notes:
        os.write(ready, f"note: {note}\n".encode())
    summary = _run_command(spec, command, ready, status_fd, namespaces)
    os.write(status_fd, (json.dumps(summary) + "\n").encode())
    os.close(status_fd)
    _end_like(summary["status"])


def _check_in(spec, ready, status_fd):
    """Say the shim runs, die with the judge, and stop if the judge is gone already."""
    for fd in (ready, status_fd):
        os.set_inheritable(fd, False)
    os.write(ready, b"shim\n")  # unshare got this far
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the judge died: so does the sandbox
    if os.getppid() != spec["parent"]:
        os.write(ready, b"setup: the judge that started the sandbox is gone\n")
        os._exit(125)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _set_up(spec, namespaces):
    """Join the run's cgroups and, in namespace mode, build its file system; the notes."""
    notes = []
    for procs_file in spec.get("cgroup_procs") or []:  # before any fork: all of it counts
        with open(procs_file, "w") as procs:
            procs.write("0")
    if namespaces:
        _set_up_namespaces(spec, notes)
    return notes


def _set_up_namespaces(spec, notes):
    """Step 1 of the module's list, and the PID namespace the next fork enters (step 2)."""
    if spec.get("drop_to"):
        _enter_namespaces(*spec["drop_to"])
    # overlay files may lie where the run's own /tmp goes: opened before it is covered
    spec["overlay"] = [
        (f"/proc/self/fd/{os.open(src, os.O_PATH | os.O_CLOEXEC)}", dst)
        for src, dst in spec.get("overlay", [])
    ]
    _hide_private_dirs(spec["private"], spec["keep"], spec["tmpfs_bytes"], notes)
    for folder in spec.get("hidden", []):  # outer folders first: inner ones lie in binds
        if not os.path.isdir(folder):
            continue  # under a folder hidden already
        _hide_private_dirs([folder], spec["keep"], 0, notes, spec.get("overlay", []), readonly=True)
    if spec.get("workdir_bytes"):
        _workdir_tmpfs(spec["workdir"], spec["workdir_bytes"], spec.get("drop_to"))
    _minimal_dev(spec["tmpfs_bytes"], notes)
    if spec.get("readonly_root"):
        # the run's own /tmp and the like stay writable, what was kept inside them not
        own = [*spec["private"], "/dev/shm", "/dev/pts"]
        _everything_readonly(spec["writable"], own, notes)
    for path in spec["readonly"]:
        _bind_readonly(path)
    if spec.get("loopback"):
        _loopback_up()
    _call("unshare", CLONE_NEWPID)


def _run_command(spec, command, ready, status_fd, namespaces):
    """Fork init (namespace mode) or the command, hold it to the wall time and to the judge's
    stop, wait for its end and say how it ended."""
    stop = {"signal": None, "wall": False}
    started = time.monotonic()
    report_r, report_w = os.pipe()
    fds = _open_fds()
    child = os.fork()
    if child == 0:
        os.close(report_r)
        if namespaces:
            _init(spec, command, ready, report_w)
        os.close(report_w)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _exec_command(spec, command, ready, drop_caps=False)
    os.close(report_w)
    os.close(ready)
    _keep_only(fds, {report_r, status_fd})

    def kill_tree():
        # In namespace mode, init's death takes the whole PID namespace with it.
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not namespaces:
            _kill_my_group()

    def on_wall(signum, frame):
        stop["wall"] = True
        kill_tree()

    def on_stop(signum, frame):
        stop["signal"] = signum
        kill_tree()

    signal.signal(signal.SIGALRM, on_wall)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_stop)
    if spec.get("wall_seconds"):
        signal.setitimer(signal.ITIMER_REAL, spec["wall_seconds"])
    _, status, usage = os.wait4(child, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    if not namespaces:
        _kill_my_group()  # what the command left behind in the process group goes with it
    summary = _summary(status, usage)
    if namespaces:
        data = os.read(report_r, 1 << 16)
        summary = json.loads(data) if data else {**summary, "status": status}
    summary["wall_seconds"] = time.monotonic() - started
    summary["wall_killed"] = stop["wall"]
    summary["stopped_by"] = stop["signal"]
    if stop["signal"]:
        summary["status"] = stop["signal"]  # a wait status: killed by that signal
    elif stop["wall"]:
        summary["status"] = signal.SIGKILL
    return summary


if __name__ == "__main__":
    main(sys.argv)
