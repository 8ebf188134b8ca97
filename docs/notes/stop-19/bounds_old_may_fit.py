"""Run the bound property test against the _may_fit of before (main at e8bef21), copied here."""
import sys
sys.path.insert(0, "tests")
from costmodel.layers import ends_params
from costmodel.memory import model_state_bytes
from planner.search import bounds
import test_bound_property as t


def old_may_fit(prob, cand, moe_frac):
    par = cand.par
    L, p = prob.model.layers, par.pp
    for g in prob.groups(cand):
        sm = prob.stage_model_for(cand, g, min(1, p - 1))
        n = L / p
        c = sm.cost(n * (1 - moe_frac), n * moe_frac, n)
        ends = (ends_params(prob.model, par.tp, p, True, False).total
                + ends_params(prob.model, par.tp, p, False, True).total) / p
        ends_b = model_state_bytes(ends, par.dp_shard, par.zero, prob.workload.dtype, prob.workload.optimizer).total
        if c.states_bytes + ends_b + sm.reserved_bytes <= sm.capacity_bytes:
            return True
    return False


if len(sys.argv) > 1 and sys.argv[1] == "old":
    bounds._may_fit = old_may_fit
st = t.run_property()
print(f"instances {st.instances}, memory-tight {st.tight}, candidates {st.candidates} "
      f"({st.feasible} feasible), checks {st.checks}, violations {len(st.failures)}")
print(st.covered)
kinds = {}
for f in st.failures:
    k = f.split(": ", 1)[1].split(" ")[0]
    kinds[k] = kinds.get(k, 0) + 1
print(kinds)
print("\n".join(st.failures[:5]))
