"""Floor 6, the planner: which configuration to run on given devices and memory.

    plan.py       pl.plan: the search               ranked.py    pl.Plan: ranked, simulated lazily
    mesh.py       p × dp × tp = devices             bound.py     a lower bound on a step's time
    rows.py       a schedule as arrays              peaks.py     activation peaks per rank
    calibrated.py a ModelConfig's costs and bytes    shaped.py    a ModelShape's, on a Device
    calibrate.py  measured layer costs               costs.py     a candidate's calibrated costs
    candidate.py  pl.Candidate: one configuration and what the planner predicts for it
    check.py      a plan's prediction against a live run
"""
