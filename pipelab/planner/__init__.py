"""Floor 6, the planner: which configuration to run on given devices and memory.

    calibrate.py  measured layer costs              plan.py    pl.plan: the search and ranking
    costs.py      a candidate's cost table           check.py   a plan's prediction against a live run
    candidate.py  pl.Candidate: one configuration and what the planner predicts for it
"""
