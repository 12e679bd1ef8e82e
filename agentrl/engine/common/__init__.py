"""What every wing of the engine shares: the values that cross seams and the plumbing under them.

The per-token trajectory record (``trajectory``), the generator protocol and the ``generate``
seam (``interfaces``), the run's sampling (``sampling``), bounded waits on remote calls
(``waits``), Ray at the engine's edge (``cluster``), telling and replacing a dead actor
(``replacement``), where a process computes (``devices``), the run directory's layout
(``run_dir``), the append-only audit logs (``audit``), an episode as text labelled by weight
version (``episode_text``) and the run's summary (``summary``).

Imports no other wing.
"""
