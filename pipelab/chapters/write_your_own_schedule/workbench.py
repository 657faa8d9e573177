"""Write your own schedule: text in, verdict out (notebook 13).

The reader types one line per rank (`0F0 0F1 0B0 …`, the schedule language's text form, read by
`Schedule.from_text`). One call, `attempt`, then does what the rest of the workbook does to a
schedule: validate it (a mistake comes back as the validator's sentence and its grid), simulate
it on the exercise's costs, run it live on real processes and compare every gradient with the
unsplit model, and check the exercise's goal. Mistakes are *answers*, never tracebacks: every
problem is a short text in `Attempt.problem`.

    bench = workbench.Workbench(exercises.EXERCISES[0], cluster=cluster, model=cfg)
    bench                                   # text area, "check" and "show solution" buttons
    att = workbench.attempt(text, exercise, cluster=cluster, model=cfg)
    att.passed, att.problem, att.simulated, att.run
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...schedules import Action, Schedule, ScheduleError
from ...schedules.base import IDLE_MARKS
from ...sim.costs import Costs
from ...sim.simulate import simulate
from ...sim.timeline import Timeline
from ...sim.compare import longest_span
from ...runtime import PipelineTimeout, WorkerError
from ...support.noise import load_line
from ...views import plots, ui

GRAD_TOLERANCE = 1e-5      # float32, relative: the project's bar for every schedule that runs


@dataclass
class Exercise:
    """A task: the shape the schedule must have, the costs it is simulated on, and a goal.

    `goal(attempt)` returns None when the (valid, simulated) attempt meets it, else one sentence
    saying what is still missing."""
    title: str
    task: str
    ranks: int
    microbatches: int
    starter: str
    solution: str
    costs: Costs = field(default_factory=Costs)
    goal: Callable[["Attempt"], str | None] = lambda attempt: None
    hint: str = ""


@dataclass
class Attempt:
    """What became of one text: the schedule it reads as, its simulated and live timelines, and
    the first problem met (None when it validated, ran exactly and met the goal)."""
    text: str
    schedule: Schedule | None = None
    simulated: Timeline | None = None
    run: object | None = None                # a RunResult, when it ran live
    problem: str | None = None
    stage: str = "read"                      # how far it got: read, validate, live, goal, done
    load: str = ""                           # the machine's load when it ran live

    @property
    def passed(self) -> bool:
        return self.problem is None and self.stage == "done"

    def report(self) -> str:
        lines = []
        if self.simulated is not None:
            tl = self.simulated
            peaks = tl.peak_activations()
            lines.append(f"simulated: step {tl.makespan:g}, longest per-rank span "
                         f"{_span(tl):g}, peak activations per rank "
                         f"{[round(peaks[r], 3) for r in range(tl.ranks)]}")
        if self.run is not None:
            lines.append(f"live: loss {self.run.loss:.6f} (unsplit model {self.run.reference_loss:.6f}),"
                         f" largest gradient error {self.run.max_grad_error:.1e}; ran at {self.load}")
        if self.passed:
            lines.append("✔ valid, exact live, goal met")
        else:
            lines.append(f"✘ {self.problem}")
        return "\n".join(lines)


def _span(timeline: Timeline) -> float:
    return longest_span(timeline)


def read(text: str, ranks: int, microbatches: int) -> Schedule:
    """The text as a Schedule of `ranks` lines over microbatches 0..m−1, stage r on rank r.
    Raises ValueError (unreadable text, wrong number of lines) or ScheduleError (invalid)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"write one line per rank ({ranks} lines), e.g. `0F0 0F1 0B0 0B1`")
    lines = [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if len(lines) != ranks:
        raise ValueError(f"this exercise has {ranks} ranks: write {ranks} lines, one per rank "
                         f"(found {len(lines)})")
    try:
        sched = Schedule.from_text(text, placement=list(range(ranks)), microbatches=microbatches,
                                   name="yours")
    except ValueError as error:
        raise ValueError(_with_line(str(error), lines)) from None
    return sched.validate()


def _with_line(message: str, lines: list[str]) -> str:
    """The parser names the action it could not read, not where it is: add its line (the reader
    sees a grid), and for a lower-case kind the fix. Other complaints pass through."""
    for number, line in enumerate(lines, 1):
        for token in line.split(":", 1)[-1].replace(",", " ").split():
            if token not in IDLE_MARKS and _parse_error(token) == message:
                fix = "" if _parse_error(token.upper()) else \
                    f" (kinds are capital letters: {token.upper()})"
                return f"line {number}: {message}{fix}"
    return message


def _parse_error(token: str) -> str | None:
    try:
        Action.parse(token)
    except ValueError as error:
        return str(error)
    return None


def attempt(text: str, exercise: Exercise | None = None, *, ranks: int | None = None,
            microbatches: int | None = None, costs: Costs | None = None, cluster=None,
            model=None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> Attempt:
    """Read, validate, simulate, run live (when `cluster` is given) and check the goal.

    Shape and costs come from `exercise`, or from `ranks`, `microbatches` and `costs` for free
    play. `progress(step)` is told each step as it starts ("validating", "simulating",
    "running live on 3 processes", "checking the goal"). Never raises for a mistake in the text
    or the run: see `Attempt.problem`."""
    say = progress or (lambda _step: None)
    if exercise is not None:
        ranks, microbatches = exercise.ranks, exercise.microbatches
        costs = exercise.costs
    if ranks is None or microbatches is None:
        raise ValueError("attempt needs an exercise, or ranks= and microbatches=")
    out = Attempt(text)
    say("reading and validating")
    try:
        out.schedule = read(text, ranks, microbatches)
    except ScheduleError as error:
        out.stage, out.problem = "validate", f"the schedule cannot run as written: {error}"
        return out
    except ValueError as error:
        out.problem = f"cannot read it: {error}"
        return out
    out.stage = "validate"
    say("simulating")
    try:
        out.simulated = simulate(out.schedule, costs or Costs(), source="simulated")
    except ValueError as error:          # e.g. per-stage costs for fewer stages than written
        out.problem = f"cannot simulate it: {error}"
        return out
    if cluster is not None:
        out.stage = "live"
        if cluster.ranks == out.schedule.ranks and not cluster.pids:
            # Closed (the notebook's last cell closes it): the run restarts the workers once,
            # which takes seconds on a busy machine; they stay up for the checks after this one.
            say(f"starting {cluster.ranks} worker processes again (the cluster was closed; "
                f"once only, they stay up for the next checks)")
            cluster.start()
        say(f"running live on {cluster.ranks} processes and comparing every gradient")
        problem = _run_live(out, cluster, model, seed)
        if problem:
            out.problem = problem
            return out
    out.stage = "goal"
    say("checking the goal")
    missing = exercise.goal(out) if exercise is not None else None
    if missing:
        out.problem = f"valid{' and exact live' if out.run else ''}, but not there yet: {missing}"
        return out
    out.stage = "done"
    return out


def _run_live(out: Attempt, cluster, model, seed: int) -> str | None:
    """Run the attempt on the cluster; a failure or a wrong gradient becomes one sentence."""
    if cluster.ranks != out.schedule.ranks:
        return (f"the cluster has {cluster.ranks} ranks and the schedule {out.schedule.ranks}: "
                f"start a LocalCluster(ranks={out.schedule.ranks})")
    try:
        out.run = cluster.run(out.schedule, model=model, seed=seed)
        out.load = load_line()
    except (PipelineTimeout, WorkerError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"the live run stopped: {first}"
    if not out.run.max_grad_error <= GRAD_TOLERANCE:
        return (f"it ran, but the gradients differ from the unsplit model's by "
                f"{out.run.max_grad_error:.1e} (more than {GRAD_TOLERANCE:g})")
    return None


class Workbench:
    """The widget: the task, a text area with one line per rank, "check" (validate, simulate,
    draw, run live, compare gradients, check the goal) and "show solution".

    `check()` and `show_solution()` are what the buttons call; `last` is the last Attempt."""

    def __init__(self, exercise: Exercise, cluster=None, model=None, seed: int = 0):
        import ipywidgets as w
        self.exercise, self.cluster, self.model, self.seed = exercise, cluster, model, seed
        self.last: Attempt | None = None
        self.text = w.Textarea(value=exercise.starter.strip() + "\n",
                               layout=w.Layout(width="880px", height=f"{2 + 1.6 * exercise.ranks}em"))
        self.text.add_class("pipelab-schedule-text")     # monospace: the ranks' actions align
        self.check_button = w.Button(description="check", button_style="primary",
                                     tooltip="validate, simulate, draw, run live, compare gradients")
        self.solution_button = w.Button(description="show solution")
        self.output = ui.output("120px")
        # What the check is doing right now: a live run takes seconds, and the last verdict must
        # not stand on screen meanwhile as if it were the answer to the new text.
        self.status = w.HTML("")
        self.status.add_class("pipelab-workbench-status")
        self.solution = w.HTML("")           # empty until asked for
        self.check_button.on_click(lambda _b: self.check())
        self.solution_button.on_click(lambda _b: self.show_solution())
        header = w.HTML(f"<b>{exercise.title}</b><br>{exercise.task}"
                        + (f"<br><i>hint: {exercise.hint}</i>" if exercise.hint else ""))
        mono = w.HTML("<style>.pipelab-schedule-text textarea {font-family: monospace}</style>")
        self.widget = w.VBox([mono, header, self.text,
                              w.HBox([self.check_button, self.solution_button, self.status]),
                              self.output, self.solution])
        self.widget.add_class("pipelab-workbench")

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)

    def _say(self, step: str) -> None:
        self.status.value = f"<span style='color:#555'>⏳ checking: {step}…</span>"

    def check(self) -> Attempt:
        """Check the text: the verdict in the status line, the pictures and the report below it.
        An unexpected error (not a mistake in the text) is shown there too, then raised."""
        # Clear at once (the last verdict must not stand while a live run takes seconds) and
        # say that a check is under way. Setting `outputs` clears in the kernel; the widget's
        # own clear_output() would route through the front end, which can hang a headless run.
        self._say("starting")
        self.output.outputs = ()
        self.check_button.disabled = True
        failure: list[Exception] = []

        def check_and_show() -> Attempt:
            try:
                return self._check_and_show()
            except Exception as error:
                failure.append(error)
                raise

        try:
            # Rendered in the kernel and shown in one update (ui.render): notebook 13 calls
            # check() in a cell, and nbconvert/nbval must not wait on an Output-widget echo.
            att = ui.render(self.output, check_and_show)
        finally:
            self.check_button.disabled = False
        if failure:
            self.status.value = "<span style='color:#c62828'>✘ the check failed: see below</span>"
            raise failure[0]
        return att

    def _check_and_show(self) -> Attempt:
        import matplotlib.pyplot as plt
        att = attempt(self.text.value, self.exercise, cluster=self.cluster,
                      model=self.model, seed=self.seed, progress=self._say)
        self.last = att
        self.status.value = ("<span style='color:#2e7d32'>✔ passed</span>" if att.passed else
                             "<span style='color:#c62828'>✘ not yet: see below</span>")
        if att.simulated is not None:
            panels, titles = [att.simulated], ["your schedule — simulated (exercise costs)"]
            if att.run is not None:
                panels.append(att.run.timeline)
                titles.append("your schedule — measured live")
            plots.compare(panels, titles=titles, memory=True, share=False)
            plt.show()
        print(att.report())
        return att

    def show_solution(self) -> None:
        from html import escape
        self.solution.value = ("one solution (others exist):<pre>"
                               f"{escape(self.exercise.solution.strip())}</pre>")
