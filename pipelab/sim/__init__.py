"""Floor 3, the simulator: what a schedule costs, without running it.

    simulate.py     pl.Costs and pl.simulate        timeline.py   pl.Timeline: events, bubbles,
    tensor_overlap.py  the tensor-parallel all-reduce              critical path, memory curve
    partition.py    stage splitting, priced as Costs   compare.py    schedules side by side
    link.py         pl.Link: an emulated link's latency and bandwidth

Imports the model and the schedule language; never the runtime, a technique or a view (a
Timeline's `.plot()` asks support/drawers.py for the picture the views registered).
"""
