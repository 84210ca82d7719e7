"""Whether a run may start now: execution slots and the daily token budgets.

::

    slots.py    slots, a bounded FIFO queue, a per-principal cap
    budgets.py  token budgets per principal and per agent, per UTC day
"""
