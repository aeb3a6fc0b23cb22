"""What a run writes when something goes wrong: sites left out said in every place, a full disk never leaves a
result that looks complete (issue 43, rows 10 and 13)."""

import errno
import json

import pytest

from fedica.results import RESULT_FILE, SUMMARY_FILE, format_summary, is_complete_result
from fedica.server.harness import outputs
from fedica.server.harness.runner import left_out_warning

RESULT = {"algorithm": "rfica", "scenario": {"name": "ica_paper"}, "metrics": {"rf-ica": {"error": 0.01}}, "timings": {"total": 1.0},
          "clients": {"expected": 3, "answered": 2, "rejected": [{"client": 2, "round": 1, "reason": "malformed reply"}]},
          "warnings": {}}


def test_a_site_left_out_mid_run_is_a_warning_of_the_result():
    warning = left_out_warning(RESULT["clients"])
    assert warning.startswith("1 of 3 sites are not in the result (clients.rejected says which and why)")
    assert left_out_warning({"expected": 3, "answered": 3}) is None
    summary = format_summary({**RESULT, "warnings": {f"UserWarning: {warning}": 1}})
    assert f"warning: {warning}" in summary


def test_a_full_disk_never_leaves_a_complete_result_beside_no_summary(tmp_path, monkeypatch):
    # Row 10 of issue 43: result.json was written and summary.txt left empty, and the resume then skipped the run.
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "write_json_atomic", full)
    with pytest.raises(OSError):
        outputs.write_result(tmp_path, RESULT)
    assert not (tmp_path / RESULT_FILE).exists() and not is_complete_result(tmp_path / RESULT_FILE)
    monkeypatch.undo()
    outputs.write_result(tmp_path, RESULT)
    assert json.loads((tmp_path / RESULT_FILE).read_text())["metrics"] == RESULT["metrics"]
    assert (tmp_path / SUMMARY_FILE).read_text().startswith(format_summary(RESULT).splitlines()[0])
