"""One widget layout for every explorer: a control per row, labels of one width, usable tracks.

At a 1,000-px content width (JupyterLab with the file browser open) a 660-px slider keeps a
track of ~340 px beside a 220-px description and its readout; output areas keep a minimum
height so that redrawing them does not make the page jump.
"""
from __future__ import annotations

import functools

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
    interactive cell behaves (in JupyterLab, or headless under nbval and nbconvert) is decided here.

    Controls are given as in ipywidgets (a widget, or an abbreviation such as `(0, 10)`). The
    widget is displayed and the function drawn once with the controls' values; its output is
    rendered in the kernel (`render`), so a headless executor has nothing to wait for. Returns
    `function`, with the widget as `function.widget` (as ipywidgets does)."""
    from IPython.display import display
    widget = _interactive_class()(function, **controls)
    for control_widget in widget.kwargs_widgets:
        control_widget.add_class(CONTROL_CLASS)
    front_busy_sign()
    display(widget)
    try:
        function.widget = widget
    except AttributeError:           # a bound method or a builtin takes no attributes
        pass
    return function


# --- interactive output that cannot hang a headless executor -----------------------------------
#
# ipywidgets' `interact` and `interactive_output` capture a function's output with `with out:`,
# which asks the *front end* to route display messages into the Output widget. Headless
# executors (nbclient, hence `jupyter nbconvert --execute`) mimic that front end: for every
# captured output they send a comm message back to the kernel on the shell socket while another
# task is blocked reading the execute reply from that same socket. Under load the reply's wake-up
# is sometimes lost and the executor waits forever (nbclient issue #312) although the kernel is
# idle. Here the function's outputs are collected in the kernel, in order, and set as the Output
# widget's `outputs` state in one update: no display routing, nothing for a client to echo back,
# and the same picture in JupyterLab (one update per redraw, so no flicker either).


class _Stream:
    """A file-like sink for sys.stdout / sys.stderr that appends stream outputs to `outputs`,
    merging consecutive writes to the same stream."""

    def __init__(self, name: str, outputs: list, echo=None):
        self.name, self.outputs, self.echo = name, outputs, echo

    def write(self, text: str) -> int:
        if self.echo is not None:
            self.echo.write(text)
        if text:
            last = self.outputs[-1] if self.outputs else None
            if last is not None and last["output_type"] == "stream" and last["name"] == self.name:
                last["text"] += text
            else:
                self.outputs.append({"output_type": "stream", "name": self.name, "text": text})
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _jsonable(data: dict) -> dict:
    """Display data as the Output widget's state holds it: bytes (a PNG) as base64 text."""
    import base64
    out = {}
    for mime, value in data.items():
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii") if mime.startswith("image/") \
                else value.decode("utf-8", "replace")
        out[mime] = value
    return out


def _publisher(outputs: list):
    """A display publisher (IPython's DisplayPublisher API) appending display_data to `outputs`;
    clear_output() empties them, as it would clear the widget."""
    from IPython.core.displaypub import DisplayPublisher

    class Collect(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False):
            shown = {"output_type": "display_data", "data": _jsonable(data),
                     "metadata": metadata or {}}
            key = (transient or {}).get("display_id")
            if key is not None:       # a display updated in place (a progress line): kept once
                shown["transient"] = {"display_id": key}
                at = [k for k, o in enumerate(outputs) if o.get("transient") == shown["transient"]]
                if at:
                    outputs[at[0]] = shown
                    return
            outputs.append(shown)

        def clear_output(self, wait=False):
            outputs.clear()

    return Collect()


def collect_outputs(function, *args, **kwargs) -> tuple[list[dict], object]:
    """Call `function` and return (its outputs in order, as Output-widget output dicts; its
    result). Prints, displays (inline matplotlib figures included) and an exception's traceback
    are collected; nothing reaches the cell or the front end."""
    import contextlib
    import sys
    import traceback

    outputs: list[dict] = []
    shell = _shell()
    saved_pub = shell.display_pub if shell is not None else None
    result = None
    # Outside IPython there is no front end and no cell: the text also goes on to the real
    # streams, as ipywidgets' Output passes it through there (scripts and tests read it).
    echo_out, echo_err = (None, None) if shell is not None else (sys.stdout, sys.stderr)
    with contextlib.redirect_stdout(_Stream("stdout", outputs, echo_out)), \
            contextlib.redirect_stderr(_Stream("stderr", outputs, echo_err)):
        if shell is not None:
            shell.display_pub = _publisher(outputs)
        try:
            result = function(*args, **kwargs)
            _flush_inline_figures()
        except Exception as error:      # shown in the widget, as ipywidgets' interact shows it
            if shell is not None:
                lines = shell.InteractiveTB.structured_traceback(*sys.exc_info())
            else:
                lines = traceback.format_exception(error)
            outputs.append({"output_type": "error", "ename": type(error).__name__,
                            "evalue": str(error), "traceback": list(lines)})
        finally:
            if shell is not None:
                shell.display_pub = saved_pub
    # a progress line erased at its end leaves nothing behind; the others keep their last text
    outputs = [{k: v for k, v in o.items() if k != "transient"} for o in outputs
               if "transient" not in o or o["data"].get("text/html", None) != ""]
    return outputs, result


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _flush_inline_figures() -> None:
    """Show figures the function made but did not show (what the inline backend would do at the
    end of a cell), as ipywidgets' interact does."""
    from ipywidgets.widgets.interaction import show_inline_matplotlib_plots
    show_inline_matplotlib_plots()


def text_of(out) -> str:
    """The text an Output widget shows: its stdout and stderr outputs, in order."""
    return "".join(o.get("text", "") for o in out.outputs if o.get("output_type") == "stream")


# --- the busy sign ----------------------------------------------------------------------------
#
# A redraw can take seconds on a busy machine (09b's race: 3 s at load 8): without a sign the
# old picture looks like the answer. The sign is sent before the redraw starts (the kernel runs
# one thing at a time: once drawing, it cannot say anything until done): the output gets the CSS
# class BUSY_CLASS and a first line "⏳ working… (p = 5)" above the old picture, both replaced by
# the new outputs.

BUSY_CLASS = "pipelab-busy"
BUSY_TEXT = "⏳ working…"


def _moved(change) -> str:
    """"ranks p = 5" for a control's change (what the learner just did), "" for none."""
    if not isinstance(change, dict) or "owner" not in change:
        return ""
    label = getattr(change["owner"], "description", "") or "value"
    return f"{label} = {change.get('new')!r}".replace("'", "")


def show_busy(out, change=None) -> None:
    """Mark the Output widget `out` busy at once: BUSY_CLASS and a "⏳ working…" line above
    what it shows (the next `render` replaces both)."""
    moved = _moved(change)
    sign = {"output_type": "stream", "name": "stdout",
            "text": f"{BUSY_TEXT} redrawing{' for ' + moved if moved else ''}\n"}
    kept = tuple(o for o in out.outputs if not str(o.get("text", "")).startswith(BUSY_TEXT))
    out.add_class(BUSY_CLASS)
    out.outputs = (sign,) + kept


def is_busy(out) -> bool:
    return BUSY_CLASS in out._dom_classes


# The kernel's sign waits for the kernel: at a load of 12-17 on 2 cores the change message took
# 1.7 s to reach it. This script (run once per page, where the browser runs a trusted output's
# JavaScript, as JupyterLab does) shows the sign in the page itself the moment a control of an
# explorer (class CONTROL_CLASS) is moved by key or pointer: on the Output beside it, until the
# kernel's outputs replace it (or 2 s pass and nothing changed: a move that changed no value).
CONTROL_CLASS = "pipelab-control"
FRONT_SIGN = """(() => {
  if (window.__pipelabBusy) return; window.__pipelabBusy = true;
  const KEYS = ['ArrowLeft','ArrowRight','ArrowUp','ArrowDown','Home','End','PageUp','PageDown'];
  function mark(target) {
    const control = target.closest && target.closest('.%(control)s');
    if (!control) return;
    const box = control.parentElement;
    const out = box && [...box.children].find(c => c.classList.contains('widget-output'));
    if (!out || out.querySelector(':scope > .pipelab-busy-sign')) return;
    const sign = document.createElement('div');
    sign.className = 'pipelab-busy-sign';
    sign.textContent = '%(text)s redrawing';
    sign.style.cssText = 'font-family: monospace; padding: 2px 0; color: #a05a00';
    out.classList.add('%(busy)s');
    out.prepend(sign);
    const done = () => { sign.remove(); observer.disconnect(); };
    const observer = new MutationObserver(ms => {
      if (ms.some(m => [...m.addedNodes].some(n => n !== sign))) done(); });
    observer.observe(out, {childList: true, subtree: true});
    setTimeout(() => { if (sign.isConnected) { done(); out.classList.remove('%(busy)s'); } }, 2000);
  }
  document.addEventListener('keydown', e => { if (KEYS.includes(e.key)) mark(e.target); }, true);
  document.addEventListener('pointerup', e => mark(e.target), true);
})();""" % {"control": CONTROL_CLASS, "text": BUSY_TEXT, "busy": BUSY_CLASS}


def front_busy_sign() -> None:
    """Display the page's own busy sign (FRONT_SIGN) once per kernel: an explorer calls it."""
    from IPython.display import Javascript, display
    if _shell() is not None:
        display(Javascript(FRONT_SIGN))


def render(out, function, *args, **kwargs):
    """Replace the Output widget `out`'s content with what `function(*args, **kwargs)` outputs;
    return its result."""
    outputs, result = collect_outputs(function, *args, **kwargs)
    out.outputs = tuple(outputs)
    if is_busy(out):
        out.remove_class(BUSY_CLASS)
    return result


def interactive_output(function, controls: dict):
    """`ipywidgets.interactive_output` that cannot hang a headless run: an Output widget redrawn
    with `function(**values)` now and whenever a control in `controls` ({name: widget}) moves."""
    import ipywidgets as w
    out = w.Output()

    def redraw(change=None) -> None:
        if change is not None:
            show_busy(out, change)        # before the redraw: it may take seconds
        _flush_inline_figures()           # figures of the cell itself go to the cell, not here
        render(out, function, **{name: c.value for name, c in controls.items()})

    for control_widget in controls.values():
        control_widget.observe(redraw, names="value")
        control_widget.add_class(CONTROL_CLASS)
    front_busy_sign()
    redraw()
    return out


def slider_box(controls: dict, draw, min_height: str = "520px"):
    """Show the controls, one per row, above an output that `draw(**values)` fills now and at
    every move (rendered in the kernel: no headless hang). The output keeps its height while it
    is redrawn (a refused setting prints one line instead of the charts: the page must not
    jump). Returns the box; `box.controls` and `box.out` are for tests."""
    import ipywidgets as w
    from IPython.display import display
    out = interactive_output(draw, controls)
    out.layout.min_height = min_height
    box = w.VBox([*controls.values(), out])
    box.controls, box.out = controls, out
    display(box)
    return box


@functools.cache
def _interactive_class():
    import ipywidgets as w

    class Interactive(w.interactive):
        """ipywidgets' `interactive` (controls built from abbreviations, then the output) whose
        output is rendered kernel-side by `render`."""

        def update(self, *args) -> None:
            if args:                      # a control moved (not the first draw): say so first
                show_busy(self.out, args[0])
            _flush_inline_figures()
            self.kwargs = {c._kwarg: c.get_interact_value() for c in self.kwargs_widgets}
            self.result = render(self.out, self.f, **self.kwargs)

    return Interactive
