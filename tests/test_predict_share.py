"""predict(share=True): a share asked for in a text box reads "0.4", "40 %" and "40" alike."""
from pipelab.views.predict import Judge


def test_a_share_accepts_a_fraction_a_percent_sign_and_a_bare_percent():
    judge = Judge(0.4, tolerance=0.01, share=True)
    for typed in ("0.4", "40%", "40 %", "40", "2/5", 0.4):
        assert judge.check(typed), typed
    for typed in ("4", "0.5", "50", "400 %", "4 %"):
        assert not judge.check(typed), typed


def test_without_share_a_bare_40_is_forty():
    judge = Judge(0.4, tolerance=0.01)
    assert judge.check("40 %") and not judge.check("40")
    assert Judge(57, tolerance=10).check("57")          # a percentage asked as a number stays one
