"""Goodput: what a chain spent its allocation on, measured from what the run wrote down.

    account.py        the account itself: inputs -> where every node-second went (pure)
    gather.py         the inputs, read from the work dir and Slurm's accounting
    save_interval.py  the save interval that maximises expected goodput, from the account (pure)
    straggler.py      a slow node: who the others wait for, what it cost, whether replacing pays (pure)
    summary.py        the account as lines for a person (pure)
    picture.py        the account as an SVG picture: timeline, iterations, the bar (pure)

docs/goodput.md says how each category is measured.
"""
