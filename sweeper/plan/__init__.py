"""From Hydra's expanded points to what runs: each point's trainer config, validated once, and its
resource shape (``shapes``: points of one shape share a job array on Slurm, a queue locally), and
each point's folder written before it is submitted (``point_files``).

Imports the sweeper's leaves (``points``, ``config``, ``display``), ``job`` (the job a point's
folder names) and the trainer's contracts; nothing of ``track``, ``search`` or the doors.
"""
