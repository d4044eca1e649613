"""Helper threads that give way to the gateway's event loop (Linux's SCHED_BATCH).

The event loop answers every client; the Dafka threads behind it (the actors, ZeroMQ's
I/O threads, the embedded stores) hand records on. Under the default policy a thread
woken on a busy CPU preempts whatever runs there, most often the loop: at 10,000
records/s the loop was preempted 4,500 times a second, and every preemption was a
client waiting. A SCHED_BATCH thread that wakes takes a free CPU, or waits for the
running thread to sleep or for the scheduler's tick; its share of the CPU is the same
(the nice value is not touched). `threads/batch = 1` asks for it: the gateway sets it for
its own actors and its embedded stores; a standalone store or tool keeps the default (0).
Where the platform or a sandbox refuses the policy, the threads keep theirs.
"""

from __future__ import annotations

import os
import threading

import zmq

SETTING = "threads/batch"


def run_as_batch() -> bool:
    """The calling thread, and the threads and processes it starts from now on, under
    SCHED_BATCH; whether that was allowed."""
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:  # not Linux
        return False
    try:
        setter(0, os.SCHED_BATCH, os.sched_param(0))  # 0: this thread, not the process
    except OSError:
        return False
    return True


def batch_allowed() -> bool:
    """Whether this process's threads may run under SCHED_BATCH, asked from a thread of
    its own so that the caller's policy stays as it is."""
    allowed: list[bool] = []
    probe = threading.Thread(target=lambda: allowed.append(run_as_batch()), name="sched-probe")
    probe.start()
    probe.join()
    return allowed == [True]


def io_threads_as_batch(context: zmq.Context) -> bool:
    """`context`'s I/O threads under SCHED_BATCH once they start, with its first socket
    (set before it, as `node.allow_sockets`). libzmq aborts the process when it cannot
    set the policy it was given, so it is given only one a probe thread could take."""
    if not batch_allowed():
        return False
    context.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
    return True
