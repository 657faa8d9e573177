"""Floor 3, the simulator: what a schedule costs, without running it.

    costs.py        pl.Costs: a rank's worth of layers  simulate.py  pl.simulate
                    (divided over a schedule's stages),  timeline.py  pl.Timeline: events, bubbles,
                    or Costs.per_stage as given                       critical path, memory curve
    tensor_overlap.py  the tensor-parallel all-reduce  compare.py   schedules side by side
    partition.py    stage splitting, priced per stage  link.py      pl.Link: an emulated link
    flops.py        a GPT layer's FLOPs and bytes      device.py    pl.Device: FLOP/s, links, memory
    shape.py        Costs.from_shape: per-stage costs and bytes of a model shape on a device

Imports the model and the schedule language; never the runtime, a technique or a view (a
Timeline's `.plot()` asks support/drawers.py for the picture the views registered).
"""
