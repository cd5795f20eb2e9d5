"""The ranks: processes that run jobs, and how jobs reach them.

- :mod:`.runtime`: the ONE procedure a rank follows for a job (reset, groups, run,
  collect, destroy);
- :mod:`.messages`: the typed messages between the parent and the ranks;
- :mod:`.pool` and :mod:`.worker`: the persistent rank pool (processes, deadlines, stacks,
  crashes); :mod:`.torchrun`: the same jobs on ranks torchrun started;
- :mod:`.outcome`: how a job ended, before any verdict;
- :mod:`.engine`: one scenario on one rank, recorded into :mod:`.records`;
- :mod:`.tracing`: the tracing process group (every collective, at the c10d level);
- :mod:`.environment`: what this machine can run (backend, device, world size).
"""
