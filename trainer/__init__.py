"""sweepscale's trainer: a data-parallel two-layer MLP on MPI ranks, checked and recorded."""
