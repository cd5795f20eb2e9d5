"""Running the suite with the ranks ``torchrun`` started (one node or many).

``torchrun --nnodes N --nproc-per-node M -m ddp_conformance run ...`` starts N x M
processes with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` set
(env:// rendezvous). Global rank 0 is the *leader*: it runs the command line as usual
(selects the cases, computes oracles, judges, writes the one result set) with a
:class:`TorchrunPool` in place of the rank pool. Every other rank is a *follower*
(:func:`follow`): it runs each job the leader publishes and reports back, and prints
nothing else.

Jobs and answers travel through torchrun's own TCP store (the control channel), under a
private prefix: the leader sets ``job/<n>``, each rank runs it *itself* (with
:class:`~ddp_conformance.ranks.runtime.RankRuntime`, the procedure of a pool worker), and
sets ``result/<n>/<rank>``. A store, not a collective, gathers the answers on purpose: a
rank that raised or hangs cannot block the others' answers, so the leader still knows
who finished, who raised, and who is stuck.

Deadlines: each rank runs its job in a worker thread and waits for it with the job's
deadline; a watchdog then writes every thread's Python stack into the store (stacks cannot
be collected by a parent across nodes), and the leader reports TIMEOUT with every rank's
stack. A stuck collective cannot be cancelled, so after a TIMEOUT the run stops (the next
job raises :class:`~ddp_conformance.errors.PoolError`; results so far are already
streamed to ``results.jsonl``), and ``faulthandler.dump_traceback_later(..., exit=True)``
ends any rank that is still stuck so torchrun tears the job down. A rank process that dies
is torchrun's to report (it stops every rank); the leader sees it as missing answers.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import torch

from ddp_conformance.errors import PoolError, UsageError
from ddp_conformance.ranks.communicator import Generations
from ddp_conformance.ranks.job import CallsFunctions, JobRun
from ddp_conformance.ranks.messages import Answer, Job, Raised
from ddp_conformance.ranks.outcome import Outcome
from ddp_conformance.ranks.placement import pin_device
from ddp_conformance.ranks.runtime import RankRuntime
from ddp_conformance.ranks.warmup import warm_up

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PREFIX = "ddp-conformance"
#: How long a follower waits for the leader's next job (the leader computes oracles and
#: checks between jobs, and a whole case may take up to its deadline).
FOLLOWER_IDLE_S = 3600.0
#: After the deadline, how long the ranks get to put their stacks into the store.
STACK_GRACE_S = 3.0
#: After the deadline, when a still-stuck rank ends itself (torchrun then stops the job).
ABORT_AFTER_S = 20.0
POLL_S = 0.02


def detect() -> dict[str, int | str] | None:
    """torchrun's environment (rank, world size, local rank, master), or None outside it."""
    if not all(v in os.environ for v in TORCHRUN_VARIABLES):
        return None
    try:
        return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
                "local_rank": int(os.environ["LOCAL_RANK"]),
                "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
                "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}
    except ValueError as exc:
        raise UsageError(f"malformed torchrun environment: {exc}") from None


def _device(device: str) -> torch.device:
    return pin_device(device, int(os.environ.get("LOCAL_RANK", "0")))


def _stacks_now() -> str:
    """Every thread's Python stack, innermost frame first (faulthandler's order)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in frames.items():
        if ident == threading.get_ident():
            continue
        lines = [f'  File "{f.filename}", line {f.lineno} in {f.name}'
                 for f in reversed(traceback.extract_stack(frame))]
        parts.append(f"Thread {ident:#x} ({names.get(ident, '?')}) "
                     "(most recent call first):\n" + "\n".join(lines))
    return "\n\n".join(parts)


class _Member:
    """What every torchrun rank does with a job: run it itself, answer through the store."""

    def __init__(self, backend: str, device: str, threads: int | None = None) -> None:
        env = detect()
        if env is None:
            raise UsageError("not under torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
                             "and MASTER_PORT must be set")
        import torch.distributed as dist

        self.rank, self.world_size = int(env["rank"]), int(env["world_size"])
        self.local_world_size = int(env["local_world_size"])
        self.backend = backend
        self.device = _device(device)
        self.threads = threads or max(1, (os.cpu_count() or 1) // max(1, self.local_world_size))
        torch.set_num_threads(self.threads)
        store, _, _ = next(dist.rendezvous("env://", self.rank, self.world_size,
                                           timeout=timedelta(seconds=FOLLOWER_IDLE_S)))
        self.store = dist.PrefixStore(PREFIX, store)
        self.runtime = RankRuntime(self.rank, self.world_size, backend, self.device, self.store)
        warm_up(self.device)  # CUDA start-up and lazy imports, before the first job's deadline

    def key(self, *parts: object) -> str:
        return "/".join(str(p) for p in parts)

    def execute(self, number: int, job: Job, timeout_s: float, abort: bool) -> None:
        """Run job ``number`` on this rank; put the answer (or, if stuck, the stacks) in the store.

        ``abort``: arm faulthandler to end this process if the job is still stuck well after
        its deadline (followers; the leader must live on to write the results).
        """
        answer: list[Answer] = []
        thread = threading.Thread(target=lambda: answer.append(self._run(job)),
                                  name=f"ddp-conformance-job{number}", daemon=True)
        if abort:
            faulthandler.dump_traceback_later(timeout_s + ABORT_AFTER_S, exit=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            self.store.set(self.key("stack", number, self.rank), _stacks_now())
            return
        if abort:
            faulthandler.cancel_dump_traceback_later()
        self.store.set(self.key("result", number, self.rank),
                       pickle.dumps(answer[0], protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[arg-type]

    def _run(self, job: Job) -> Answer:
        """The job on this rank: the same procedure as a pool worker's."""
        answer = self.runtime.execute(job)
        if isinstance(answer, Raised):
            # Torchrun's ranks cannot be replaced: clean up as well as can be and go on.
            try:
                self.runtime.cleanup()
            except BaseException:  # noqa: BLE001 - the job's failure is already reported
                pass
        return answer


class TorchrunPool(CallsFunctions):
    """The leader's (global rank 0's) executor, with the
    :class:`~ddp_conformance.ranks.pool.Pool` interface."""

    def __init__(self, backend: str = "gloo", device: str = "cpu") -> None:
        self.member = _Member(backend, device)
        if self.member.rank != 0:
            raise UsageError("TorchrunPool runs on global rank 0; other ranks call follow()")
        self.world_size = self.member.world_size
        self.threads = self.member.threads
        self.in_process = True  # rank 0's jobs run in this process
        self._jobs = 0
        self._stuck: str | None = None
        #: Which communicator generation traced jobs may reuse (ranks/communicator.py).
        self.communicators = Generations()

    def start(self) -> None:
        """The ranks are torchrun's: nothing to start."""

    def run(self, job: Job, timeout_s: float) -> Outcome:
        """Run ``job`` on every torchrun rank (this one included) through its transitions
        (:class:`~ddp_conformance.ranks.job.JobRun`); a rank that does not answer within the
        deadline (plus :data:`STACK_GRACE_S`) leaves its stack, and the run stops after it."""
        if self._stuck is not None:
            raise PoolError(f"the torchrun ranks are stuck since {self._stuck}; the run stops "
                            "here (results so far are in results.jsonl): restart torchrun")
        self._jobs += 1
        number = self._jobs
        state = JobRun(self.world_size)
        state.dispatch(job, number, self.communicators, timeout_s + STACK_GRACE_S)
        store, key = self.member.store, self.member.key
        message = pickle.dumps((job, timeout_s), protocol=pickle.HIGHEST_PROTOCOL)
        store.set(key("job", number), message)  # type: ignore[arg-type]
        self.member.execute(number, job, timeout_s, abort=False)
        while state.waiting(time.monotonic()):
            for rank in sorted(state.pending):
                if store.check([key("result", number, rank)]):
                    state.answer(rank, pickle.loads(store.get(key("result", number, rank))))
            if state.pending:
                time.sleep(POLL_S)
        out = state.conclude(self.communicators)
        if state.pending:
            self._collect_stacks(out, number, sorted(state.pending))
            self._stuck = f"job {number} ({job.candidate or job.function})"
        return out

    def _collect_stacks(self, out: Outcome, number: int, ranks: list[int]) -> None:
        """The stacks ``ranks`` put into the store for job ``number`` (within
        :data:`STACK_GRACE_S`), into ``out.stacks``."""
        store, key = self.member.store, self.member.key
        grace = time.monotonic() + STACK_GRACE_S
        for rank in ranks:
            stack_key = key("stack", number, rank)
            while not store.check([stack_key]) and time.monotonic() < grace:
                time.sleep(POLL_S)
            out.stacks[rank] = (store.get(stack_key).decode(errors="replace")
                                if store.check([stack_key])
                                else "(no stack: the rank did not answer; on another node "
                                     "its own stderr has faulthandler's dump)")

    @property
    def stuck(self) -> bool:
        """Whether a job is still stuck on some rank (the leader must then ``os._exit``)."""
        return self._stuck is not None

    def close(self, force: bool = False) -> None:
        """Tell the followers to exit (once)."""
        if self._jobs >= 0:
            self._jobs += 1
            self.member.store.set(self.member.key("job", self._jobs), pickle.dumps(None))  # type: ignore[arg-type]
            self._jobs = -1
            self.member.runtime.close()

    def __enter__(self) -> TorchrunPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def follow(backend: str, device: str) -> int:
    """A follower rank's life: run each job the leader publishes until told to stop."""
    member = _Member(backend, device)
    try:
        return _follow_jobs(member)
    finally:
        member.runtime.close()


def _follow_jobs(member: _Member) -> int:
    """:func:`follow`'s loop: the exit code once the leader says stop or goes away."""
    number = 0
    while True:
        number += 1
        job_key = member.key("job", number)
        try:
            member.store.wait([job_key], timedelta(seconds=FOLLOWER_IDLE_S))
        except Exception as exc:  # noqa: BLE001 - the leader is gone
            print(f"ddp-conformance: rank {member.rank}: leader went away ({exc})", file=sys.stderr)
            return 1
        message = pickle.loads(member.store.get(job_key))
        if message is None:
            return 0
        job, timeout_s = message
        member.execute(number, job, timeout_s, abort=True)
        if member.store.check([member.key("stack", number, member.rank)]):
            # Stuck in a collective that cannot be cancelled: wait for faulthandler's exit.
            time.sleep(ABORT_AFTER_S + timeout_s)
            os._exit(3)


def torchrun_pool(config: Any) -> TorchrunPool | int | None:
    """For ``ddp-conformance run``: None outside torchrun; under it, the leader's pool
    (``config.world_size`` becomes torchrun's), or, on every other rank, the exit code of
    :func:`follow` once the leader is done."""
    from ddp_conformance.ranks.environment import validate

    env = detect()
    if env is None:
        return None
    config.world_size = int(env["world_size"])
    device = validate(config.backend, config.device, config.world_size,
                      local_world_size=int(env["local_world_size"]))
    if int(env["rank"]) != 0:
        return follow(config.backend, device)
    return TorchrunPool(config.backend, device)
