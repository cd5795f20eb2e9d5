"""The scenario catalog: scenarios as data (:mod:`.scenario`), the models they name
(:mod:`.models`), the procedure shared by the ranks and the oracle (:mod:`.procedure`),
and the loader that reads ``suites/`` and validates every scenario (:mod:`.loader`).
"""
