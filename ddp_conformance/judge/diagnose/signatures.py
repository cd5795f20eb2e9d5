"""Relations between a wrong value and what was expected: pure functions of tensors.

Each relation is called one only when it holds *exactly up to rounding*, with the bound
stated here, so that a near miss is never named (a ratio of 1.98 is not "2x").

The numerical argument. A DDP gradient is a sum of ``terms`` parts (one per rank), each
divided by the group size, in some order; recursive summation of ``n`` parts in a dtype of
unit roundoff ``u`` errs by at most ``(n - 1) u sum|parts|`` and each division by one more
``u |part|`` (Higham, *Accuracy and Stability*, 4.2). The two sides of a relation (the
candidate's value and ``c x`` the expected one) are each such a sum, summed possibly in
another order (a ring allreduce), so their difference is at most ``2 terms u scale``
where ``scale`` bounds ``sum|parts|`` element by element (the oracle's ``grad_scales``,
or ``max|expected|``). :func:`rounding_bound` allows twice that, ``4 terms u scale
max(1, |c|)``: for float32 and two ranks ``4.8e-7`` relative, 20,000 times finer than
the 1% between 1.98 and 2, and a relation that is off in one element is no relation.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: Narrower floating dtypes a wider gradient may have been rounded through, fewest mantissa
#: bits first (a bfloat16 value of small exponent is a float16 value too, not conversely).
NARROWER = (torch.bfloat16, torch.float16)


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a complex dtype's parts (``dtype`` itself for a real one)."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64,
            torch.complex32: torch.float16}.get(dtype, dtype)


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u`` of a floating dtype: half its machine epsilon (0 for an integer dtype: exact)."""
    dtype = real_dtype(dtype)
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def rounding_bound(dtype: torch.dtype, scale: float, terms: int, ratio: float = 1.0) -> float:
    """How far two sums of ``terms`` rounded parts of magnitude ``scale`` may differ: see the
    module docstring (``4 terms u scale max(1, |ratio|)``)."""
    return 4 * max(terms, 1) * unit_roundoff(dtype) * scale * max(1.0, abs(ratio))


def _flat(t: Tensor) -> Tensor:
    t = t.detach()
    t = t.to_dense() if t.is_sparse else t
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1).double()


def _finite_pair(actual: Tensor, expected: Tensor) -> tuple[Tensor, Tensor] | None:
    """Both as flat float64, when they have the same number of elements, all finite."""
    if actual.numel() != expected.numel() or actual.numel() == 0:
        return None
    a, e = _flat(actual), _flat(expected)
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return None
    return a, e


def magnitude(expected: Tensor, scale: float = 0.0) -> float:
    """The magnitude rounding is proportional to: ``scale`` or ``max|expected|``."""
    flat = _flat(expected)
    largest = float(flat.abs().max()) if flat.numel() else 0.0
    return max(scale, largest)


def fits_ratio(actual: Tensor, expected: Tensor, ratio: float, terms: int,
               scale: float = 0.0, dtype: torch.dtype | None = None) -> bool:
    """Every element of ``actual`` is ``ratio`` times ``expected``'s, within
    :func:`rounding_bound` (in ``dtype``, default ``expected``'s; ``scale`` or
    ``max|expected|``), or overflowed to the infinity of its sign where ``ratio`` times
    the expected element is beyond what the dtype holds (:func:`overflowed`). False for an
    all-zero or non-finite ``expected`` (a ratio to nothing says nothing), for shapes
    that differ, and for a NaN."""
    if actual.numel() != expected.numel() or actual.numel() == 0:
        return False
    a, e = _flat(actual), _flat(expected)
    dtype = dtype or expected.dtype
    if not bool(torch.isfinite(e).all()):
        return False
    finite = torch.isfinite(a)
    if not bool(finite.all()):
        if not overflowed(a[~finite], ratio * e[~finite], dtype, terms):
            return False
        a, e = a[finite], e[finite]
    mag = magnitude(expected, scale)
    if mag == 0.0:
        return False
    bound = rounding_bound(dtype, mag, terms, ratio)
    return bool(((a - ratio * e).abs() <= bound).all())


def overflowed(actual: Tensor, would_be: Tensor, dtype: torch.dtype, terms: int) -> bool:
    """Each element of ``actual`` is the infinity of ``would_be``'s sign, and
    ``|would_be|`` is at least the dtype's largest value over ``2 terms`` (a sum of
    ``terms`` parts overflows once a partial sum passes the largest value; the parts
    themselves can be up to ``terms`` times the final sum's magnitude apart, with a factor
    2 for rounding near the top of the range)."""
    if not dtype.is_floating_point or not bool(torch.isinf(actual).all()):
        return False
    top = torch.finfo(dtype).max / (2 * max(terms, 1))
    return bool(((torch.sign(actual) == torch.sign(would_be)) & (would_be.abs() >= top)).all())


def best_ratio(actual: Tensor, expected: Tensor) -> float | None:
    """The least-squares ``c`` of ``actual ~ c expected`` (None: shapes differ, an
    all-zero or non-finite side)."""
    pair = _finite_pair(actual, expected)
    if pair is None:
        return None
    a, e = pair
    denominator = float((e * e).sum())
    return float((a * e).sum()) / denominator if denominator > 0 else None


def constant_ratio(actual: Tensor, expected: Tensor, terms: int, scale: float = 0.0
                   ) -> float | None:
    """The one constant ``c`` with ``actual == c expected`` element by element within
    :func:`rounding_bound`, or None when no constant fits every element."""
    c = best_ratio(actual, expected)
    if c is None or not fits_ratio(actual, expected, c, terms, scale):
        return None
    return c


def equal_within(actual: Tensor, target: Tensor, terms: int, scale: float = 0.0,
                 dtype: torch.dtype | None = None) -> bool:
    """``actual`` equals ``target`` within :func:`rounding_bound` (an all-zero ``target``
    only when ``actual`` is all zeros too)."""
    pair = _finite_pair(actual, target)
    if pair is None:
        return False
    a, t = pair
    if magnitude(target, scale) == 0.0:
        return bool((a == 0).all())
    return fits_ratio(actual, target, 1.0, terms, scale, dtype)


def permuted(actual: Tensor, expected: Tensor, terms: int, scale: float = 0.0,
             dtype: torch.dtype | None = None) -> bool:
    """``actual`` holds ``expected``'s elements in another order: their sorted values are
    equal within :func:`rounding_bound` (in ``dtype``, default ``expected``'s) and their
    positions are not."""
    pair = _finite_pair(actual, expected)
    if pair is None or equal_within(actual, expected, terms, scale, dtype):
        return False
    a, e = pair
    return equal_within(a.sort().values, e.sort().values, terms, magnitude(expected, scale),
                        dtype or expected.dtype)


def narrowed_through(actual: Tensor, expected: Tensor, terms: int, scale: float = 0.0
                     ) -> torch.dtype | None:
    """The narrower dtype ``actual`` was rounded through, if that is what its values show:
    for the first of :data:`NARROWER` (narrower than ``expected``'s dtype) such that

    - every element of ``actual`` is representable in it (a round trip leaves it
      unchanged) while some element of ``expected`` is not, and
    - ``actual`` is within that dtype's rounding of ``expected``: ``rounding_bound`` with
      its unit roundoff, ``terms + 1`` roundings (each part, then the sum).

    An error at float16's rounding whose values are not representable (a hook that
    divides after converting back) is :func:`rounding_dtype`'s to name."""
    pair = _finite_pair(actual, expected)
    if pair is None or actual.is_complex():
        return None
    a, e = pair
    wide = real_dtype(expected.dtype)
    for narrow in NARROWER:
        if unit_roundoff(narrow) <= unit_roundoff(wide):
            continue
        a_wide, e_wide = a.to(wide), e.to(wide)
        if not bool((a_wide.to(narrow).to(wide) == a_wide).all()):
            continue
        if bool((e_wide.to(narrow).to(wide) == e_wide).all()):
            continue
        if _within_rounding_of(a, e, narrow, terms + 1, magnitude(expected, scale)):
            return narrow
    return None


def rounding_dtype(actual: Tensor, expected: Tensor, terms: int, scale: float = 0.0
                   ) -> torch.dtype | None:
    """The finest dtype of :data:`NARROWER` whose rounding explains the error: the
    relative error (to ``scale``) is within that dtype's ``rounding_bound`` and at least
    an eighth of its unit roundoff (an error far smaller is some other, finer rounding),
    and more than the wide dtype's own bound. None otherwise."""
    pair = _finite_pair(actual, expected)
    if pair is None:
        return None
    a, e = pair
    mag = magnitude(expected, scale)
    wide = real_dtype(expected.dtype)
    error = float((a - e).abs().max())
    if mag == 0.0 or error <= rounding_bound(wide, mag, terms):
        return None
    for narrow in reversed(NARROWER):  # the finest first: an error at its scale is its
        u = unit_roundoff(narrow)
        if u > unit_roundoff(wide) and u / 8 <= error / mag and \
                _within_rounding_of(a, e, narrow, terms + 1, mag):
            return narrow
    return None


def _within_rounding_of(a: Tensor, e: Tensor, narrow: torch.dtype, roundings: int,
                        mag: float) -> bool:
    """|a - e| within ``roundings`` roundings in ``narrow`` of values of magnitude ``mag``
    (``2 roundings u mag``), plus its smallest subnormal per rounding (values that
    underflow there)."""
    tiny = torch.finfo(narrow).smallest_normal * torch.finfo(narrow).eps
    bound = 2 * roundings * unit_roundoff(narrow) * mag + roundings * tiny
    return bool(((a - e).abs() <= bound).all())


def which_equal(actual: Tensor, candidates: dict[int, Tensor], terms: int, scale: float = 0.0
                ) -> int | None:
    """The first key of ``candidates`` whose tensor ``actual`` equals (:func:`equal_within`)."""
    for key, tensor in candidates.items():
        if equal_within(actual, tensor, terms, scale):
            return key
    return None
