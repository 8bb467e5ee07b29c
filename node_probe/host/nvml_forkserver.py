"""The watching agent's NVML forkserver: each pass's NVML child forked, not started.

Why: the agent runs the NVML child (host.nvml_child) every pass, and starting it as a fresh
interpreter cost ~80 ms of CPU a pass (interpreter start, its imports, pynvml's import): more
than half of the agent's 5m CPU request (issue 41 item 3). The forkserver is forked from the
agent once, before the agent starts any thread, imports nvml_child and pynvml (which loads no
library until nvmlInit) and then only waits. For each request it forks a fresh child that runs
nvml_child.main: that child maps the host's libnvidia-ml.so.1, calls nvmlInit and exits, as the
started child did. So NVML still runs only in a short-lived, killable process, a new one every
pass (a hung nvmlInit costs that child, never the agent or the forkserver), and neither the
agent nor the forkserver ever maps the library. The library path is still chosen by the probe
(checks/nvml.py) and re-checked by nvml_child.main in the child.

Bounds: a child is SIGKILLed at its deadline by the requester (through a pidfd: no pid reuse),
by its own alarm a second later if the requester is gone, and by the forkserver as soon as the
requester's end of its reply socket closes (a pass killed at its deadline). The forkserver dies
with the agent (PR_SET_PDEATHSIG) and exits when its control socket has no peer left; its
children die with it. At most MAX_LIVE children at once (one stuck in the driver stays until
it can be reaped); past that, and wherever the forkserver is gone or the kernel has no pidfds,
the requester starts the child as before (checks/nvml.run_child).

Protocol: one SOCK_SEQPACKET message per request, {"argv": [...], "timeout_s": T} with three
fds (the child's stdout and stderr pipes, a reply socket); on the reply socket the forkserver
sends {"pid": N} with the child's pidfd, then {"exit": CODE} once it has reaped the child.
"""
from __future__ import annotations

import array
import ctypes
import gc
import json
import math
import os
import select
import signal
import socket
import sys
import time

from . import subproc

MAX_LIVE = 4                 # children at once (a child stuck in D state counts until reaped)
MAX_REQUEST = 64 * 1024      # bytes of one request
MAX_OUTPUT = 8 * 1024 * 1024  # bytes of a child's stdout or stderr kept
REPLY_WAIT_S = 5.0           # for the forkserver's {"pid"} answer
EXIT_WAIT_S = 2.0            # for its {"exit"} after the child closed its output
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15

_SERVER: "Forkserver | None" = None
_LIVE: set[int] = set()      # pidfds of this process's children in flight (kill_live)


class Forkserver:
    """The agent's (and its pass children's) end of the control socket."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.broken = False


def supported() -> bool:
    return hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") and \
        sys.platform.startswith("linux")


def server() -> Forkserver | None:
    """This process's forkserver, if the agent started one and it still answers."""
    return None if _SERVER is None or _SERVER.broken else _SERVER


def start() -> Forkserver | None:
    """Fork the forkserver from this process, which must be single-threaded and must never
    have loaded libnvidia-ml (the agent, before its threads start). None where it cannot
    run (no pidfds): the NVML child is then started per pass as before."""
    global _SERVER
    if not supported() or _threads() != 1:   # a fork of a threaded process may hold its locks
        return None
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:   # a kernel before 5.3
        return None
    parent = os.getpid()
    # what both share stays shared: the agent's collector no longer walks (writes) the objects
    # that exist now, the imported modules, so their pages are not copied into the forkserver
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:   # no memory or no pids left now: the passes start their child
        mine.close()
        theirs.close()
        return None
    if pid == 0:
        code = 0
        try:
            mine.close()
            _serve(theirs, parent)
        except BaseException:  # noqa: BLE001 - the requesters fall back to a started child
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    _SERVER = Forkserver(pid, mine)
    return _SERVER


def alive() -> bool:
    """In the agent, between passes: has the forkserver exited (reaped here, then no longer
    asked: each pass starts the NVML child as before)?"""
    global _SERVER
    s = _SERVER
    if s is None:
        return False
    try:
        done = os.waitpid(s.pid, os.WNOHANG)[0]
    except ChildProcessError:
        done = s.pid
    if done:
        s.sock.close()
        _SERVER = None
    return not done


def _threads() -> int:
    """Threads of this process, C ones included (/proc/self/task)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def stop() -> None:
    """Close this process's end of the control socket and reap the forkserver (the agent's
    exit): it sees no peer left and exits."""
    global _SERVER
    s, _SERVER = _SERVER, None
    if s is None:
        return
    s.sock.close()
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        try:
            if os.waitpid(s.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.02)
    try:
        os.kill(s.pid, signal.SIGKILL)
        os.waitpid(s.pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _die_with_parent(parent: int, name: bytes) -> None:
    """SIGKILL when the parent dies; `name` in ps and /proc/PID/comm."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:   # the parent died before prctl
        os._exit(0)


def _serve(sock: socket.socket, parent: int) -> None:
    """The forkserver: fork a child per request; reap it and say its exit; kill it when its
    requester goes; exit when the control socket has no peer left."""
    _die_with_parent(parent, b"nvml-forkserver")
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C: the agent stops, then we go
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from . import nvml_child
    try:
        import pynvml  # noqa: F401 - its import maps no library (that is nvmlInit's)
    except ImportError:
        pass
    del nvml_child
    gc.freeze()   # and ours: a collection here would copy every page it walks
    live: dict[int, list] = {}   # pidfd -> [pid, reply socket, requester still there]
    while True:
        watch = [sock, *live, *(r for _, r, there in live.values() if there)]
        ready, _, _ = select.select(watch, [], [])
        if sock in ready:
            try:
                msg, fds = _receive(sock)
            except OSError:
                return
            if msg is None:
                return   # no requester left (the agent and its passes exited)
            if msg is not False:
                _fork_child(msg, fds, live, sock)
            else:
                for fd in fds:
                    os.close(fd)
        for pidfd, (pid, reply, there) in list(live.items()):
            if pidfd in ready:
                try:
                    _, status = os.waitpid(pid, 0)
                    code = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    code = None
                _send(reply, {"exit": code})
                reply.close()
                os.close(pidfd)
                del live[pidfd]
            elif there and reply in ready:
                # the requester closed its end (a pass killed at its deadline): the child goes
                # (reaped when its pidfd says so; its reply no longer watched: no busy loop)
                live[pidfd][2] = False
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except OSError:
                    pass


def _receive(sock: socket.socket):
    """(request dict, fds) | (None, []) at EOF | (False, fds) for a malformed request."""
    fds = array.array("i")
    msg, anc, flags, _ = sock.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if not msg and not fds:
        return None, []
    try:
        req = json.loads(msg)
    except ValueError:
        return False, list(fds)
    ok = (isinstance(req, dict) and len(fds) == 3 and not flags & (socket.MSG_TRUNC |
          socket.MSG_CTRUNC) and isinstance(req.get("argv"), list) and
          all(isinstance(a, str) for a in req["argv"]) and
          isinstance(req.get("timeout_s"), (int, float)))
    return (req if ok else False), list(fds)


def _send(reply: socket.socket, obj: dict, fds: tuple[int, ...] = ()) -> None:
    try:
        data = json.dumps(obj).encode()
        if fds:
            reply.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", fds))])
        else:
            reply.send(data)
    except OSError:
        pass


def _fork_child(req: dict, fds: list[int], live: dict, sock: socket.socket) -> None:
    out, err, rep = fds
    reply = socket.socket(fileno=rep)
    if len(live) >= MAX_LIVE:
        _send(reply, {"busy": True})
        for fd in (out, err):
            os.close(fd)
        reply.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    me = os.getpid()
    try:
        pid = os.fork()
    except OSError:   # no memory or no pids left now: the requester starts its own child
        _send(reply, {"busy": True})
        for fd in (out, err):
            os.close(fd)
        reply.close()
        return
    if pid == 0:
        _child(req, me, out, err, [sock.fileno(), rep, *live,
                               *(r.fileno() for _, r, _ in live.values())])
    os.close(out)
    os.close(err)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:   # cannot happen for our own unreaped child; be safe: kill it
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reply.close()
        return
    live[pidfd] = [pid, reply, True]
    _send(reply, {"pid": pid}, (pidfd,))


def _child(req: dict, parent: int, out: int, err: int, close: list[int]) -> None:
    """The forked NVML child: a session of its own, output on the requester's pipes, dead at
    its deadline even if nobody kills it, dead with the forkserver."""
    code = 1
    try:
        _die_with_parent(parent, b"nvml-child")
        os.setsid()
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.alarm(max(1, math.ceil(float(req["timeout_s"]))) + 1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            os.close(fd)
        from . import nvml_child
        code = nvml_child.main(list(req["argv"]))
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - the requester sees the exit code and stderr
        try:
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def run(argv: list[str], timeout_s: float) -> subproc.ChildResult | None:
    """nvml_child.main(argv) in a child forked by the forkserver, with a hard deadline (as
    subproc.run: killed when it passes, timed_out set). None when no forkserver answers (the
    caller starts the child itself)."""
    srv = server()
    if srv is None:
        return None
    t0 = time.monotonic()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pidfd = None
    try:
        try:
            srv.sock.sendmsg([json.dumps({"argv": list(argv), "timeout_s": timeout_s}).encode()],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                               array.array("i", (out_w, err_w, theirs.fileno())))],
                             socket.MSG_DONTWAIT)   # a full socket: no forkserver reading it
        except OSError:
            srv.broken = True
            return None
        finally:
            os.close(out_w)
            os.close(err_w)
            theirs.close()
        ans, pidfd = _answer(mine, min(REPLY_WAIT_S, max(0.5, timeout_s)))
        if ans is None or "pid" not in ans or pidfd is None:
            if ans is None:
                srv.broken = True   # no answer: the forkserver is gone or wedged
            return None
        _LIVE.add(pidfd)
        out, err, complete = _collect(out_r, err_r, t0 + max(0.01, timeout_s))
        if not complete:
            _kill(pidfd)
        ans, _ = _answer(mine, EXIT_WAIT_S)
        code = ans.get("exit") if isinstance(ans, dict) and complete else None
        return subproc.ChildResult(code if isinstance(code, int) else None, out, err,
                                   not complete, time.monotonic() - t0)
    finally:
        for fd in (out_r, err_r):
            os.close(fd)
        mine.close()
        if pidfd is not None:
            _LIVE.discard(pidfd)
            os.close(pidfd)


def _answer(sock: socket.socket, wait_s: float) -> tuple[dict | None, int | None]:
    """One reply message (and the pidfd it carries), or (None, None) after wait_s."""
    r, _, _ = select.select([sock], [], [], wait_s)
    if not r:
        return None, None
    fds = array.array("i")
    try:
        msg, anc, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(fds.itemsize))
    except OSError:
        return None, None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    for extra in fds[1:]:
        os.close(extra)
    try:
        obj = json.loads(msg) if msg else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        for fd in fds[:1]:
            os.close(fd)
        return None, None
    return obj, (fds[0] if fds else None)


def _collect(out_r: int, err_r: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """Both pipes until EOF (complete) or the deadline or MAX_OUTPUT (not)."""
    bufs = {out_r: bytearray(), err_r: bytearray()}
    open_fds = [out_r, err_r]
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(bufs[out_r]), bytes(bufs[err_r]), False
        r, _, _ = select.select(open_fds, [], [], left)
        for fd in r:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
            elif len(bufs[fd]) + len(chunk) > MAX_OUTPUT:
                return bytes(bufs[out_r]), bytes(bufs[err_r]), False
            else:
                bufs[fd] += chunk
    return bytes(bufs[out_r]), bytes(bufs[err_r]), True


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass


def kill_live() -> None:
    """SIGKILL this process's children in flight (a pass child's exit)."""
    for pidfd in list(_LIVE):
        _kill(pidfd)
