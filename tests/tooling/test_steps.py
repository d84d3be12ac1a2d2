"""The one step runner (jatools/steps.py): order, timing, logs, the first failure, skips, time limits, dry runs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jatools import steps

PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def test_steps_run_in_order_and_are_timed(tmp_path: Path, capfd) -> None:
    made = tmp_path / "made.txt"
    records = steps.run([steps.Step("make", py(f"open({str(made)!r}, 'w').write('x')"), artifacts=lambda: [made]),
                         steps.Step("read", lambda: py(f"print(open({str(made)!r}).read() * 2)"))], "demo")
    assert [(r.name, r.result, r.exit) for r in records] == [("make", "ok", 0), ("read", "ok", 0)]
    assert records[0].artifacts == [made] and all(r.seconds >= 0 for r in records)
    out = capfd.readouterr().out  # an unlogged step's output goes straight to the terminal
    assert f"demo: [make] $ {PY} -c" in out and "xx" in out
    assert set(steps.seconds(records)) == {"make", "read"} and steps.timing_line(records).endswith(" s")


def test_the_first_failure_stops_the_run_and_names_step_command_log_and_rerun(tmp_path: Path, capsys) -> None:
    log = tmp_path / "logs" / "bad.log"
    todo = [steps.Step("good", py("print('fine')")),
            steps.Step("bad", py("import sys; print('line one'); sys.exit(3)"), env={"JA_DEMO": "1", "PATH": "/bin"},
                       log=log),
            steps.Step("later", py("raise SystemExit('must not run')"))]
    with pytest.raises(steps.StepFailed) as e:
        steps.run(todo, "demo")
    msg = str(e.value)
    assert msg.startswith("demo: step bad failed (exit 3): ") and "line one" in msg and f"full log: {log}" in msg
    assert "re-run just this step: JA_DEMO=1 PATH=/bin " in msg
    assert log.read_text() == "line one\n" and "  line one" in capsys.readouterr().out  # logged and echoed
    assert [r.result for r in e.value.records] == ["ok", "failed", "not run"] and e.value.record.exit == 3


def test_up_to_date_steps_are_skipped_and_quiet_logs_stay_off_the_terminal(tmp_path: Path, capsys) -> None:
    said: list[str] = []
    records = steps.run([steps.Step("skip", py("raise SystemExit(1)"), up_to_date=lambda: "nothing changed"),
                         steps.Step("quiet", py("print('hidden')"), log=tmp_path / "q.log")], "demo",
                        echo=False, progress=said.append)
    assert [r.result for r in records] == ["up-to-date", "ok"] and records[0].note == "nothing changed"
    assert said[0] == "demo: [skip] up to date: nothing changed" and records[1].tail == ["hidden"]
    assert "hidden" not in capsys.readouterr().out


@pytest.mark.parametrize("logged", [False, True])
def test_a_step_past_its_time_limit_fails(tmp_path: Path, logged: bool) -> None:
    step = steps.Step("slow", py("import time; time.sleep(30)"), timeout=0.5,
                      log=tmp_path / "s.log" if logged else None)
    with pytest.raises(steps.StepFailed, match=r"step slow failed \(did not finish within 0.5 s\)") as e:
        steps.run([step], "demo")
    assert e.value.record.exit is None and e.value.record.seconds < 20


def test_a_program_that_is_not_there_is_a_failure_not_a_crash() -> None:
    with pytest.raises(steps.StepFailed, match="could not start"):
        steps.run([steps.Step("missing", ["/no/such/program"], rerun="install it")], "demo")


def test_dry_run_prints_and_runs_nothing(capsys) -> None:
    wheels: dict[str, str] = {}
    records = steps.run([steps.Step("a", py("raise SystemExit(1)")),
                         steps.Step("b", lambda: ["check", wheels["lite"]])], "demo", dry_run=True)
    out = capsys.readouterr().out
    assert "demo: [a] $ " in out and "demo: [b] $ (the command depends on what the earlier steps make)" in out
    assert [r.result for r in records] == ["not run", "not run"]


def test_github_log_groups(capsys) -> None:
    steps.run([steps.Step("1", py("print('inside')"))], "demo", groups=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("::group::[1] ") and out[-1] == "::endgroup::"
