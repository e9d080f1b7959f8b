"""The confirmation's sequential test: after each pair from the second, an interval of the mean paired
difference that stays valid however early the pairs stop, and whether to measure another pair.

Looking at an ordinary 95% interval after every pair and stopping at the first that clears the minimum
effect calls a win more often than 1 time in 40: every look is another chance for the noise. Here the 5%
error is spent over the looks in advance (a Lan-DeMets spending function of O'Brien-Fleming shape: little
at the first looks, most at the last), and each look's interval is Student's t at its share. By the union
bound, all the intervals of a confirmation hold the true mean together with at least 95% probability
(repeated confidence intervals, Jennison & Turnbull), whatever rule stops the pairs: the win rule below
is as safe as the fixed-n interval it replaces. The price is a wider interval at the last look (with 4
pairs, the last look spends 3.4% instead of 5%); the gain is that a large effect stops after about 3 pairs
of 4 on average (2 at the soonest) instead of running all of them, and a candidate that cannot win stops
after 2 or 3 (docs/metrics.md has the simulated power and pairs).

The pairs stop when the interval clears the minimum effect (a win), when it lies wholly below it (not a
win, however many more pairs), or when even a final mean one standard error (of the mean so far) above
the current one would leave the last look's interval short of the minimum effect (futile). Stopping
for futility never adds a win, so it costs no false wins; in simulation it cost under 2 points of power
with 4 pairs planned, and about 3 with 8 (at an effect of one standard deviation of a pair).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.scoring import difference_ci
from tuner.study_record import StopReason

__all__ = ["ALPHA", "Look", "look", "spending"]

ALPHA = 0.05  # the whole confirmation's chance of an interval that misses the true mean


@dataclass(frozen=True, kw_only=True)
class Look:
    """What the pairs so far say: the mean difference, its interval, and why to stop (None: go on)."""

    mean: float
    low: float
    high: float
    stop: StopReason | None


def spending(planned: int, alpha: float = ALPHA) -> list[float]:
    """The two-sided error spent at each look, after pairs 2..`planned`; the shares add up to `alpha`.

    The spending function is Lan-DeMets' O'Brien-Fleming shape, 2 - 2 Phi(z / sqrt(t)), over the
    information fraction t = (pairs - 1) / (planned - 1), the degrees of freedom the variance has: a
    first look with one degree of freedom gets almost nothing, for its t interval is too wide to use it.
    With 2 pairs planned there is one look at the whole `alpha`, the fixed-n interval."""
    if planned < 2:
        raise ValueError(f"a sequential confirmation needs at least 2 pairs, not {planned}")
    from scipy import stats  # imported when a confirmation looks: scipy.stats takes most of a second

    z = float(stats.norm.ppf(1 - alpha / 2))
    spent = [0.0]
    for pairs in range(2, planned + 1):
        fraction = (pairs - 1) / (planned - 1)
        spent.append(alpha if pairs == planned else float(2 - 2 * stats.norm.cdf(z / math.sqrt(fraction))))
    return [later - earlier for earlier, later in itertools.pairwise(spent)]


def look(differences: Sequence[float], *, planned: int, min_effect: float) -> Look:
    """The look after `len(differences)` pairs of at most `planned`."""
    n = len(differences)
    mean = float(np.mean(differences)) if n else 0.0
    if n < 2:
        return Look(mean=mean, low=-math.inf, high=math.inf, stop=None)
    errors = spending(planned)
    low, high = difference_ci(differences, confidence=1 - errors[n - 2])
    if low > min_effect:
        return Look(mean=mean, low=low, high=high, stop="above")
    if high < min_effect:
        return Look(mean=mean, low=low, high=high, stop="below")
    if n >= planned:
        return Look(mean=mean, low=low, high=high, stop="all pairs")
    from scipy import stats

    spread = float(np.std(differences, ddof=1))
    hoped = mean + spread / math.sqrt(n)  # one standard error better than the pairs so far
    last_half = float(stats.t.ppf(1 - errors[-1] / 2, planned - 1)) * spread / math.sqrt(planned)
    if hoped - last_half <= min_effect:
        return Look(mean=mean, low=low, high=high, stop="futile")
    return Look(mean=mean, low=low, high=high, stop=None)
