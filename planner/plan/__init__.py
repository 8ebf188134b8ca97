"""The plan file and what reading one needs: ``planfile`` (schema, read, write), ``check`` (a
plan checked against the cost model), ``errors`` (the error types and their exit codes),
``inputs`` (model and cluster arguments to specs). Imports ``costmodel`` and ``profiles`` only;
the emitters and the runtime read plans through this package and nothing else of the planner."""
