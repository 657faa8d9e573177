"""One widget layout for every explorer: a control per row, labels of one width, usable tracks.

At a 1,000-px content width (JupyterLab with the file browser open) a 660-px slider keeps a
track of ~340 px beside a 220-px description and its readout; output areas keep a minimum
height so that redrawing them does not make the page jump.
"""
from __future__ import annotations

DESCRIPTION_WIDTH = "220px"
CONTROL_WIDTH = "660px"


def style() -> dict:
    return {"description_width": DESCRIPTION_WIDTH}


def layout(width: str = CONTROL_WIDTH, **more):
    import ipywidgets as w
    return w.Layout(width=width, **more)


def slider(kind: str, description: str, **kwargs):
    """An IntSlider / FloatSlider (kind "int" / "float") with the shared label width and track."""
    import ipywidgets as w
    cls = {"int": w.IntSlider, "float": w.FloatSlider}[kind]
    kwargs.setdefault("continuous_update", False)
    return cls(description=description, style=style(), layout=layout(), **kwargs)


def control(cls, description: str, **kwargs):
    """Any other control (Dropdown, Checkbox, ToggleButtons...) with the shared label width."""
    return cls(description=description, style=style(), layout=layout(), **kwargs)


def output(min_height: str):
    """An Output area that never shrinks below `min_height` while it is redrawn."""
    import ipywidgets as w
    return w.Output(layout=w.Layout(min_height=min_height))


def interact(function, **controls):
    """`ipywidgets.interact` for the workbook's notebooks: every chapter calls this one, so how an
    interactive cell behaves (in JupyterLab, or headless under nbval and nbconvert) is decided here."""
    import ipywidgets as w
    return w.interact(function, **controls)
