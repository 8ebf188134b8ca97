"""The search: ``space`` (the legal outer configurations), ``problem`` (a problem, its per-stage
tables and result types), ``bounds`` (valid lower bounds), ``cpsat`` (one candidate's pipeline as
a CP-SAT model), ``bnb`` (branch and bound over the candidates: ``solve``), ``replan`` (a new plan
for a changed cluster), ``serving_space`` and ``serving`` (the serving search). Imports
``costmodel``, ``profiles`` and ``planner.plan`` only."""
