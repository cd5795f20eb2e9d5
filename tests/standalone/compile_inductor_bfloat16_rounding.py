"""torch.compile(backend="inductor") rounds a bfloat16 layer once where eager rounds per op
(torch 2.13, CPU): float32 gradients behind a bfloat16 layer differ from eager's.

Standalone (torch only, no harness, no DDP, one process). Run from anywhere::

    python tests/standalone/compile_inductor_bfloat16_rounding.py

The model is the catalog's MLP with its first layer in bfloat16 and the rest in float32
(``tanh(inp(x.bfloat16())).float()``, then float32 layers). Eager rounds the bfloat16
layer's matmul and its ``tanh`` to bfloat16 before the cast to float32; inductor's
generated kernel fuses the ``tanh`` and the cast and keeps the intermediate in float32
(``torch._inductor.config.emulate_precision_casts`` is off by default), so the float32
layers see other activations: their gradients differ by about bfloat16's rounding
(u = 2**-8 ~ 3.9e-3 relative to the activations), far above float32's. ``aot_eager``
runs eager's kernels and matches eager bitwise, and inductor with
``emulate_precision_casts=True`` comes within float32 rounding of it. Prints the largest
difference of each float32 gradient relative to its largest magnitude, per backend;
exits 1 when inductor's default differs by more than float32 rounding allows (1e-5)
while aot_eager matches.
"""
from __future__ import annotations

import sys

import torch
from torch import nn


class BFloat16First(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.inp.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x.to(torch.bfloat16))).float()
        return self.out(torch.tanh(self.hidden(h)))


def grads(backend: str | None, emulate: bool = False) -> dict[str, torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BFloat16First()
    run = model if backend is None else torch.compile(model, backend=backend)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    with torch._inductor.config.patch(emulate_precision_casts=emulate):
        run(x).square().mean().backward()
    return {n: p.grad for n, p in model.named_parameters() if p.dtype == torch.float32}


def worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[n] - want[n]).abs().max() / want[n].abs().max()) for n in want)


def main() -> int:
    eager = grads(None)
    seen = {"aot_eager": worst(grads("aot_eager"), eager),
            "inductor": worst(grads("inductor"), eager),
            "inductor, emulate_precision_casts": worst(grads("inductor", True), eager)}
    for backend, error in seen.items():
        print(f"{backend:36} max |grad - eager's| / max|eager's| over float32 grads: {error:.2e}")
    return 1 if seen["inductor"] > 1e-5 and seen["aot_eager"] <= 1e-5 else 0


if __name__ == "__main__":
    sys.exit(main())
