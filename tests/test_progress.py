"""Progress of loading many ranks: a bar on a terminal, plain quarter lines in logs, never
control codes where standard error is not a terminal."""

from __future__ import annotations

import io

from pardiag.progress import PLAIN_MIN_FILES, progress_reporter


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_log_gets_one_plain_line_per_quarter():
    s = _Stream(tty=False)
    with progress_reporter("loading traces", s) as update:
        for i in range(1, 65):
            update(i, 64)
    assert s.getvalue() == ("pardiag: loading traces: 16/64\npardiag: loading traces: 32/64\n"
                            "pardiag: loading traces: 48/64\npardiag: loading traces: 64/64\n")


def test_log_of_a_small_run_gets_nothing():
    s = _Stream(tty=False)
    with progress_reporter("loading traces", s) as update:
        for i in range(1, PLAIN_MIN_FILES):
            update(i, PLAIN_MIN_FILES - 1)
    assert s.getvalue() == ""


def test_terminal_gets_a_bar_that_is_cleared():
    s = _Stream(tty=True)
    with progress_reporter("loading traces", s) as update:
        for i in range(1, 5):
            update(i, 4)
        shown = s.getvalue()
    assert "loading traces" in shown and "4/4" in shown


def test_cli_report_in_a_log_has_no_control_codes(tmp_path, monkeypatch, capsys):
    import sys

    from pardiag import cli

    from .synth import gpu_rank

    run = tmp_path / "run"
    run.mkdir()
    for r in range(40):
        gpu_rank(r).write(run / f"rank{r}.json")
    monkeypatch.setenv("PARDIAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["pardiag", "report", str(run), "-q", "--no-cache",
                                      "-o", str(tmp_path / "r.html")])
    assert cli.main() == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert [ln for ln in err.splitlines() if "loading traces" in ln] == [
        "pardiag: loading traces: 10/40", "pardiag: loading traces: 20/40",
        "pardiag: loading traces: 30/40", "pardiag: loading traces: 40/40"]
