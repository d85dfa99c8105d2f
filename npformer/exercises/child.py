"""The learner's code runs in a child process (``python -m npformer.exercises.runner``) under
limits that it cannot escape: the child starts in a session of its own, the parent reads its
JSON lines against a wall-clock deadline, and at that deadline, or as soon as the child ends,
the parent kills the child's whole process group (SIGKILL). A loop that ignores signals, or a
process that the learner's code forked, cannot outlive the check. Memory is bounded in the child
itself (:func:`limit_memory`, an ``RLIMIT_AS``), where a ``MemoryError`` is reported in one line.
"""
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..validation import check_int, check_real

STARTUP = 60.0          # seconds the child may take to import npformer and write its first line
TIMEOUT = 20.0          # seconds per exercise, by default
MAX_TIMEOUT = 86400.0   # a day: the longest time limit (the timers need a finite one)
MAX_MEMORY = 2 ** 30    # MiB (a PiB): the most that --memory takes
GRACE = 3.0             # seconds past an exercise's limit before the parent kills the child
TRAIN_TIMEOUT = 600.0   # seconds the finale's whole training may take, by default (npformer
                        # toy's 14 epochs take a small part of it)
MEMORY = 4096           # MiB the learner's code may use, by default, beyond the checker's own
_limit = {"mib": None}  # the child's limit, once limit_memory has set it


def check_limits(timeout, memory, name="timeout"):
    """``timeout`` (seconds) and ``memory`` (MiB), checked: ValueError naming the one out of
    range (the time limit as ``name``)."""
    timeout = check_real(name, timeout, minimum=0, min_open=True, maximum=MAX_TIMEOUT)
    memory = check_int("memory", memory, 1)
    if memory > MAX_MEMORY:
        raise ValueError(f"memory: expected at most {MAX_MEMORY} (MiB), got {memory}")
    return timeout, memory


def _address_space():
    """The bytes of address space this process uses now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def limit_memory(mib):
    """In the child: allow ``mib`` MiB of address space beyond what it uses now (the checker's
    own modules), through ``RLIMIT_AS``. Past it an allocation raises MemoryError. Where the
    address space cannot be read (no /proc) or the limit cannot be set, there is none."""
    import resource
    used = _address_space()
    if not used:
        return
    limit = used + int(mib) * 2 ** 20
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):          # a system that does not take it
        return
    _limit["mib"] = int(mib)


def memory_message():
    """The one line for a MemoryError in the child."""
    if _limit["mib"] is None:
        return "ran out of memory"
    return f"used more than {_limit['mib']} MiB of memory (the limit; --memory raises it)"


def run(arguments, on_record, first=STARTUP):
    """Run ``python -m npformer.exercises.runner ARGUMENTS`` in its own session. Each JSON line
    it writes goes to ``on_record(record)``, which returns how many seconds the child may take
    until its next line (None: the deadline stays). The child may take ``first`` seconds to its
    first line. Returns the child's exit status, or None if it was killed at its deadline; its
    whole process group is killed either way."""
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    process = subprocess.Popen([sys.executable, "-m", "npformer.exercises.runner", *arguments],
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                               start_new_session=True)
    deadline = time.monotonic() + first
    pending = b""
    fd = process.stdout.fileno()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if not ready:
                if _ended(process):                # it ended; what it forked may hold the pipe
                    break
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:                          # every writer closed the pipe
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                seconds = on_record(_record(line))
                if seconds is not None:
                    deadline = time.monotonic() + seconds
        while not _ended(process):                 # it closed its output: it may run on
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
    finally:
        # the group is killed before the child is reaped: until then the child's pid names its
        # group, and no other process can be given it
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        process.stdout.close()
    return process.returncode


def _ended(process):
    """Whether the child has exited, without reaping it (``WNOWAIT``)."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:                      # reaped already
        return True


def _record(line):
    """A line of the child's as a dict ({} for anything else)."""
    try:
        record = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
