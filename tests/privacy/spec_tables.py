"""Reference values (docs/mathematics.md §1) used by more than one privacy test."""

from __future__ import annotations

__all__ = ["TABLE_11_2"]

# [ESA] Theorem IV.1: (eps_b, eps_f, t, eps(t)) of fragment composition.
TABLE_11_2 = [
    (2.94, 1.5897, 1, 1.369979),
    (2.94, 1.5897, 4, 2.907865),
    (2.94, 0.5586, 1, 0.499995),
    (2.94, 0.5586, 16, 2.937525),
    (8.55, 7.163, 1, 6.939998),
    (1.0, 1.0, 1, 0.433781),
    (5.0, 0.5, 3, 1.471752),
]
