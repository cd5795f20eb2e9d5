"""From evidence to cause: the cause codes, the relations that yield them, and the
diagnosis of a run per candidate (docs/diagnosis.md).

- :mod:`.causes`: the codes (a public contract) and the evidence each stands for;
- :mod:`.signatures`: relations between tensors, with their numerical argument;
- :mod:`.values` and :mod:`.case`: one failing case's cause, from its records;
- :mod:`.endings`: the cause of an ERROR, CRASH or TIMEOUT, from what the ranks left;
- :mod:`.findings`: the few causes that explain most of a candidate's unexpected verdicts.
"""
