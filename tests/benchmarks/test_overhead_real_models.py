"""benchmarks/overhead on the real models (ERNIE-style, ResNet-50): every loop trains the same thing, the
one-time set-up is reported apart from the per-step CPU, and the table pairs each round with its bare loop.
A few steps each, not measurements."""

import sys

from patience import patience

from benchmarks import common, overhead


def _run(workload, variants):
    cmd = [sys.executable, "-m", "benchmarks.overhead", "--child", ",".join(variants), "--workload", workload,
           "--steps", "2", "--warmup", "1"]
    return common.run_child(cmd, timeout=patience(300), all_results=True)


def test_ernie_and_resnet50_loops_train_the_same_thing_with_the_set_up_apart():
    for workload, variants in (("ernie", ("bare", "ours", "paddlenlp")), ("resnet50", ("bare", "ours-quiet", "hapi"))):
        results = _run(workload, variants)
        assert [r["variant"] for r in results] == list(variants)
        assert len({r["param_checksum"] for r in results}) == 1, results  # same batches, same updates
        assert len({r["final_loss"] for r in results}) == 1, results
        for r in results:
            assert r["steps"] == 2 and r["cpu_ms_per_step"] > 0, r
            # from building the loop to the end of its first step: more than the CPU of one measured step would
            # be only by luck; what it must be is the sum of the two parts the report shows
            assert r["setup_s"] > 0 and r["setup_cpu_s"] > 0, r
            assert abs(r["setup_extra_cpu_s"] - (r["setup_cpu_s"] - r["cpu_ms_per_step"] / 1e3)) < 1e-9
            # two clocks read one after the other: a few µs of skew either way
            assert -0.05 < r["other_threads_cpu_ms_per_step"] < r["cpu_ms_per_step"]
        for r in results:
            r["round"], r["load1"] = 0, 0.0
        text = overhead.report({workload: results}, {"cores": 2, "paddle": "x"})
        assert "| variant | CPU ms/step | CPU ratio to bare |" in text and "one-time set-up CPU s" in text
        assert f"| {variants[1]} |" in text and f"| {variants[2]} |" in text
        assert "x the bare loop's over the whole window" in text  # the verdict against the 0.5% target


def _result(variant, round_, cpu):
    return {"variant": variant, "round": round_, "steps_per_s": 1e3 / cpu, "ms_per_step": cpu, "cpu_ms_per_step": cpu,
            "best_slice_ms": cpu, "best_slice_cpu_ms": cpu, "peak_rss_mb": 100.0, "final_loss": 0.5,
            "param_checksum": 1.0, "import_s": 1.0, "paddlenlp_imported": False, "setup_s": 2.0, "setup_cpu_s": 1.5,
            "setup_extra_cpu_s": 1.5 - cpu / 1e3, "other_threads_cpu_ms_per_step": 0.1}


def test_the_cpu_ratio_is_paired_per_round_and_judged_against_half_a_percent():
    results = []
    for round_, slower in enumerate((1.0, 1.3, 1.6)):  # a busier machine each round: pairing cancels it
        results += [_result("bare", round_, 400 * slower), _result("ours", round_, 401 * slower),
                    _result("ours-quiet", round_, 404 * slower)]
    rows = {r["variant"]: r for r in overhead.summarize(results, ["bare", "ours", "ours-quiet"])}
    assert abs(rows["ours"]["cpu_ratio"] - 401 / 400) < 1e-12 and abs(rows["ours-quiet"]["cpu_ratio"] - 1.01) < 1e-12
    verdicts = overhead.real_model_verdicts(list(rows.values()))
    assert verdicts[0].startswith("- ours: CPU per step 1.0025x") and verdicts[0].endswith(": met")
    assert verdicts[1].startswith("- ours-quiet: CPU per step 1.0100x") and verdicts[1].endswith(": MISSED")
    assert "| ours | 521.3 | 1.0025 | 1.0025 | 0.10 |" in overhead.real_model_table(list(rows.values()))
