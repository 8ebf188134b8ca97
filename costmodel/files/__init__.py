"""The files people write and the tool writes, below the plan file: cluster files and their
catalog (``clusters``: human units converted once), bounded readers (``readers``), atomic
writes (``safeio``) and the tool's version (``version``).

Its own layer (tests/test_imports.py): it may use the cost model's specs; the cost model's rules
never import it (they stay pure), and it imports nothing above it, so the runtime reads a plan
file without pulling in the profiler. These modules lived in ``profiles`` until stop 19;
``profiles.{clusters,readers,safeio,version}`` still name the same module objects for code
written against the old paths.
"""
