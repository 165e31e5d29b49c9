"""benchmarks/overhead: the breakdown variants (ours-without-<default>), the cost table paired per round,
and --callback-cpu (the training thread's CPU inside each hook). Seconds-long runs, not measurements."""

import sys

from patience import patience

from benchmarks import common, overhead


def test_without_a_default_runs_the_defaults_minus_it_and_callback_cpu_times_the_hooks():
    cmd = [sys.executable, "-m", "benchmarks.overhead", "--child", "ours,ours-without-Rank0Logger",
           "--workload", "mlp", "--steps", "30", "--warmup", "5", "--callback-cpu"]
    results = common.run_child(cmd, timeout=patience(240), all_results=True)
    ours, without = results
    assert "Rank0Logger" in ours["callbacks"] and "Rank0Logger" not in without["callbacks"]
    assert set(ours["callbacks"]) - set(without["callbacks"]) == {"Rank0Logger"}
    assert ours["param_checksum"] == without["param_checksum"]  # the logger changes nothing that is trained
    hooks = ours["callback_ms_per_step"]
    assert hooks["Rank0Logger.on_log"] > 0 and hooks["NaNGuard.on_log"] > 0
    assert "Rank0Logger.on_step_end" not in hooks  # no bar here (stderr is a pipe): not dispatched
    assert "NaNGuard.on_optimizer_step_begin" not in hooks  # the default guard has nothing to do there
    for r in results:
        r["round"], r["load1"] = 0, 0.0
    text = overhead.callback_cpu_report({"mlp": [ours]}, {"cores": 2})
    assert "| Rank0Logger.on_log |" in text and "| all hooks |" in text and "µs per logging step" in text


def _result(variant, round_, ms, cpu=None):
    cpu = ms if cpu is None else cpu
    return {"variant": variant, "round": round_, "ms_per_step": ms, "cpu_ms_per_step": cpu, "best_slice_ms": ms}


def test_the_cost_table_pairs_each_variant_with_its_base_in_the_same_round():
    results = []
    for round_, noise in enumerate((0.0, 1.0, 2.0)):  # a slower machine each round: pairing cancels it
        results += [_result("bare", round_, 1.0 + noise), _result("ours", round_, 1.2 + noise),
                    _result("ours-without-Rank0Logger", round_, 1.15 + noise), _result("ours-quiet", round_, 1.1 + noise),
                    _result("ours-quiet+EarlyStopping", round_, 1.13 + noise)]
    costs = {c["callback"]: c for c in overhead.callback_costs(results)}
    assert abs(costs["Rank0Logger"]["ms"] - 0.05) < 1e-9 and costs["Rank0Logger"]["measured_as"].endswith("vs ours")
    assert abs(costs["EarlyStopping"]["ms"] - 0.03) < 1e-9 and costs["EarlyStopping"]["rounds"] == 3
    assert abs(costs["Rank0Logger"]["share"] - 0.05 / 2.0) < 1e-9  # median round: bare 2.0 ms
    text = overhead.cost_table(list(costs.values()))
    assert "| Rank0Logger | ours-without-Rank0Logger vs ours | +0.0500 | +2.5% |" in text
