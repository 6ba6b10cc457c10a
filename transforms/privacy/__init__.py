"""Privacy accounting for shuffled reports (docs/mathematics.md §1): pure numpy/scipy, no Beam/Kafka/Avro.

* ``shuffle_bound`` — the tight numerical amplification bound (the accountant the pipeline reports);
* ``mixture`` — mixture parameters alpha of each local randomizer (input of the tight bound);
* ``closed_forms`` — closed-form bounds for comparison, each refusing outside its validity conditions;
* ``composition`` — composition theorems and post-processing composition (report fragmenting);
* ``crowd`` — crowd thresholding / randomized report deletion parameters;
* ``report`` — the ``esa privacy`` report;
* ``odometer`` (with ``shuffle_pld`` and ``windows_report``) — composition of many windows of one
  population by privacy loss distributions (the planners that use it are in ``transforms.planning``).
  Import these modules directly: they load dp_accounting (~0.8 s), which single-window commands do not need.
"""

from .closed_forms import (
    ClosedForm,
    blanket_collision,
    blanket_krr,
    blanket_min_gamma,
    blanket_omega,
    efmrtt19,
    fmt21_clones,
    lemma_ii5,
    lemma_ii6,
    lemma_ii6_rappor,
    rappor_flip_lambda,
    theorem_iii1,
)
from .composition import (
    advanced_composition_drv,
    basic_composition,
    bun_steinke_composition,
    chain_composition,
    compose_post_processing,
    drv_step_epsilon,
    fragment_epsilon,
)
from .crowd import (
    abort_probability,
    crowd_threshold,
    deletion_variance,
    discrete_laplace_scale,
    discrete_laplace_variance,
    max_loss_bound,
)
from .fragment_report import FRAGMENTED_PRIVACY_MECHANISMS, fragmented_privacy_report
from .fragments import (
    default_fragment_epsilon,
    fragment_alpha,
    fragment_rows_bound,
    fragments_tight,
    rappor_tight,
    replacement_central,
    theorem_iv2,
)
from .mixture import (
    alpha_binary_rr,
    alpha_collision,
    alpha_from_tv,
    alpha_generic,
    alpha_grr,
    alpha_hadamard,
    alpha_olh,
    alpha_oue,
)
from .report import (
    ALL_PRIVACY_MECHANISMS,
    PRIVACY_MECHANISMS,
    build_privacy_report,
    format_privacy_report,
    mechanism_alpha,
    privacy_report,
)
from .shuffle_bound import (
    FAST_WINDOW_SDS,
    ShuffleDivergence,
    check_mixture_alpha,
    epsilon_central,
    hockey_stick,
)

__all__ = [
    "ALL_PRIVACY_MECHANISMS",
    "FAST_WINDOW_SDS",
    "FRAGMENTED_PRIVACY_MECHANISMS",
    "PRIVACY_MECHANISMS",
    "ClosedForm",
    "ShuffleDivergence",
    "abort_probability",
    "advanced_composition_drv",
    "alpha_binary_rr",
    "alpha_collision",
    "alpha_from_tv",
    "alpha_generic",
    "alpha_grr",
    "alpha_hadamard",
    "alpha_olh",
    "alpha_oue",
    "basic_composition",
    "blanket_collision",
    "blanket_krr",
    "blanket_min_gamma",
    "blanket_omega",
    "build_privacy_report",
    "bun_steinke_composition",
    "chain_composition",
    "check_mixture_alpha",
    "compose_post_processing",
    "crowd_threshold",
    "default_fragment_epsilon",
    "deletion_variance",
    "discrete_laplace_scale",
    "discrete_laplace_variance",
    "drv_step_epsilon",
    "efmrtt19",
    "epsilon_central",
    "fmt21_clones",
    "format_privacy_report",
    "fragment_alpha",
    "fragment_epsilon",
    "fragment_rows_bound",
    "fragmented_privacy_report",
    "fragments_tight",
    "hockey_stick",
    "lemma_ii5",
    "lemma_ii6",
    "lemma_ii6_rappor",
    "max_loss_bound",
    "mechanism_alpha",
    "olh_buckets",
    "privacy_report",
    "rappor_flip_lambda",
    "rappor_tight",
    "replacement_central",
    "theorem_iii1",
    "theorem_iv2",
]
