"""Compile ahead: a plan's first call compiles its kernels in two processes at once.

A plan's first call in a process with an empty disk cache spends seconds compiling its
kernels one after another (conversions, packing, the compute kernel, their helpers), on
one core, while the others wait. When that call reaches the first kernel missing from the
disk cache, this module starts one helper process (on Linux a fork of this one, with
everything imported and set up; elsewhere, or with ``config.COMPILE_AHEAD_START =
"spawn"``, a new interpreter running :mod:`numbaconv.backends.ahead` on zero-filled
operands of the same types) that (:func:`work`):

1. walks the same plan without running or compiling anything (each kernel the walk
   reaches is recorded with its argument types, and returns at once), then
2. compiles what it recorded from the last kernel backwards, into the disk cache,
   reporting each start and end through a pipe,

while the calling process compiles from the first kernel forwards. A kernel the helper has
started is waited for and then loaded from the disk cache; one it has not reached is
compiled here (the helper then finds it in the cache). The two meet in the middle, so a
first call takes about half its compile time where a second core is free. Results do not
depend on it: a kernel loaded from the cache is the one compiled here (the kernels'
bitwise reproducibility across processes is part of the contract).

When it runs: the disk cache is on, the plan's entry compiles slowly (``compile_heavy``, or
the Numba GEMM engine: for the light ones a helper's half second of start-up is more than
it could save), the plan runs on at least two threads (so the caller
gave numbaconv at least two cores; a Dask worker of one thread never starts a helper),
the machine is not busy already (a minute's load average under the number of cores),
the operands take at most ``config.COMPILE_AHEAD_MAX_BYTES`` (the helper allocates zeros
of the same shapes), and ``config.COMPILE_AHEAD`` (``NUMBACONV_COMPILE_AHEAD=0`` turns it
off). Whatever goes wrong with the helper (it cannot start, fails, or dies), the call
compiles the rest itself; the helper is stopped when the call ends.
"""
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time

from . import config

#: The longest a kernel is waited for before it is compiled here anyway (seconds).
WAIT_LIMIT = 300

#: Set in the helper process (it never starts a helper of its own).
_CHILD_ENV = "NUMBACONV_AHEAD_CHILD"

_local = threading.local()


def _key(disp, args):
    """A kernel and argument types, as both processes spell them."""
    f = disp.py_func
    return f"{f.__module__}.{f.__qualname__}{tuple(str(a) for a in args)}"


def _args_of(sig):
    from numba.core import sigutils
    args, _ = sigutils.normalize_signature(sig)
    return tuple(args)


def _missing(disp, sig):
    """Whether ``disp`` would compile ``sig`` rather than load it from the disk cache."""
    try:
        cache = disp._cache
        if not getattr(cache, "_enabled", False):
            return False
        key = cache._index_key(sig, disp.targetctx.codegen())
        return key not in cache._cache_file._load_index()
    except Exception:  # Numba's cache internals changed: no helper, nothing lost
        return False


def _spec(a):
    """What the helper needs to make an array of the same Numba type as ``a``."""
    import numpy as np
    if not isinstance(a, np.ndarray):
        return ("value", a)
    layout = ("C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "A")
    return ("array", a.shape, a.dtype.str if a.dtype.names is None else a.dtype,
            a.dtype.name, layout, bool(a.flags.writeable))


def _zeros(spec):
    import numpy as np
    if spec[0] == "value":
        return spec[1]
    _, shape, dstr, name, layout, writeable = spec
    try:
        dt = np.dtype(dstr)
        if dt.kind == "V":  # bfloat16 and other registered extension dtypes
            raise TypeError
    except TypeError:
        import ml_dtypes  # noqa: F401  (registers bfloat16 by name)
        dt = np.dtype(name)
    if layout == "A":  # a strided view: every other element of a doubled last axis
        big = np.zeros((*shape[:-1], 2 * shape[-1]) if shape else (2,), dt)
        a = big[..., ::2] if shape else big[:1]
    else:
        a = np.zeros(shape, dt, order=layout)
    if not writeable:
        a.flags.writeable = False
    return a


def _stderr():
    """The helper's standard error: ``NUMBACONV_AHEAD_LOG`` (a file) where set, else none."""
    path = os.environ.get("NUMBACONV_AHEAD_LOG")
    return open(path, "a") if path else subprocess.DEVNULL


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


#: When this process's last helper ended (``time.monotonic()``), or None.
_last_helper = None


def _busy(cores):
    """Whether the cores are taken already: a minute's load average of ``cores`` or more
    (other processes, such as a pool of workers each making its own first calls, on top of
    the caller), so that a helper would only compete. A helper of this process that ran
    in the last minute counts one core of that average itself (first calls one after
    another, each with its helper, keep the average near two on their own)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    own = _last_helper is not None and time.monotonic() - _last_helper < 60
    return load >= cores + (1 if own else 0)


def enabled(plan, operands, worth):
    """Whether ``plan``'s first call on ``operands`` may start a helper (``worth``: kernels
    go to the disk cache, where alone a helper's work can reach this process, and the
    plan's kernels take seconds to compile)."""
    if not config.COMPILE_AHEAD or os.environ.get(_CHILD_ENV) == "1":
        return False
    if not worth or plan.threads < 2:
        return False
    cores = _cores()
    if cores < 2 or _busy(cores):
        return False
    nbytes = sum(getattr(a, "nbytes", 0) for a in operands.values())
    return nbytes <= config.COMPILE_AHEAD_MAX_BYTES


class Session:
    """One plan's first call in this process: the helper, once a kernel misses the cache."""

    def __init__(self, plan, operands, execute=None):
        self.plan = plan
        self.operands = operands
        self.execute = execute   # the backend's execute(plan, operands): a forked helper walks it
        self.proc = None
        self.tried = False
        self.state = {}          # key -> "S" (helper compiling it), "D" (done), "F" (failed)
        self.found = None        # the keys the helper's walk recorded
        self.cond = threading.Condition()
        self.lock = threading.Lock()
        self.alive = False
        self.waited = 0          # kernels this process loaded after waiting for the helper
        self.compiled = []       # the keys this process compiled or loaded itself

    # in this process ----------------------------------------------------------------
    def before_compile(self, disp, sig):
        """Called before this process compiles (or loads) ``disp`` for ``sig``."""
        args = _args_of(sig)
        if args in disp.overloads:
            return
        key = _key(disp, args)
        self.compiled.append(key)
        if self.proc is None:
            with self.lock:
                if not self.tried and _missing(disp, sig):
                    self.tried = True
                    self._start()
            return
        with self.cond:
            if self.state.get(key) == "S":
                self.waited += 1
            deadline = time.monotonic() + WAIT_LIMIT
            while (self.state.get(key) == "S" and self.alive
                   and time.monotonic() < deadline):
                self.cond.wait(0.1)
                if getattr(self.proc, "stalled", _never)():  # no CPU time: not compiling
                    self.alive = False   # this process compiles the rest itself
                    self.proc.terminate()

    def _start(self):
        if forks() and self.execute is not None:
            self._fork()
        else:
            self._spawn()
        if self.proc is None:
            return
        self.alive = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _fork(self):
        """The helper as a fork of this process: it starts with numbaconv imported, Numba's
        registries set up and the operands in memory (copy-on-write), where a new
        interpreter spends 1.2-1.5 s on the import, Numba's set-up and the operands.
        Numba's compiler lock is held across the fork, so that no other thread is inside
        Numba or LLVM when the child's copy of the process is taken."""
        import warnings
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target
        try:
            cpu_target.typing_context.refresh()  # this process's next compile does it anyway
            cpu_target.target_context.refresh()
            r, w = os.pipe()
        except Exception:
            return
        try:
            with global_compiler_lock, warnings.catch_warnings():
                # Python 3.12+ warns that a multi-threaded process may deadlock in a fork's
                # child; the child takes no lock of Numba's another thread could hold (see
                # above), and one stuck on any other is found out (_Forked.stalled)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = _fork()
        except Exception:
            os.close(r)
            os.close(w)
            return
        if pid == 0:  # the child: compile, report, and leave without running anything else
            code = 1
            try:
                os.close(r)
                code = _child(self.execute, self.plan, self.operands, w)
            finally:
                os._exit(code)
        os.close(w)
        self.proc = _Forked(pid, r)

    def _spawn(self):
        """The helper as a new interpreter (``sys.executable``), given the plan and the
        operands' shapes in a temporary file."""
        if not sys.executable or getattr(sys, "frozen", False):  # no Python to start
            return
        try:
            spec = {k: _spec(a) for k, a in self.operands.items()}
            cfg = {}
            for k in dir(config):
                if k.isupper():
                    try:
                        cfg[k] = pickle.loads(pickle.dumps(getattr(config, k)))
                    except Exception:
                        pass
            fd, path = tempfile.mkstemp(prefix="numbaconv-ahead-", suffix=".pkl")
            with os.fdopen(fd, "wb") as f:
                pickle.dump((self.plan, spec, cfg), f)
            env = dict(os.environ)
            env[_CHILD_ENV] = "1"
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            log = _stderr()
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", "from numbaconv.backends.ahead import main; main()",
                     path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                    env=env, text=True)
            finally:
                if log is not subprocess.DEVNULL:
                    log.close()  # the helper has its own copy
        except Exception:
            self.proc = None

    def _read(self):
        try:
            for line in self.proc.stdout:
                try:
                    tag, payload = json.loads(line)
                except ValueError:
                    continue
                with self.cond:
                    if tag == "found":
                        self.found = payload
                    else:
                        self.state[payload] = tag
                    self.cond.notify_all()
        except Exception:
            pass
        finally:
            with self.cond:
                self.alive = False
                self.cond.notify_all()

    def close(self):
        global _last_helper
        if self.proc is None:
            return
        _last_helper = time.monotonic()
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)
        self.proc.stdout.close()


def forks():
    """Whether a helper starts as a fork of this process (else a new interpreter)."""
    return config.COMPILE_AHEAD_START == "fork" and hasattr(os, "fork")


def _fork():
    return os.fork()


def _never():
    return False


def _child(execute, plan, operands, wfd):
    """The forked helper's work (see :meth:`Session._fork`); its exit status."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # not the caller's handlers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # nothing of the child's on the caller's terminal: its log where one is asked for
        path = os.environ.get("NUMBACONV_AHEAD_LOG")
        fd = os.open(path or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    except Exception:
        return 1
    os.environ[_CHILD_ENV] = "1"  # it starts no helper of its own
    _local.session = None

    def say(tag, payload):
        os.write(wfd, (json.dumps([tag, payload]) + "\n").encode())

    work(execute, plan, operands, say)
    return 0


def work(execute, plan, operands, say):
    """The helper's work: walk ``execute(plan, operands)`` (recording its kernels,
    running none), then compile what the walk found from the last kernel backwards,
    reporting through ``say(tag, payload)``: ``found`` (the keys), then ``S`` (started),
    ``D`` (done) or ``F`` (failed) per kernel."""
    start_walk()
    try:
        execute(plan, operands)
    except BaseException:  # the walk stops where the plan's code needed a real result
        if os.environ.get("NUMBACONV_AHEAD_LOG"):
            import traceback
            traceback.print_exc()
    found = end_walk()
    if os.environ.get("NUMBACONV_AHEAD_LOG"):
        print("found", *[k for _, _, k in found], sep="\n  ", file=sys.stderr)
    say("found", [k for _, _, k in found])
    for disp, sig, key in reversed(found):
        say("S", key)
        try:
            disp.compile(sig)
        except Exception:
            say("F", key)
            continue
        say("D", key)


class _Forked:
    """A forked helper, with the part of ``subprocess.Popen``'s interface that
    :class:`Session` uses."""

    #: Seconds without CPU time after which a forked helper counts as stuck (a compile
    #: uses CPU all along; a child that inherited a lock another thread held at the fork
    #: would wait on it for ever).
    STALL_SECONDS = 5.0

    def __init__(self, pid, rfd):
        self.pid = pid
        self.stdout = os.fdopen(rfd, "r")
        self.returncode = None
        self._cpu = (None, time.monotonic())  # the child's CPU ticks, when they last moved

    def stalled(self):
        """Whether the child has used no CPU time for :data:`STALL_SECONDS` (from
        ``/proc``; False where that cannot be read)."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            return False
        now = time.monotonic()
        if ticks != self._cpu[0]:
            self._cpu = (ticks, now)
            return False
        return now - self._cpu[1] > self.STALL_SECONDS

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def terminate(self):
        """SIGKILL: the child may have inherited a handler for SIGTERM that does not exit
        (it writes to the disk cache only through atomic renames)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    kill = terminate

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"numbaconv helper {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode


def current():
    """This thread's session, or None."""
    return getattr(_local, "session", None)


def adopt(s):
    """Make ``s`` this thread's session (a worker thread of the call); returns the one it
    replaces."""
    prev = current()
    _local.session = s
    return prev


class session:
    """``with session(plan, operands, worth):`` around a plan's first execution (no-op
    where :func:`enabled` says no)."""

    __slots__ = ("s", "prev")

    def __init__(self, plan, operands, worth, execute=None):
        self.s = (Session(plan, operands, execute) if enabled(plan, operands, worth)
                  else None)

    def __enter__(self):
        self.prev = current()
        if self.s is not None:
            _local.session = self.s
        return self.s

    def __exit__(self, *exc):
        if self.s is not None:
            _local.session = self.prev
            self.s.close()
        return False


# in the helper process (numbaconv.backends.ahead) --------------------------------------
_found = None   # the walk's recorded (dispatcher, signature, key), in order, while walking
_found_lock = threading.Lock()


def walking():
    return _found is not None


def record(disp, sig):
    """Note that the walk reached ``disp`` for ``sig`` (as this process would compile it:
    the disk cache's key includes the signature's form)."""
    key = _key(disp, _args_of(sig))
    with _found_lock:  # the call's worker threads walk too
        if all(k != key for _, _, k in _found):
            _found.append((disp, sig, key))


def start_walk():
    global _found
    _found = []


def end_walk():
    """The walk's records, ``[(dispatcher, signature, key)]`` in order; walking stops."""
    global _found
    found, _found = _found, None
    return found
