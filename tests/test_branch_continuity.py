"""A branch (train.branch_from) is continuous or refused. At the branch step its learning
rate and masking rate are the stable run's, or the branch is refused in one line naming the rate,
both values and the setting that makes them equal. Pure arithmetic on the configs (curves.rate):
no TensorFlow, no training. The three jumps the issue confirmed, and the documented examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tpu_ray.config import RunConfig, TrainConfig
from tpu_ray.train.branch import continuity_refusal, lr_at, mask_rate_at, with_defaults

pytestmark = pytest.mark.quick
DOCS = Path(__file__).resolve().parent.parent / "docs" / "schedules.md"


def _cfg(**over) -> TrainConfig:
    """The train section of a whole config with these overrides (validated as a run's is)."""
    return RunConfig().override({"train.learning_rate": 1e-3, **over}).train


def _set(t: TrainConfig, over: dict) -> TrainConfig:
    """`t` with train.* overrides, validated as a run's config is."""
    return RunConfig(train=t).override(over).train


STABLE = {"train.schedule": "constant", "train.steps": 100_000, "train.warmup_steps": 2000}


def test_a_decay_without_decay_steps_starts_at_the_branch_step_not_at_the_fractions_step():
    """(a) constant (warm-up 2,000) branched at 20,000, train.steps=22000, no decay_steps: with
    decay_fraction 0.2 the decay would start at 17,600 (1e-3 -> 2.6e-4 in one step)."""
    stable = _cfg(**STABLE)
    branch = _cfg(**{"train.schedule": "wsd", "train.steps": 22_000, "train.warmup_steps": 2000})
    jump = continuity_refusal(stable, branch, 20_000)  # decay_fraction's curve, as before the default
    assert jump == ("the learning rate jumps at the branch step 20,000 (the stable run's 0.001, this run's "
                    "0.000261451); set train.decay_steps=2000 (the decay from the branch step)")
    settled = with_defaults(branch, stable, 20_000)
    assert settled.decay_steps == 2000 and continuity_refusal(stable, settled, 20_000) is None
    assert lr_at(settled, 20_000) == lr_at(stable, 20_000) == 1e-3
    assert lr_at(settled, 21_000) < 1e-3  # and it does decay from there
    # an explicit decay_steps that starts the decay before the branch step is refused, not changed
    early = _set(branch, {"train.decay_steps": 4400})
    assert with_defaults(early, stable, 20_000).decay_steps == 4400
    assert "set train.decay_steps=2000" in continuity_refusal(stable, early, 20_000)
    # one that starts it later holds the peak up to there: continuous
    assert continuity_refusal(stable, _set(branch, {"train.decay_steps": 1000}), 20_000) is None


def test_unset_warm_ups_take_the_stable_runs():
    """(b) both warm-ups unset (5% of 100,000 = 5,000 and of 4,800 = 240), branched at 4,000:
    0.8e-3 in the stable run, 1e-3 in the branch."""
    stable = _cfg(**{"train.schedule": "constant", "train.steps": 100_000})
    branch = _cfg(**{"train.schedule": "wsd", "train.steps": 4800, "train.decay_steps": 800})
    assert continuity_refusal(stable, branch, 4000) == (
        "the learning rate jumps at the branch step 4,000 (the stable run's 0.0008, this run's 0.001); "
        "set train.warmup_steps=5000")
    settled = with_defaults(branch, stable, 4000)
    assert settled.warmup_steps == 5000 and continuity_refusal(stable, settled, 4000) is None
    # a warm-up given differently is the user's: refused with the stable run's
    other = _set(branch, {"train.warmup_steps": 240})
    assert with_defaults(other, stable, 4000).warmup_steps == 240
    assert continuity_refusal(stable, other, 4000).endswith("set train.warmup_steps=5000")


def test_a_linear_masking_rate_scaled_by_the_branchs_steps_is_refused_with_the_end_that_continues_it():
    """(c) mask_schedule=linear 0.3 -> 0.15 over train.steps: 0.27 in the stable run at 20,000,
    0.164 in a branch of 22,000 steps."""
    mask = {"train.mask_prob": 0.3, "train.mask_schedule": "linear", "train.mask_prob_end": 0.15}
    stable = _cfg(**STABLE, **mask)
    branch = _cfg(**{"train.schedule": "wsd", "train.steps": 22_000, "train.warmup_steps": 2000, **mask})
    line = continuity_refusal(stable, with_defaults(branch, stable, 20_000), 20_000)
    assert line == ("the masking rate jumps at the branch step 20,000 (the stable run's 0.27, this run's 0.163636); "
                    "set train.mask_prob_end=0.267 (the same line through the stable run's rate, ending at "
                    "train.steps=22000)")
    fixed = with_defaults(_set(branch, {"train.mask_prob_end": 0.267}), stable, 20_000)
    assert continuity_refusal(stable, fixed, 20_000) is None
    assert mask_rate_at(fixed, 20_000) == pytest.approx(0.27, rel=1e-9)
    # a constant masking rate of the branch: the stable run's rate there
    const = _set(branch, {"train.mask_schedule": "constant", "train.mask_prob_end": None})
    assert continuity_refusal(stable, with_defaults(const, stable, 20_000), 20_000).endswith(
        "set train.mask_prob=0.27")


@pytest.mark.parametrize("stable_over, branch_over, fix", [
    ({}, {"train.learning_rate": 2e-3, "train.schedule": "wsd"}, "set train.learning_rate=0.001"),
    ({}, {"train.schedule": "linear"}, "set train.schedule=wsd train.decay_steps=2000"),
    ({"train.mask_prob": 0.3}, {"train.schedule": "wsd"}, "set train.mask_prob=0.3"),
])
def test_every_jump_names_the_rate_both_values_and_the_fix_in_one_line(stable_over, branch_over, fix):
    stable = _cfg(**STABLE, **stable_over)
    branch = with_defaults(_cfg(**{"train.steps": 22_000, **branch_over}), stable, 20_000)
    line = continuity_refusal(stable, branch, 20_000)
    assert line and "\n" not in line and fix in line, line
    assert re.search(r"the (learning|masking) rate jumps at the branch step 20,000 \(the stable run's [\d.e-]+, "
                     r"this run's [\d.e-]+\)", line), line


def _doc_overrides(command: str) -> dict[str, str]:
    """The `key=value` words of a command in docs/schedules.md (so the test follows the docs)."""
    words = re.findall(r"(train\.\w+)=('[^']*'|\S+)", command)
    return {k: v.strip("'") for k, v in words if k != "train.branch_from"}


def _doc_command(start: str) -> str:
    text = DOCS.read_text()
    i = text.index(start)
    return text[i:text.index("```", i)].replace("\\\n", " ")


def test_the_documented_branches_run_without_a_jump():
    """docs/schedules.md: the constant run branched at 20,000 into a 2,000-step decay, and the phased
    stable run branched at 1,000 into a 100-step decay."""
    import yaml

    def load(over: dict[str, str]) -> TrainConfig:
        return RunConfig().override({k: yaml.safe_load(v) for k, v in over.items()}).train

    stable = load(_doc_overrides(_doc_command("tpu-ray run --config my.yaml --output-dir runs/stable")))
    branch = load(_doc_overrides(_doc_command("tpu-ray train --config my.yaml --output-dir runs/decay-at-20k")))
    assert stable.schedule == "constant" and branch.steps == 22_000
    assert continuity_refusal(stable, with_defaults(branch, stable, 20_000), 20_000) is None
    # without train.decay_steps and train.warmup_steps too (the defaults)
    bare = load({k: v for k, v in _doc_overrides(_doc_command("tpu-ray train --config my.yaml --output-dir "
                                                               "runs/decay-at-20k")).items()
                 if k not in ("train.decay_steps", "train.warmup_steps")})
    assert continuity_refusal(stable, with_defaults(bare, stable, 20_000), 20_000) is None

    phased = load({"train.phases": "[{steps: 800, seq_len: 32}, {steps: 400, seq_len: 64}]",
                   "train.schedule": "constant"})
    assert "`[{steps: 800, seq_len: 32}, {steps: 400, seq_len: 64}]`" in DOCS.read_text()
    decay = load(_doc_overrides(_doc_command("tpu-ray train --config stable.yaml --output-dir runs/decay-at-1000")))
    assert decay.steps == 1100 and decay.decay_steps == 100
    assert continuity_refusal(phased, with_defaults(decay, phased, 1000), 1000) is None


def test_the_printed_fix_passes_the_check_when_the_rate_is_not_round():
    """A stable run's masking rate of 0.163636... at the branch step: the printed value is exact
    enough for the branch that sets it to pass (6 significant digits would miss by 2e-6)."""
    stable = _cfg(**{"train.schedule": "constant", "train.steps": 22_000, "train.warmup_steps": 2000,
                     "train.mask_prob": 0.3, "train.mask_schedule": "linear", "train.mask_prob_end": 0.15})
    branch = with_defaults(_cfg(**{"train.schedule": "wsd", "train.steps": 21_000}), stable, 20_000)
    line = continuity_refusal(stable, branch, 20_000)
    value = float(re.search(r"set train.mask_prob=([\d.]+)$", line).group(1))
    assert continuity_refusal(stable, _set(branch, {"train.mask_prob": value}), 20_000) is None
