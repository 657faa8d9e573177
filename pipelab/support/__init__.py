"""Floor 0, support: small tools every floor may use and that know nothing of pipelines.

    atomic.py   write a file whole or not at all      threads.py  one torch thread, for timing
    noise.py    pl.noise: paired timings and verdicts  drawers.py  pictures the views draw for
                that say "not resolvable" when a                     lower floors (Timeline.plot)
                busy machine cannot tell
"""
