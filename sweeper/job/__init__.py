"""What runs inside a point's job, and what its end says: ``point_job`` (a cold job's point, a
warm worker's queue, their requeue and cancellation), ``mpich_shm`` (MPICH's shared-memory
segments a killed rank leaves) and ``job_end`` (a job's end in words, from its files).

Imports the sweeper's leaves and the trainer; the runners, ``plan`` and ``track`` import it.
"""
