"""A flag the command line does not take: exit 2 and one line, suggesting the flag meant or naming
the subcommands that take it. The real parser (tpu_ray.cli.main), nothing runs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


@pytest.mark.parametrize("typo, meant", [("--ouput-dir", "--output-dir"), ("--fill_mask", "--fill-mask"),
                                         ("--confg=jobs/configs/quickstart.yaml", "--config")])
def test_a_mistyped_flag_gets_a_suggestion_and_exit_2(capsys, typo, meant):
    from tpu_ray.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--config", "jobs/configs/quickstart.yaml", typo, "x"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert f"did you mean {meant}?" in err, err


@pytest.mark.parametrize("argv, says", [
    (["train", "--corpus", "data/x.txt"], "`tpu-ray train` has no --corpus; run, tokenizer, shard and submit take it"),
    (["train", "--fill-mask", "a [MASK]."], "`tpu-ray train` has no --fill-mask; run takes it"),
    (["train", "--ouput-dir", "runs/x"], "--ouput-dir: did you mean --output-dir?")])
def test_a_flag_the_subcommand_lacks_is_named_with_the_subcommands_that_take_it(capsys, argv, says):
    """`tpu-ray train --corpus X` said "(--corpus: did you mean --corpus?)": the flag exists, only
    not for train (which reads existing shards)."""
    from tpu_ray.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err.startswith("tpu-ray train: error: unrecognized arguments:"), err
    assert says in err and "did you mean --corpus" not in err and err.endswith("see tpu-ray train --help"), err
