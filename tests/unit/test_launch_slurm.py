"""The Slurm task's preemption relay with real signals and a real fork (what a DataLoader worker is)."""

from __future__ import annotations

import os
import signal
import time

from vlmtrain.launch.slurm import PreemptionRelay


def test_a_forked_worker_ignores_the_signal_and_the_task_relays_it() -> None:
    """Slurm sends USR2 to every process of the step. The task relays it to Bridge's SIGTERM handler; a worker
    forked inside the relay inherits the handler and must neither die nor SIGTERM itself (torch's worker handler
    turns a SIGTERM not sent by its parent into "DataLoader worker ... killed by signal: Terminated", which ended
    the first preempted job on the GPU before Bridge could save)."""
    seen: list[str] = []
    old_usr2 = signal.signal(signal.SIGUSR2, lambda s, f: seen.append("submitit"))
    old_term = signal.signal(signal.SIGTERM, lambda s, f: seen.append("sigterm"))
    try:
        with PreemptionRelay(resend_s=3600) as relay:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: signalled like every process of the step
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.2)
                os.write(write, (",".join(seen) or "nothing").encode())
                os._exit(0)
            os.close(write)
            child_saw = os.read(read, 100).decode()
            _, status = os.waitpid(pid, 0)
            assert (child_saw, status) == ("nothing", 0)
            assert relay.received is None and seen == []

            os.kill(os.getpid(), signal.SIGUSR2)  # the task itself
            time.sleep(0.2)
            assert relay.received is not None and seen == ["sigterm"]
            relay.hand_back()
            assert seen == ["sigterm", "submitit"]
    finally:
        signal.signal(signal.SIGUSR2, old_usr2)
        signal.signal(signal.SIGTERM, old_term)
