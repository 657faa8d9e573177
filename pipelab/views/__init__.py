"""Floor 7, the views: pictures and widgets for everything below (matplotlib and ipywidgets are
imported only when something is drawn).

    plots.py        Gantt, memory and comparison charts (pl.plots); plots_balance.py, plots_sweep.py,
                    plots_fit.py (labels that fit their boxes)
    player.py       the schedule player                predict.py   predict-then-check questions
    explorer.py     pl.explorer: sliders, live runs     compare.py   pl.compare: comparisons + their charts
    widgets.py      notebook 00's training widget       ui.py        widget plumbing that renders under nbval
    memory_bubble.py  memory against bubble for 1F1B, ZB-H1, ZB-V, V-Half, V-Min, with closed forms
"""
