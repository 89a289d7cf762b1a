"""benchmarks/suite_time.py, the only writer of the README's test-time line: parsing logs and rewriting the line, on
sample text (no test suite is run)."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("suite_time", ROOT / "benchmarks" / "suite_time.py")
suite_time = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = suite_time  # its dataclass looks its module up while the class is made
spec.loader.exec_module(suite_time)

MAKE_LOG = """\
python3 -m venv .venv
env -u PYTHONDONTWRITEBYTECODE MALLOC_CONF=oversize_threshold:0 .venv/bin/pytest -n 2 --dist loadgroup -q --durations=40
bringing up nodes...
........................................................................ [100%]
============================= slowest 40 durations =============================
61.20s call     tests/test_notebooks.py::test_notebook[quickstart]
(3 durations < 0.005s hidden.  Use -vv to show these durations.)
4390 passed, 13 skipped, 2 warnings in 443.21s (0:07:23)
\tCommand being timed: "make test"
\tUser time (seconds): 800.50
\tSystem time (seconds): 81.70
\tElapsed (wall clock) time (h:mm:ss or m:ss): 7:54.12
"""


def test_parse_log_reads_pytests_summary_workers_and_time_v():
    run = suite_time.parse_log(MAKE_LOG)
    assert run.counts == {"passed": 4390, "skipped": 13, "warnings": 2}
    assert run.tests == 4403 and run.pytest_s == 443.21 and run.workers == 2
    assert run.wall_s == pytest.approx(474.12) and run.cpu_s == pytest.approx(882.2)


def test_parse_log_reads_bash_time_and_a_summary_with_rules():
    log = ("3 passed in 0.10s\n"  # a nested pytest's summary, printed by a test: the last one counts
           "= 2 failed, 10 passed, 1 xfailed, 1 error in 70.00s (0:01:10) =\n"
           "\nreal\t2m3.50s\nuser\t3m0.00s\nsys\t0m10.00s\n")
    run = suite_time.parse_log(log)
    assert run.counts == {"failed": 2, "passed": 10, "xfailed": 1, "error": 1}
    assert run.tests == 13 and run.workers is None
    assert (run.pytest_s, run.wall_s, run.cpu_s) == (70.0, 123.5, 190.0)


def test_parse_log_prefers_the_scripts_own_footer():
    log = ("12 passed in 30.00s\nreal 99.0\n"
           "suite_time: wall 45.5 s, cpu 80.0 s, cores 4, cpu model Some CPU (AVX2), date 2026-01-02\n")
    run = suite_time.parse_log(log)
    assert (run.wall_s, run.cpu_s, run.cores, run.cpu_model, run.date) == (45.5, 80.0, 4, "Some CPU (AVX2)",
                                                                          "2026-01-02")


def test_parse_log_without_a_summary_is_an_error():
    with pytest.raises(ValueError, match="no pytest summary"):
        suite_time.parse_log("make: *** [Makefile:70: test] Error 2\n")


def test_format_line_names_counts_time_machine_and_failures():
    run = suite_time.parse_log(MAKE_LOG)
    run.cores, run.cpu_model, run.date = 2, "AMD EPYC (AVX-512 with bf16)", "2026-12-06"
    assert suite_time.format_line(run) == (
        "`make test`: **7.9 min** in all (4,403 tests, 2 xdist workers; tests 7.4 min; 14.7 min of CPU), "
        "2026-12-06, on 2 cores of AMD EPYC (AVX-512 with bf16).")
    only_pytest = suite_time.parse_log("1 failed, 99 passed in 600.00s\n")
    only_pytest.cores, only_pytest.cpu_model, only_pytest.date = 8, "X", "2026-01-01"
    assert suite_time.format_line(only_pytest, "tests") == (
        "tests: **10.0 min** of tests (100 tests, 1 failed), 2026-01-01, on 8 cores of X.")


def test_rewrite_replaces_only_the_marked_text_and_keeps_the_label():
    readme = "# t\n\n<!-- test-time -->`make test` on a\nclean clone: **1.0 min** old<!-- /test-time -->\nrest.\n"
    assert suite_time.current_label(readme) == "`make test` on a clean clone"
    new = suite_time.rewrite(readme, "NEW")
    assert new == "# t\n\n<!-- test-time -->\nNEW\n<!-- /test-time -->\nrest.\n"
    assert suite_time.current_label(new) is None
    words = " ".join(["word"] * 60)
    long = suite_time.rewrite(new, words, width=40)
    assert max(map(len, long.splitlines())) <= 40 and long.split() == new.replace("NEW", words).split()
    for broken in ("no markers", "<!-- /test-time --> <!-- test-time -->", "<!-- test-time --><!-- test-time -->"):
        with pytest.raises(ValueError, match="must hold"):
            suite_time.rewrite(broken, "x")


def test_main_from_log_rewrites_a_readme(tmp_path):
    log, readme = tmp_path / "make_test.log", tmp_path / "README.md"
    log.write_text(MAKE_LOG)
    readme.write_text("a\n<!-- test-time -->\n`make test`: **0.1 min** in all\n<!-- /test-time -->\nb\n")
    assert suite_time.main(["--from-log", str(log), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("a\n<!-- test-time -->\n`make test`: **7.9 min** in all (4,403 tests, 2 xdist workers;")
    assert " ".join(text.split()).endswith(f"cores of {suite_time.cpu_model()}. <!-- /test-time --> b")


def test_the_readme_holds_the_markers_once():
    readme = (ROOT / "README.md").read_text()
    assert suite_time.rewrite(readme, "x").count("<!-- test-time -->\nx\n<!-- /test-time -->") == 1
