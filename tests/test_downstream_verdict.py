"""The paired verdict (quick, pure Python): two checkpoints fine-tuned with the same seeds, the mean of the
per-seed differences in points with its 95% Student t interval, checked against scipy's paired t test and
a hand computation; pairing by seed; the wordings; the degenerate cases (sd 0, one seed, none)."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from tpu_ray.downstream.verdict import Verdict, paired, points

pytestmark = pytest.mark.quick


def _verdict(a, b, **kw):
    return paired("scratch", a, "continued", b, kw.pop("metric", "accuracy"), kw.pop("split", "test"))


def test_mean_and_interval_match_scipy_paired_t_test():
    a = {0: 0.8589, 1: 0.8512, 2: 0.8633, 3: 0.8470, 4: 0.8555, 5: 0.8601}
    b = {0: 0.8712, 1: 0.8590, 2: 0.8641, 3: 0.8633, 4: 0.8570, 5: 0.8744}
    v = _verdict(a, b)
    seeds = sorted(a)
    res = sps.ttest_rel([100 * b[s] for s in seeds], [100 * a[s] for s in seeds])
    low, high = res.confidence_interval(0.95)
    assert v.seeds == tuple(seeds)
    assert v.low() == pytest.approx(low, abs=1e-9)
    assert v.high() == pytest.approx(high, abs=1e-9)
    assert v.mean == pytest.approx((low + high) / 2, abs=1e-9)
    assert v.half_width == pytest.approx((high - low) / 2, abs=1e-9)


def test_three_seeds_by_hand():
    # differences in points: +2, +4, +6 -> mean 4, sd sqrt(((-2)^2 + 0 + 2^2) / 2) = 2,
    # half-width t_{0.975,2} * 2 / sqrt(3) with t_{0.975,2} = 4.302652729749464 (table value).
    v = _verdict({1: 0.50, 2: 0.60, 3: 0.70}, {1: 0.52, 2: 0.64, 3: 0.76})
    assert v.mean == pytest.approx(4.0)
    assert v.sd == pytest.approx(2.0)
    assert v.half_width == pytest.approx(4.302652729749464 * 2 / math.sqrt(3))
    assert v.half_width == pytest.approx(4.968, abs=1e-3)
    assert (v.low(), v.high()) == pytest.approx((4.0 - v.half_width, 4.0 + v.half_width))
    # the interval crosses 0 (4 - 4.968 < 0): no verdict of better
    assert v.words().startswith("no difference detectable with 3 seeds (continued − scratch = 4.0 ± 5.0 points "
                                "of test accuracy, 95% CI)"), v.words()


def test_points():
    assert points(0.8589) == pytest.approx(85.89)


def test_unmatched_seeds_are_dropped_and_mentioned():
    a = {0: 0.70, 1: 0.72, 2: 0.69, 3: 0.71, 7: 0.90}
    b = {0: 0.74, 1: 0.75, 2: 0.72, 3: 0.76, 9: 0.10}
    v = _verdict(a, b)
    assert v.seeds == (0, 1, 2, 3)
    assert v.left_out == (7, 9)
    same = _verdict({s: a[s] for s in range(4)}, {s: b[s] for s in range(4)})
    assert (v.mean, v.sd, v.half_width) == (same.mean, same.sd, same.half_width)
    assert "2 seeds left out, finished by only one of the two (7, 9)" in v.words()
    assert "left out" not in same.words()


def test_better_wording():
    a = {0: 0.70, 1: 0.72, 2: 0.69, 3: 0.71, 4: 0.70}
    b = {0: 0.74, 1: 0.75, 2: 0.72, 3: 0.76, 4: 0.73}
    v = _verdict(a, b)
    assert v.low() > 0
    assert v.words() == (f"continued is better than scratch by {v.mean:.1f} ± {v.half_width:.1f} points of test "
                         f"accuracy (95% CI {v.low():.1f} to {v.high():.1f}, 5 paired seeds)")


def test_worse_wording_gives_the_size_and_the_interval_as_they_are():
    a = {0: 0.74, 1: 0.75, 2: 0.72, 3: 0.76, 4: 0.73}
    b = {0: 0.70, 1: 0.72, 2: 0.69, 3: 0.71, 4: 0.70}
    v = paired("scratch", a, "continued", b, "f1", "validation")
    assert v.high() < 0 and v.mean < 0
    assert v.words() == (f"continued is worse than scratch by {-v.mean:.1f} ± {v.half_width:.1f} points of "
                         f"validation f1 (95% CI {v.low():.1f} to {v.high():.1f}, 5 paired seeds)")


def test_no_difference_wording_says_how_many_seeds_would_resolve_a_point():
    a = {0: 0.70, 1: 0.72, 2: 0.69, 3: 0.71, 4: 0.70}
    b = {0: 0.72, 1: 0.70, 2: 0.71, 3: 0.70, 4: 0.71}
    v = _verdict(a, b)
    assert v.low() < 0 < v.high()
    need = v.seeds_to_resolve(1.0)
    assert need > 5
    assert v.words() == (f"no difference detectable with 5 seeds (continued − scratch = {v.mean:.1f} ± "
                         f"{v.half_width:.1f} points of test accuracy, 95% CI); about {need} seeds would resolve "
                         f"1 point")


def test_no_difference_within_a_point_does_not_ask_for_more_seeds():
    a = {s: 0.70 + 0.01 * s for s in range(6)}
    b = {s: a[s] + d for s, d in zip(range(6), [0.001, -0.002, 0.0015, -0.001, 0.0005, -0.0005])}
    v = _verdict(a, b)
    assert v.low() < 0 < v.high() and v.half_width < 1
    assert "already within ±1 point" in v.words() and "would resolve" not in v.words()


def test_every_difference_equal_is_a_point_interval():
    a = {0: 0.70, 1: 0.60, 2: 0.80}
    b = {0: 0.72, 1: 0.62, 2: 0.82}  # +2 points each, up to float rounding in the subtraction
    v = _verdict(a, b)
    assert v.sd == 0 and v.half_width == 0
    assert v.mean == pytest.approx(2.0)
    assert v.low() == v.high() == v.mean
    assert v.seeds_to_resolve() == 2
    assert v.words() == ("continued is better than scratch by 2.0 points of test accuracy on every one of 3 paired "
                         "seeds (every paired difference is the same, so the interval is that one point)")
    worse = _verdict(b, a)
    assert worse.words().startswith("continued is worse than scratch by 2.0 points")


def test_float_noise_in_the_differences_is_not_spread():
    a = {0: 0.8589, 1: 0.1234, 2: 0.5117, 3: 0.3333}
    b = {s: v + 0.0123 for s, v in a.items()}  # +1.23 points each; the subtraction leaves ~1e-15 of sd
    v = _verdict(a, b)
    assert (v.sd, v.half_width) == (0.0, 0.0)
    assert v.seeds_to_resolve() == 2
    assert v.words().startswith("continued is better than scratch by 1.2 points of test accuracy on every one of 4")


def test_identical_scores_say_no_difference():
    a = {0: 0.70, 1: 0.60}
    v = _verdict(a, dict(a))
    assert (v.mean, v.sd, v.half_width) == (0.0, 0.0, 0.0)
    assert v.words().startswith("no difference: continued and scratch score the same test accuracy on every one "
                                "of 2 paired seeds")


def test_one_paired_seed_cannot_judge():
    v = _verdict({0: 0.70, 1: 0.71}, {0: 0.75})
    assert v.seeds == (0,) and v.left_out == (1,)
    assert v.mean == pytest.approx(5.0)
    assert math.isnan(v.sd) and math.isnan(v.half_width) and math.isnan(v.low()) and math.isnan(v.high())
    assert v.seeds_to_resolve() is None
    assert v.words() == ("cannot judge: 1 paired seed (at least 2 needed; run more seeds); 1 seed left out, "
                         "finished by only one of the two (1)")


def test_no_paired_seed_cannot_judge():
    v = _verdict({0: 0.70}, {1: 0.75})
    assert v.seeds == () and v.left_out == (0, 1)
    assert math.isnan(v.mean) and math.isnan(v.sd) and math.isnan(v.half_width)
    assert v.seeds_to_resolve() is None
    assert v.words().startswith("cannot judge: 0 paired seeds (at least 2 needed; run more seeds)")
    assert _verdict({}, {}).words() == "cannot judge: 0 paired seeds (at least 2 needed; run more seeds)"


def test_non_finite_scores_are_absent():
    a = {0: 0.70, 1: 0.72, 2: 0.69, 3: float("nan")}
    b = {0: 0.74, 1: float("inf"), 2: 0.72, 3: 0.80}
    v = _verdict(a, b)
    assert v.seeds == (0, 2)
    assert v.left_out == (1, 3)
    ref = _verdict({0: 0.70, 2: 0.69}, {0: 0.74, 2: 0.72})
    assert (v.mean, v.sd, v.half_width) == (ref.mean, ref.sd, ref.half_width)
    assert math.isfinite(v.mean) and math.isfinite(v.half_width)
    assert "2 seeds left out" in v.words()


def _brute_force(sd: float, pts: float) -> int:
    n = 2
    while sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n) > pts:
        n += 1
    return n


@pytest.mark.parametrize("sd", [0.3, 0.9, 1.0, 1.7, 2.5, 4.0, 11.0])
@pytest.mark.parametrize("pts", [0.5, 1.0, 2.0])
def test_seeds_to_resolve_matches_a_brute_force_loop(sd, pts):
    v = Verdict("scratch", "continued", "accuracy", "test", (0, 1, 2), 0.0, 1.0, sd)
    n = v.seeds_to_resolve(pts)
    assert n == _brute_force(sd, pts)
    assert n >= 2
    assert sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n) <= pts
    if n > 2:
        assert sps.t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1) > pts


def test_seeds_to_resolve_of_a_measured_verdict():
    a = {0: 0.70, 1: 0.72, 2: 0.69, 3: 0.71, 4: 0.70}
    b = {0: 0.72, 1: 0.70, 2: 0.71, 3: 0.70, 4: 0.71}
    v = _verdict(a, b)
    assert v.seeds_to_resolve() == _brute_force(v.sd, 1.0)
    assert v.seeds_to_resolve(2.0) == _brute_force(v.sd, 2.0) < v.seeds_to_resolve(1.0)
    with pytest.raises(ValueError):
        v.seeds_to_resolve(0)


def test_tiny_differences_keep_their_digits():
    # a real, consistent gain of 0.03 points must not print as "better by 0.0 ± 0.0"
    a = {s: 0.70 + 0.01 * s for s in range(5)}
    b = {s: a[s] + d for s, d in zip(range(5), [0.0003, 0.00031, 0.00029, 0.0003, 0.00032])}
    v = _verdict(a, b)
    assert v.low() > 0
    assert v.words().startswith(f"continued is better than scratch by 0.030 ± {v.half_width:.3f} points"), v.words()
    assert v.half_width >= 0.0005  # so the ± does not print as 0.000 either
    assert f"(95% CI {v.low():.3f} to {v.high():.3f}, 5 paired seeds)" in v.words()


def test_two_seeds_with_one_equal_difference_are_too_few_to_call():
    v = _verdict({0: 0.70, 1: 0.60}, {0: 0.72, 1: 0.62})
    assert v.words().startswith("cannot judge: both paired seeds differ by 2.0 points of test accuracy"), v.words()
