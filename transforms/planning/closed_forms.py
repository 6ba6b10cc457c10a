"""[Collision]'s closed-form plans "given a central target" (docs/mathematics.md §1.3, §3.1), shown beside the
tight plan.

The privacy blanket gives ``Omega = eps_c^2 (n - 1)/(14 ln(2/delta))`` directly from the target, valid only
for eps_c <= 1 and n - 1 >= 27 Omega/eps_c (the latter is 14 ln(2/delta) >= 27 eps_c). It is stated for k-ary
randomized response; [Collision] Thm 3 applies it to Collision with Omega = s e^eps + t - s, and with PCKV-GRR being
k-RR over 2d' outputs (``kv_formulas.alpha_pckv_grr``) it applies there with Omega = e^eps + 2d' - 1.
Every plan is returned as a JSON-ready dict; ``tight_eps_central`` certifies it with the tight bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from transforms.privacy.kv_formulas import _argmin_int, _coco_sums, collision_item_variance, pckv_error
from transforms.privacy.mixture import alpha_collision, alpha_generic, alpha_grr
from transforms.privacy.shuffle_bound import epsilon_central

__all__ = ["blanket_omega_for_target", "collision_closed_form_t", "kv_closed_form"]

_FIELDS = ("omega", "t", "eps_local", "mse_frequency", "mse_mean", "tight_eps_central")


def blanket_omega_for_target(n: int, eps_c: float, delta: float) -> tuple[float, str | None]:
    """(Omega, None) meeting (eps_c, delta) by the blanket bound, or (Omega, reason) when it does not apply."""
    omega = eps_c**2 * (n - 1) / (14.0 * math.log(2.0 / delta))
    if eps_c > 1.0:
        return omega, f"the blanket bound requires eps_c <= 1 (got {eps_c:g})"
    if 14.0 * math.log(2.0 / delta) < 27.0 * eps_c:
        return omega, "the blanket bound requires n - 1 >= 27 Omega/eps_c, i.e. 14 ln(2/delta) >= 27 eps_c"
    return omega, None


def collision_closed_form_t(omega: float, s: int) -> float:
    """[Collision] §5: the variance-optimal continuous t at fixed Omega."""
    root = math.sqrt(omega**2 + 2.0 * omega * (7 * s - 8) + s * s - 16 * s + 16)
    return (4.0 + omega + s + root) / 6.0


def _refuse(name: str, reason: str, omega: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "valid": False, "reason": reason}
    out.update(dict.fromkeys(_FIELDS))
    out["omega"] = omega
    return out


def _plan(name: str, omega: float, t: float | None, eps: float, error: tuple[float, float], n: int,
          tight: float) -> dict[str, Any]:
    return {"name": name, "valid": True, "reason": None, "omega": omega, "t": t, "eps_local": eps,
            "mse_frequency": error[0] / n, "mse_mean": error[1] / n, "tight_eps_central": tight}


def kv_closed_form(mechanism: str, d: int, s: int, n: int, eps_c: float, delta: float) -> dict[str, Any]:
    """[Collision]'s plan for ``mechanism`` (see the module docstring), or the reason it has none."""
    name = {"collision": "[Collision] blanket (Thm 3 + §5 t rule)", "coco": "blanket Omega + t minimising Lemma 3",
            "pckv-grr": "blanket k-RR over 2d' outputs"}.get(mechanism, "blanket")
    if mechanism not in ("collision", "coco", "pckv-grr"):
        return _refuse(name, "the privacy blanket (§1.3) covers k-RR-type randomizers only "
                             "(collision, coco, pckv-grr)")
    omega, reason = blanket_omega_for_target(n, eps_c, delta)
    if reason is not None:
        return _refuse(name, reason, omega)
    if mechanism == "pckv-grr":
        k = 2 * (d + s)
        if omega - k + 1 <= 1.0:
            return _refuse(name, f"Omega = {omega:.6g} leaves no budget: need Omega > 2d' = {k}; raise n or eps_c",
                           omega)
        eps = math.log(omega - k + 1)
        error = pckv_error("grr", d, s, eps)
        tight = epsilon_central(n, alpha_grr(eps, k), eps, delta)
        return _plan(name, omega, None, eps, (error.frequency, error.mean), n, tight)
    if mechanism == "collision":
        t = collision_closed_form_t(omega, s) if omega > s + 1 else math.nan
        if not s < t < omega:
            return _refuse(name, f"Omega = {omega:.6g} is too small for s = {s} (need s < t < Omega); "
                                 "raise n or eps_c", omega)
        eps = math.log((omega - t + s) / s)
        total = collision_item_variance(d, s, eps, t)
        # certify the integer t nearest to [Collision]'s continuous one, at the same Omega
        t_int = max(s + 1, round(t))
        eps_int = math.log((omega - t_int + s) / s) if t_int < omega else None
        tight = (epsilon_central(n, min(alpha_collision(eps_int, s, t_int), alpha_generic(eps_int)), eps_int, delta)
                 if eps_int and eps_int > 0 else None)
        return _plan(name, omega, t, eps, (total, total), n, tight)
    if omega <= 2 * s + 2:
        return _refuse(name, f"Omega = {omega:.6g} is too small for CoCo (need an even t in [2s + 2, Omega)); "
                             "raise n or eps_c", omega)

    def mean_at(half: np.ndarray) -> np.ndarray:  # CoCo at fixed Omega: t = 2 half, e^eps = (Omega - t + s)/s
        ts = 2.0 * half
        return _coco_sums(d, s, np.log((omega - ts + s) / s), ts)[0]

    t = 2 * _argmin_int(mean_at, s + 1, math.ceil(omega / 2.0) - 1)
    eps = math.log((omega - t + s) / s)
    if not t < omega or eps <= 0.0:
        return _refuse(name, f"Omega = {omega:.6g} is too small for CoCo (need an even t in [2s + 2, Omega)); "
                             "raise n or eps_c", omega)
    mean, present = _coco_sums(d, s, eps, t)
    tight = epsilon_central(n, alpha_collision(eps, s, t), eps, delta)
    return _plan(name, omega, t, eps, ((float(mean) + float(present)) / 2.0, float(mean)), n, tight)
