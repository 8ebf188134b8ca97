"""Issue 25's small things: a Hugging Face id as --model, a JSON error without "at at", and a
did-you-mean for an unknown cluster key. Each is one line, exit 2, and its suggestion works."""
from __future__ import annotations

import re

from planner.cli import main

TRAIN = ["--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096"]


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_hf_id_names_the_catalog_model_and_that_works(capsys):
    from planner.plan.inputs import load_model
    err = _err(capsys, ["estimate", "--model", "meta-llama/Llama-3.1-8B", *TRAIN, "--tp", "8"])
    assert "Hugging Face id" in err and "reads no hub" in err
    suggested = re.search(r"give --model (\S+)", err).group(1)
    assert suggested == "llama-3.1-8b" and load_model(suggested).name == "llama-3.1-8b"


def test_unknown_hf_id_says_what_is_expected(capsys):
    err = _err(capsys, ["estimate", "--model", "acme/frobnicator-7b", *TRAIN, "--tp", "8"])
    assert "catalog name (" in err and "config.json" in err and "llama-3-8b" in err


def test_missing_model_file_says_what_model_takes(capsys, tmp_path):
    err = _err(capsys, ["estimate", "--model", str(tmp_path / "m.json"), *TRAIN, "--tp", "8"])
    assert "does not exist" in err and "catalog name" in err


def test_json_error_has_one_at(capsys, tmp_path):
    m = tmp_path / "config.json"
    m.write_text('{"model_type": "llama", "hidden_size": "abc')
    err = _err(capsys, ["estimate", "--model", str(m), *TRAIN, "--tp", "8"])
    assert "at at" not in err and re.search(r"starting at line 1, column \d+", err), err


def test_unknown_cluster_key_did_you_mean(capsys, tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text("extends: dgx-h100\ngpus_per_nod: 8\n")
    err = _err(capsys, ["estimate", "--model", "llama-3-8b", "--cluster", str(c), "--gpus", "8", "--global-batch",
                        "64", "--seq-len", "4096", "--tp", "8"])
    assert "did you mean gpus_per_nod -> gpus_per_node?" in err
    c.write_text("extends: dgx-h100\ngpus_per_node: 8\n")          # the suggestion, applied, loads
    assert main(["estimate", "--model", "llama-3-8b", "--cluster", str(c), "--gpus", "8", "--global-batch", "64",
                 "--seq-len", "4096", "--tp", "8"]) == 0
    capsys.readouterr()
