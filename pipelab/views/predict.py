"""Predict-then-check: the reader commits to an answer before the notebook shows the number.

`predict(question, answer)` shows the question, an input (a text box, or a dropdown when
`choices` are given) and a Check button. The notebook computes `answer` itself (and can
`assert` on `.answer`); `.check(value)` is the same judgement the button makes.
"""
from __future__ import annotations

import html
import math
from fractions import Fraction
from typing import Sequence

from . import ui


def _number(value) -> float | None:
    """A float from a number or from text such as "36", "0.25", "3/11", "27 %"; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().replace(",", "").replace("−", "-")
    percent = text.endswith("%")
    text = text.rstrip("%").strip()
    try:
        number = float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        return None
    return number / 100 if percent else number


class Judge:
    """The judgement alone (no widget): numbers within `tolerance`, text compared loosely."""

    def __init__(self, answer, tolerance: float = 0.0, share: bool = False):
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        self.answer = answer
        self.tolerance = tolerance
        self.numeric = _number(answer) is not None and not isinstance(answer, str)
        self.share = share       # the answer is a share in [0, 1]: a bare number above 1 is percent

    def check(self, value) -> bool:
        if self.numeric:
            number = _number(value)
            if self.share and number is not None and number > 1 and "%" not in str(value):
                number /= 100    # "40" for a share means 40 %, as "40 %" does
            return number is not None and math.isfinite(number) and \
                abs(number - float(self.answer)) <= self.tolerance + 1e-12 * abs(float(self.answer))
        return str(value).strip().casefold() == str(self.answer).strip().casefold()


def predict(question: str, answer, *, tolerance: float = 0.0, unit: str = "", explain: str = "",
            choices: Sequence | None = None, subject: str = "the pipeline", share: bool = False):
    """A question, an input and a Check button; on Check it says right or wrong, then shows the
    computed answer and the explanation. Returns the widget (a VBox) with `.answer` (the
    computed answer, for the notebook's asserts) and `.check(value) -> bool`.

    `subject` names where the answer comes from, as the feedback says it: "… ; the pipeline
    gives 41 units." is right for a simulated or measured step, wrong for a byte model, a
    routing rule or the planner: pass e.g. subject="the byte model" or "the planner".
    `share=True`: the answer is a share (0.4); "0.4", "40 %" and "40" are all read as 0.4."""
    import ipywidgets as w

    judge = Judge(answer, tolerance, share=share)
    if not str(subject).strip():
        raise ValueError("subject must name where the answer comes from (e.g. 'the planner'), "
                         "got an empty string")
    if choices is not None:
        choices = list(choices)
        if answer not in choices:
            raise ValueError(f"the answer {answer!r} is not among the choices {choices}")
        field = w.Dropdown(options=choices, value=None, description="your answer",
                           style=ui.style(), layout=ui.layout("420px"))
    else:
        field = w.Text(placeholder="a number" if judge.numeric else "your answer",
                       description="your answer", continuous_update=False,
                       style=ui.style(), layout=ui.layout("420px"))
    button = w.Button(description="Check", button_style="info", layout=w.Layout(width="100px"))
    result = w.HTML(layout=w.Layout(min_height="48px"))
    prompt = w.HTML(f"<b>Predict:</b> {html.escape(question)}")
    box = w.VBox([prompt, w.HBox([field, button]), result])
    for widget, name in ((box, "predict"), (field, "predict-input"), (button, "predict-check"),
                         (result, "predict-result")):
        widget.add_class(f"pipelab-{name}")

    shown = _show(answer, unit, tolerance if judge.numeric else 0.0)

    asked = []        # the reader pressed Check at least once

    def on_check(_button=None) -> None:
        asked.append(True)
        value = field.value
        if value in (None, ""):
            result.value = "<span style='color:#8a6d3b'>type an answer first</span>"
            return
        right = judge.check(value)
        verdict = ("<span style='color:#2e7d32'><b>✔ right</b></span>" if right else
                   "<span style='color:#c62828'><b>✘ wrong</b></span>")
        result.value = (f"{verdict}: you said {html.escape(str(value))}; "
                        f"{feedback(subject, shown)}"
                        + (f"<br>{html.escape(explain)}" if explain else ""))

    button.on_click(on_check)

    def on_value(_change) -> None:
        # The browser may deliver a click before the typed value (it holds back a widget's
        # updates while an earlier one is unanswered): once the reader has asked, a value
        # arriving later is judged too, so the verdict always matches the box.
        if asked:
            on_check()

    field.observe(on_value, names="value")
    box.answer = answer
    box.check = judge.check
    box.field, box.button, box.result = field, button, result
    box.submit = on_check
    return box


def feedback(subject: str, shown: str) -> str:
    """"the pipeline gives <b>41 units</b>." — the answer, attributed to its source (HTML)."""
    return f"{html.escape(subject.strip())} gives <b>{html.escape(shown)}</b>."


def _show(answer, unit: str, tolerance: float) -> str:
    text = f"{answer:.4g}" if isinstance(answer, float) else str(answer)
    if unit:
        text += f" {unit}"
    if tolerance:
        text += f" (± {tolerance:g} accepted)"
    return text
