"""Tracking a sweep while it runs and after: its MLflow records (``records``: the parent run and
its children), the watch over its jobs (``watch``), the runs warm workers hand off (``handoff``),
a grid's points started before the store is open (``ahead``), the report drawn while points run
(``early_report``), points timed again alone at the end (``retime``), each point's outcome and
the parent's end (``collect``), the server away, the report from the journals
(``offline_report``), and the sweep's state in its folder for ``sweeper.status`` (``sweep_file``).

Imports ``plan``, ``runners`` (the protocol), ``job``, ``report``, the sweeper's leaves and the
trainer's record wing; only ``search`` and the doors import it.
"""
