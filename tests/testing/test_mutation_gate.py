"""The mutation gate itself: it must tell a killed mutant from a survivor and a stale one.

A synthetic repository (a one-rule ``scriba`` package and its test) stands in for the
real tree, so the gate's verdicts are checked in seconds: a mutant the test catches is
killed, one it cannot see survives (the gate fails and shows its diff), and a mutant
whose snippet no longer matches is reported stale instead of silently passing.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from scriba.testing.mutation import Mutant, failed_tests, load_mutants, main, mutant_diff, run_gate

_RULE = "def confirmed(acks: int, quorum: int) -> bool:\n    return acks >= quorum\n"
_TEST = textwrap.dedent("""
    from scriba.rule import confirmed

    def test_quorum() -> None:
        assert confirmed(2, 2)
        assert not confirmed(1, 2)
""")
_TOML = textwrap.dedent('''
    [[mutant]]
    id = "killed"
    file = "scriba/rule.py"
    find = "acks >= quorum"
    replace = "acks >= quorum - 1"
    tests = ["tests/test_rule.py"]
    why = "one ack too few"

    [[mutant]]
    id = "survivor"
    file = "scriba/rule.py"
    find = "acks >= quorum"
    replace = "acks >= quorum or acks > 1000"
    tests = ["tests/test_rule.py"]
    why = "no test has a thousand acks"

    [[mutant]]
    id = "stale"
    file = "scriba/rule.py"
    find = "acks > quorum"
    replace = "acks < quorum"
    tests = ["tests/test_rule.py"]
    why = "the code moved"
''')


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "scriba").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "scriba" / "__init__.py").write_text("")
    (root / "scriba" / "rule.py").write_text(_RULE)
    (root / "tests" / "test_rule.py").write_text(_TEST)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ''\n")
    (root / "mutants.toml").write_text(_TOML)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_gate_kills_reports_survivors_and_stale_mutants(repo: Path) -> None:
    mutants = load_mutants(repo / "mutants.toml")
    outcomes = {o.mutant.id: o.verdict for o in run_gate(
        repo, mutants, jobs=2, timeout_s=60, check_baseline=True)}
    assert outcomes == {"killed": "killed", "survivor": "survived", "stale": "stale"}
    assert (repo / "scriba" / "rule.py").read_text() == _RULE  # the work tree is never written


def test_gate_exit_code_and_diff(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(repo / "mutants.toml"), "--repo", str(repo), "--only", "killed"]) == 0
    assert main([str(repo / "mutants.toml"), "--repo", str(repo), "--only", "survivor"]) == 1
    out = capsys.readouterr().out
    assert "+    return acks >= quorum or acks > 1000" in out
    m = Mutant("x", "scriba/rule.py", "acks >= quorum", "acks > quorum", ("t",), "")
    assert "-    return acks >= quorum" in mutant_diff(m, repo)


def test_gate_refuses_a_failing_baseline(repo: Path) -> None:
    (repo / "tests" / "test_rule.py").write_text(_TEST.replace("assert confirmed(2, 2)",
                                                               "assert confirmed(1, 2)"))
    with pytest.raises(SystemExit, match="unmutated tests fail"):
        run_gate(repo, load_mutants(repo / "mutants.toml"), jobs=1, timeout_s=60,
                 check_baseline=True)


def _killed_mutant_runs(repo: Path, *tests: str) -> list[Mutant]:
    """The "killed" mutant, its tests replaced by ``tests`` (alone: the gate's first)."""
    toml = (repo / "mutants.toml").read_text().replace(
        'tests = ["tests/test_rule.py"]\nwhy = "one ack too few"',
        f'tests = {list(tests)!r}\nwhy = "one ack too few"'.replace("'", '"'))
    (repo / "mutants.toml").write_text(toml)
    return load_mutants(repo / "mutants.toml")[:1]


def test_gate_reruns_a_baseline_test_that_fails_once(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # fails on its first run only (a marker outside the copied tree remembers it ran)
    marker = repo.parent / "ran-once"
    (repo / "tests" / "test_flaky.py").write_text(textwrap.dedent(f"""
        from pathlib import Path

        def test_flaky() -> None:
            marker = Path({str(marker)!r})
            first = not marker.exists()
            marker.touch()
            assert not first
    """))
    mutants = _killed_mutant_runs(repo, "tests/test_rule.py", "tests/test_flaky.py")
    outcomes = run_gate(repo, mutants, jobs=1, timeout_s=60, check_baseline=True)
    assert [o.verdict for o in outcomes] == ["killed"]
    assert "flaky unmutated tests" in capsys.readouterr().out and marker.exists()


def test_failed_tests_parses_the_summary() -> None:
    out = ("FAILED ../tree/tests/a.py::test_x - Error: boom\nERROR ../tree/tests/b.py::test_y[p1]\n"
           "FAILED ../tree/tests/a.py::test_x - again\n1 failed")
    assert failed_tests(out) == ["../tree/tests/a.py::test_x", "../tree/tests/b.py::test_y[p1]"]


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "m.toml"
    block = '[[mutant]]\nid = "a"\nfile = "f"\nfind = "x"\nreplace = "y"\ntests = ["t"]\n'
    p.write_text(block + "\n" + block)
    with pytest.raises(ValueError, match="appears twice"):
        load_mutants(p)


def test_every_listed_mutant_still_applies_to_the_tree() -> None:
    """A mutant whose snippet no longer appears (the code moved on) mutates nothing: the
    suite says so at once, naming it, instead of the gate at the end of the run."""
    repo = Path(__file__).resolve().parents[2]
    stale = [
        m.id for m in load_mutants(repo / "tests" / "mutants.toml")
        if (repo / m.file).read_text().count(m.find) != 1
    ]
    assert stale == [], f"stale mutants (their find snippet is not in their file exactly once): {stale}"


def test_an_overrunning_run_is_interrupted_so_its_fixtures_tear_down(repo: Path) -> None:
    """A run past its deadline gets Ctrl-C, not SIGKILL: its fixtures stop what they
    started (a server left running would outlive the gate)."""
    marker = repo.parent / "torn-down"
    (repo / "tests" / "test_hang.py").write_text(textwrap.dedent(f"""
        import time
        from pathlib import Path
        from collections.abc import Iterator

        import pytest

        @pytest.fixture
        def server() -> Iterator[None]:
            yield
            Path({str(marker)!r}).touch()

        def test_hang(server: None) -> None:
            time.sleep(600)
    """))
    outcomes = run_gate(repo, _killed_mutant_runs(repo, "tests/test_hang.py"), jobs=1, timeout_s=5,
                        check_baseline=False)
    assert len(outcomes) == 1
    assert marker.exists(), "the overrun run was killed before its fixtures tore down"
