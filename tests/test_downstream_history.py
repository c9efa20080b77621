"""Downstream records as history (quick: no training, no Ray): each trial counted once, scores grouped
by the settings that change them, the learning rate chosen on validation once per curve and the score
reported on test, one rule for a score that is not a number, and the paired verdict of `compare`.
Records are written by the sweep's own writer (sweep.record); every figure is counted here again."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as sps

from tests.test_report import make_run
from tpu_ray.downstream.finetune import FinetuneSpec
from tpu_ray.downstream.history import best, scores, trials
from tpu_ray.downstream.sweep import Summary, Trial, record
from tpu_ray.report import load_metrics, text_summary

pytestmark = pytest.mark.quick
TASK = "builtin:stdlib-packages"
QUICK = FinetuneSpec(epochs=1, max_train_examples=64)


def _trial(seed, lr, val, test=None, status="ok"):
    if status != "ok":
        return Trial(seed=seed, learning_rate=lr, status="failed", error="boom")
    scores_ = {"validation": {"accuracy": val}}
    if test is not None:
        scores_["test"] = {"accuracy": test}
    return Trial(seed=seed, learning_rate=lr, result={"scores": scores_, "best_epoch": 1, "train_examples": 10,
                                                      "examples_per_s": 1.0, "final_loss": 0.5,
                                                      "truncated_share": 0.0, "max_length": 128})


def _record(run, trials_, step=500, spec=None, model="m1", task_hash="h" * 64, split="test", task=TASK, lineage=""):
    spec = spec or FinetuneSpec()
    record(str(run), Summary(task=task, task_hash=task_hash, step=step, trials=trials_, metric="accuracy",
                             chance=0.3, report_split=split, model=model, settings=spec.settings(),
                             settings_key=spec.settings_key(), lineage=lineage))


def test_a_sweep_recorded_twice_counts_each_seed_once(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    sweep = [_trial(s, 1e-3, v, v - 0.05) for s, v in enumerate([0.5, 0.6, 0.7])]
    _record(run, sweep)
    _record(run, [_trial(s, 1e-3, v + 0.2, v) for s, v in enumerate([0.5, 0.6, 0.7])])  # the same trials again
    row = best(load_metrics(str(run))).iloc[0]
    assert row["seeds"] == 3  # not 6
    expected = [0.45, 0.55, 0.65]  # the first record of each trial: the one its sweep reported
    assert row["mean"] == pytest.approx(statistics.fmean(expected))
    assert row["sd"] == pytest.approx(statistics.stdev(expected))


def test_a_failed_trial_run_again_counts_its_finished_record(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    _record(run, [_trial(0, 1e-3, 0.5, 0.4), _trial(1, 1e-3, None, status="failed")])
    _record(run, [_trial(1, 1e-3, 0.7, 0.6)])
    row = best(load_metrics(str(run))).iloc[0]
    assert (row["seeds"], row["failed"]) == (2, 0) and row["mean"] == pytest.approx(0.5)


def test_sweeps_with_other_settings_are_never_averaged_together(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    _record(run, [_trial(s, 1e-3, 0.9, 0.9 + s / 100) for s in range(3)])
    _record(run, [_trial(s, 1e-3, 0.3, 0.31) for s in range(2)], spec=QUICK)
    table = best(load_metrics(str(run)))
    assert sorted(table["seeds"]) == [2, 3]
    assert sorted(round(m, 4) for m in table["mean"]) == [0.31, 0.91]
    assert text_summary(str(run)).count(f"{TASK} at step 500") == 2


def test_the_learning_rate_is_chosen_on_validation_and_the_test_score_reported(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    # lr 1e-3 is best on validation, 3e-4 would be best on test: the test figure of 1e-3 is reported
    _record(run, [_trial(s, 1e-3, 0.80, 0.60 + s / 100) for s in range(3)]
            + [_trial(s, 3e-4, 0.70, 0.75) for s in range(3)])
    row = best(load_metrics(str(run))).iloc[0]
    assert row["learning_rate"] == 1e-3 and row["split"] == "test"
    assert row["mean"] == pytest.approx(0.61) and row["val_mean"] == pytest.approx(0.80)
    text = text_summary(str(run))
    assert f"test accuracy 0.6100 ± {statistics.stdev([0.60, 0.61, 0.62]):.4f} (3 seeds, lr 0.001; validation " \
           f"0.8000, the lr chosen on it" in text


def test_one_learning_rate_is_chosen_for_a_curve_not_one_per_step(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    # step 100: 1e-3 wins by a hair; step 200: 3e-4 wins by a hair; over both 1e-3 is better on average
    _record(run, [_trial(s, 1e-3, 0.70, 0.5) for s in range(2)] + [_trial(s, 3e-4, 0.69, 0.9) for s in range(2)],
            step=100, model="m100")
    _record(run, [_trial(s, 1e-3, 0.795, 0.5) for s in range(2)] + [_trial(s, 3e-4, 0.80, 0.9) for s in range(2)],
            step=200, model="m200")
    table = best(load_metrics(str(run)))
    assert list(table["learning_rate"]) == [1e-3, 1e-3]


def test_a_score_that_is_not_a_number_fails_the_trial_in_the_summary_and_the_history_alike(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    sweep = [_trial(0, 1e-3, 0.9, float("nan")), _trial(1, 1e-3, 0.5, 0.5), _trial(2, 1e-3, 0.6, 0.6)]
    # the trial itself fails such a trial (finetune_trial raises); a record that holds one anyway counts
    # as failed here, as Summary leaves it out
    _record(run, sweep)
    summary = Summary(task=TASK, task_hash="h", step=None, trials=sweep, metric="accuracy", chance=None,
                      report_split="test")
    row = best(load_metrics(str(run))).iloc[0]
    assert (row["seeds"], row["failed"]) == (2, 1)
    assert summary.stats(1e-3, "test")[:2] == pytest.approx((row["mean"], row["sd"]))


def test_compare_prints_a_paired_verdict_with_its_interval(tmp_path):
    from tpu_ray.comparison import comparison_text

    a, b = make_run(tmp_path / "scratch", partial=False), make_run(tmp_path / "continued", partial=False)
    base, cand = [0.70, 0.72, 0.69, 0.71, 0.70], [0.74, 0.75, 0.72, 0.76, 0.73]
    _record(a, [_trial(s, 1e-3, 0.8, v) for s, v in enumerate(base)], model="ma")
    _record(b, [_trial(s, 3e-4, 0.8, v) for s, v in enumerate(cand)], model="mb")
    text = comparison_text([str(a), str(b)])
    diffs = [100 * (c - s) for c, s in zip(cand, base)]
    low, high = sps.ttest_rel([100 * c for c in cand], [100 * s for s in base]).confidence_interval(0.95)
    assert f"better than scratch by {statistics.fmean(diffs):.1f} ± {(high - low) / 2:.1f} points" in text, text
    assert "verdict: continued is better" in text


def test_compare_gives_no_verdict_across_other_settings(tmp_path):
    from tpu_ray.comparison import comparison_text

    a, b = make_run(tmp_path / "a", partial=False), make_run(tmp_path / "b", partial=False)
    _record(a, [_trial(s, 1e-3, 0.8, 0.7) for s in range(3)], model="ma")
    _record(b, [_trial(s, 1e-3, 0.8, 0.7) for s in range(3)], model="mb", spec=QUICK)
    text = comparison_text([str(a), str(b)])
    assert "not comparable: the runs were fine-tuned with other settings" in text and "verdict" not in text


def test_records_written_before_settings_were_recorded_still_summarise(tmp_path):
    """A run directory from an earlier version: no model, settings or split fields."""
    import json

    run = make_run(tmp_path / "a", partial=False)
    with open(run / "metrics.jsonl", "a") as f:
        for s, v in enumerate([0.5, 0.7]):
            f.write(json.dumps({"kind": "downstream", "step": 500, "task": TASK, "task_hash": "h", "seed": s,
                                "learning_rate": 1e-3, "status": "ok", "accuracy": v, "time": 1.0}) + "\n")
    t = trials(load_metrics(str(run)))
    assert list(t["split"]) == ["validation"] * 2 and set(t["model"]) == {"step-500"}
    row = scores(load_metrics(str(run))).iloc[0]
    assert row["mean"] == pytest.approx(0.6) and not math.isnan(row["sd"])


def test_compare_takes_the_rate_finetune_chose_for_the_latest_checkpoint(tmp_path):
    """Over the curve (step 0 included) 1e-3 is best on validation; at the latest checkpoint 3e-4 is,
    and `finetune` reported it there: compare's line and verdict are at 3e-4 too, never reversing it."""
    from tpu_ray.comparison import comparison_text

    a, b = make_run(tmp_path / "scratch", partial=False), make_run(tmp_path / "continued", partial=False)
    base = [_trial(s, 3e-4, 0.8, v) for s, v in enumerate([0.70, 0.71, 0.72])]
    _record(a, base, model="ma")
    _record(b, [_trial(s, 1e-3, 0.99, 0.9) for s in range(3)] + [_trial(s, 3e-4, 0.10, 0.1) for s in range(3)],
            step=0, model="m0")  # step 0: 1e-3 far ahead, and it carries the curve's average
    latest = [_trial(s, 1e-3, 0.60, 0.95) for s in range(3)] + [_trial(s, 3e-4, 0.65, v) for s, v in
                                                                 enumerate([0.60, 0.62, 0.61])]
    _record(b, latest, model="m500")
    summary = Summary(task=TASK, task_hash="h" * 64, step=500, trials=latest, metric="accuracy", chance=0.3,
                      report_split="test")
    assert summary.best_lr == 3e-4
    assert list(best(load_metrics(str(b)))["learning_rate"]) == [1e-3, 1e-3]  # the report's curve choice
    text = comparison_text([str(a), str(b)])
    assert "lr 0.0003" in text.split("continued at step 500")[1].splitlines()[0], text
    assert "continued is worse" in text, text  # 0.61 vs 0.71 at finetune's rate, not 0.95 at the curve's


def test_a_tie_between_rates_goes_to_the_smallest_in_summary_and_history_alike(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    sweep = [_trial(s, 1e-3, 0.8, 0.9) for s in range(2)] + [_trial(s, 1e-4, 0.8, 0.1) for s in range(2)]
    _record(run, sweep)  # the grid given largest first
    summary = Summary(task=TASK, task_hash="h", step=None, trials=sweep, metric="accuracy", chance=None,
                      report_split="test")
    assert summary.best_lr == 1e-4 == best(load_metrics(str(run)))["learning_rate"].iloc[0]


def test_models_fine_tuned_into_one_directory_are_not_one_curve(tmp_path):
    from tpu_ray.comparison import comparison_text

    run = make_run(tmp_path / "out", partial=False)
    _record(run, [_trial(s, 1e-3, 0.9, 0.8) for s in range(2)] + [_trial(s, 1e-4, 0.5, 0.5) for s in range(2)],
            step=None, model="weights-a")
    _record(run, [_trial(s, 1e-3, 0.1, 0.1) for s in range(2)] + [_trial(s, 1e-4, 0.6, 0.7) for s in range(2)],
            step=None, model="weights-b")
    table = best(load_metrics(str(run)))
    assert dict(zip(table["model"], table["learning_rate"])) == {"weights-a": 1e-3, "weights-b": 1e-4}
    text = text_summary(str(run))
    assert "(model weights-a): test accuracy 0.8000" in text and "(model weights-b): test accuracy 0.7000" in text
    other = make_run(tmp_path / "other", partial=False)
    _record(other, [_trial(s, 1e-3, 0.9, 0.8) for s in range(2)], step=None, model="weights-c")
    text = comparison_text([str(other), str(run)])
    assert "2 models' trials in one record directory" in text and "verdict" not in text, text


def test_one_task_named_by_two_paths_is_compared_by_its_hash(tmp_path):
    from tpu_ray.comparison import comparison_text

    a, b = make_run(tmp_path / "a", partial=False), make_run(tmp_path / "b", partial=False)
    _record(a, [_trial(s, 1e-3, 0.8, 0.7) for s in range(3)], model="ma")
    spec = FinetuneSpec()
    record(str(b), Summary(task="/elsewhere/task.yaml", task_hash="h" * 64, step=500, metric="accuracy", chance=0.3,
                           trials=[_trial(s, 1e-3, 0.8, 0.75) for s in range(3)], report_split="test", model="mb",
                           settings=spec.settings(), settings_key=spec.settings_key()))
    text = comparison_text([str(a), str(b)])
    assert f"downstream /elsewhere/task.yaml / {TASK}:" in text and "verdict: b is better" in text, text
    assert "not fine-tuned on it" not in text, text


def test_models_outside_their_runs_at_different_steps_are_not_one_curve(tmp_path):
    from tpu_ray.comparison import comparison_text

    out = make_run(tmp_path / "out", partial=False)
    _record(out, [_trial(s, 1e-3, 0.9, 0.8) for s in range(2)] + [_trial(s, 1e-4, 0.5, 0.5) for s in range(2)],
            step=1000, model="weights-a", lineage="weights-a")
    _record(out, [_trial(s, 1e-3, 0.1, 0.1) for s in range(2)] + [_trial(s, 1e-4, 0.6, 0.6) for s in range(2)],
            step=2000, model="weights-b", lineage="weights-b")
    table = best(load_metrics(str(out)))
    assert dict(zip(table["model"], table["learning_rate"])) == {"weights-a": 1e-3, "weights-b": 1e-4}
    assert set(table["shown_model"]) == {"weights-a", "weights-b"}
    other = make_run(tmp_path / "other", partial=False)
    _record(other, [_trial(s, 1e-3, 0.9, 0.8) for s in range(2)], model="weights-c", lineage="weights-c")
    text = comparison_text([str(other), str(out)])
    assert "2 models' trials in one record directory" in text and "verdict" not in text, text


def test_one_sweep_resumed_under_another_task_path_is_one_row(tmp_path):
    run = make_run(tmp_path / "a", partial=False)
    _record(run, [_trial(s, 1e-3, 0.8, v) for s, v in enumerate([0.7, 0.8, 0.9])], task="t.yaml")
    _record(run, [_trial(s, 1e-3, 0.8, v) for s, v in ((3, 0.6), (4, 0.5))], task="./t.yaml")
    (row,) = [r for _, r in best(load_metrics(str(run))).iterrows()]
    assert row["seeds"] == 5 and row["mean"] == pytest.approx(0.7) and row["task"] == "./t.yaml"


def test_rates_whose_means_differ_only_by_float_rounding_tie():
    from tpu_ray.downstream.history import choose_lr

    assert 0.1 + 0.2 != 0.3
    assert choose_lr({1e-3: 0.1 + 0.2, 1e-4: 0.3}) == 1e-4 == choose_lr({1e-3: 0.3, 1e-4: 0.1 + 0.2})
    assert choose_lr({1e-3: 0.31, 1e-4: 0.3}) == 1e-3


def test_one_seed_prints_no_spread():
    from tpu_ray.downstream.history import spread

    assert spread(0.5, 0.0, 1) == "0.5000 (one seed: no sd)" and spread(0.5, 0.1, 2) == "0.5000 ± 0.1000"
