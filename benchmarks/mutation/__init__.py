"""Mutation score of the catalog: torch's own DDP, one mutation at a time, as the candidate.

- :mod:`.population`: every mutation cosmic-ray's operators can make to torch's DDP sources
  (:data:`.population.TARGETS`), the seeded sample, and each mutant's source;
- :mod:`.install`: a mutant built in a rank (the mutated source executed into a module of its
  own, torch's modules untouched) and driven as a DDP-like candidate;
- :mod:`.live`: the candidate specs, ``benchmarks.mutation.live:<mutant id>``;
- :mod:`.select`: which scenarios run a mutated line (per-case coverage contexts);
- :mod:`.measure`: the catalog against each mutant, results appended to a JSONL file;
- :mod:`.verdicts`: the classification of the survivors (``verdicts.toml``);
- :mod:`.page`: ``docs/mutation.md`` from the results and the classification.

``python benchmarks/mutation_score.py`` drives them.
"""
