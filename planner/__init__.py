"""The planner, in three layers with dependencies pointing one way (``tests/test_imports.py``):

* ``planner.plan``   -- the plan file (schema, read, write, check), the error types, reading model
  and cluster inputs; imports ``costmodel`` and ``profiles``.
* ``planner.search`` -- the space, the bounds, the CP-SAT models, branch and bound, replanning and
  the serving search; imports ``planner.plan`` and below.
* ``planner.cli``    -- the ``planner`` command (``cmd_*``), its flags, printing and reports, and
  the maintenance scripts; the only part that imports ``emitters`` and ``runtime``.
"""
