"""``oracle.*``: the candidate's trajectory equals the single-process oracle's."""
from __future__ import annotations

from ddp_conformance.judge.grads import check_grads
from ddp_conformance.judge.registry import Context, check, values


@check("oracle", "oracle.grad", "oracle.grad_none", "oracle.param", "oracle.buffer", when=values)
def oracle_equivalence(ctx: Context) -> None:
    """Every step, every rank, against the oracle (:mod:`ddp_conformance.judge.oracle`):

    - ``oracle.grad``: the synced gradients equal the oracle's (the average over ranks of
      the local gradients, torch's ``DistributedDataParallel`` contract, with the Join /
      microbatch divisor) within the dtype's tolerance, bitwise for exact-valued scenarios;
      a rank that ran more steps than the oracle fails it too;
    - ``oracle.grad_none``: a gradient is ``None`` exactly where the oracle's is (a
      parameter unused on every rank keeps its previous gradient, as torch does; under
      Join with ``find_unused_parameters``, one unused on every active rank after a rank
      joined may instead be all zeros: ``OracleStep.zero_or_none``);
    - ``oracle.param`` / ``oracle.buffer``: parameters and buffers after each step, and the
      buffers at the start of every forward, equal the oracle's trajectory (buffers
      simulated per rank, broadcast where torch broadcasts them).

    With ``oracle_after_join`` off, steps after a rank joined are not compared.
    """
    ev, scenario, oracle = ctx.evidence, ctx.scenario, ctx.oracle
    if scenario.batch_size_step:
        ranks = sorted(ctx.records)
        sizes = [scenario.batch_size_for(r) for r in ranks]
        ev.note(f"uneven batches ({', '.join(map(str, sizes))} samples on ranks "
                f"{', '.join(map(str, ranks))}): DDP's gradient is the mean of the per-rank "
                f"means, each rank weighted 1/{len(ranks)}, which the oracle computes; a "
                f"sample-weighted mean would weight them "
                f"{', '.join(f'{n}/{sum(sizes)}' for n in sizes)}")
    exact = ctx.policy
    for rank, rec in sorted(ctx.records.items()):
        for step, srec in enumerate(rec.steps):
            if step >= len(oracle.steps):
                ev.fail("oracle.grad", f"rank {rank} ran step {step}, the oracle has "
                                       f"{len(oracle.steps)} steps", step, rank)
                break
            ostep = oracle.steps[step]
            if not scenario.oracle_after_join and len(ostep.active) < len(ctx.records):
                break
            check_grads(ev, "oracle", step, rank, srec.grads, ostep.grads, ostep.grad_scales,
                        exact, "the oracle", ostep.zero_or_none)
            ev.compare_all("oracle.param", step, rank, srec.params, ostep.params, exact,
                           "the oracle")
            ev.compare_all("oracle.buffer", step, rank, srec.buffers, ostep.buffers[rank], exact,
                           "the oracle")
            seen, expected = srec.buffers_at_forward, ostep.buffers_at_forward[rank]
            if len(seen) != len(expected):
                ev.fail("oracle.buffer", f"step {step}, rank {rank}: {len(seen)} forwards seen, "
                                         f"{len(expected)} expected", step, rank)
                continue
            for bufs, want in zip(seen, expected, strict=True):
                ev.compare_all("oracle.buffer", step, rank, bufs, want, exact,
                               "the oracle at forward")
