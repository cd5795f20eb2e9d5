"""What one run is asked to do: candidates, backend, device, world size, deadlines.

Built from the command line or from pytest's options through the one option table
(:mod:`ddp_conformance.options`), so both routes configure the same :class:`RunConfig`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunConfig:
    candidates: list[str] = field(default_factory=lambda: ["torch"])
    backend: str = "gloo"
    device: str = "cpu"
    world_size: int = 2
    #: Deadline of one case, in seconds.
    timeout_s: float = 60.0
    pool: str = "persistent"  # or "fresh"
    #: After the first fault, keep a warm spare process per rank (see ranks/pool.py).
    spare: bool = True
    #: Run a world size that does not fit the machine (ranks/capacity.py) anyway.
    allow_oversubscribe: bool = False
    expectations: str | None = None
    #: Also compare every candidate with the reference DDP run on the same scenario.
    compare_with_reference: bool = True
    #: Trace collectives at the process-group level and check them.
    trace: bool = True
    #: Enforce the strict profile (bucket layout equal to the reference's, torch's exact
    #: wire dtype) for every candidate, not only for torch and reference.
    strict_profile: bool = False
    #: How many of the slowest cases the summary lists with their costs (0: every case).
    durations: int = 10
    #: The backend's own collective checks: "auto" (for a custom backend), "on", "off",
    #: or "only" (no DDP scenario).
    collectives: str = "auto"
    #: Run every scenario on this backend too, side by side: "auto" (gloo for a custom
    #: backend), "none", or a backend spec.
    compare_backend: str = "auto"
    #: ``--coverage`` targets (modules, packages or paths) measured in every process.
    coverage: list[str] = field(default_factory=list)
    #: Run the scenarios marked ``slow`` too (N/A otherwise).
    slow: bool = False
    #: A refusal must carry torch's message (``Scenario.expect_error``/``torch_limit``'s
    #: regular expression); without it any clear error on every rank is a refusal.
    strict_messages: bool = False

    def runs_collectives(self, custom_backend: bool) -> bool:
        """Whether the run includes the backend's collective checks."""
        return self.collectives in ("on", "only") or (self.collectives == "auto" and custom_backend)

    def runs_scenarios(self) -> bool:
        """Whether the run includes the DDP catalog."""
        return self.collectives != "only"

    def comparison_backend(self, custom_backend: bool) -> str:
        """The backend every scenario also runs on ('' for none)."""
        if self.compare_backend == "auto":
            return "gloo" if custom_backend else ""
        return "" if self.compare_backend == "none" else self.compare_backend
