"""The paired-rounds verdict: resolves a clear effect, refuses to call noise a result."""
import pytest

from pipelab import noise


def test_clear_effect_is_resolved():
    v = noise.verdict([1.0, 1.1, 0.9, 1.0, 1.05], [1.5, 1.6, 1.4, 1.5, 1.55], ("fast", "slow"))
    assert v.faster == "fast" and v.resolved
    assert 1.4 < v.ratio < 1.6
    assert "fast faster than slow" in str(v)


def test_b_faster_is_named():
    v = noise.verdict([2.0, 2.1, 1.9], [1.0, 1.0, 1.0], ("A", "B"))
    assert v.faster == "B"


def test_rounds_that_disagree_are_not_resolvable():
    # B is slower in most rounds but faster in two: the counted interval straddles 1.
    v = noise.verdict([1.0] * 5, [1.3, 1.2, 0.9, 0.8, 1.25], ("A", "B"))
    assert v.faster is None and not v.resolved
    assert "not resolvable" in str(v)


def test_one_outlier_round_does_not_decide():
    # Four rounds say A is 30% faster; one burst of load flips the fifth: still resolved.
    v = noise.verdict([1.0] * 5, [1.3, 1.3, 1.3, 1.3, 0.5], ("A", "B"))
    assert v.faster == "A"


def test_effect_inside_the_margin_is_not_claimed():
    v = noise.verdict([1.0] * 5, [1.03] * 5, ("A", "B"), margin=0.05)
    assert v.faster is None


def test_paired_rounds_alternates_and_times():
    calls = []
    v = noise.paired_rounds(lambda: calls.append("a") or 1.0, lambda: calls.append("b") or 2.0,
                            rounds=4, progress=False)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert v.faster == "A" and v.ratio == 2.0


@pytest.mark.parametrize("args", [([], []), ([1.0], [1.0, 2.0]), ([0.0], [1.0])])
def test_bad_samples_refused(args):
    with pytest.raises(ValueError):
        noise.verdict(*args)


def test_bad_rounds_refused():
    with pytest.raises(ValueError, match="rounds"):
        noise.paired_rounds(lambda: 1.0, lambda: 1.0, rounds=0)
