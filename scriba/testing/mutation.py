"""A mutation gate: semantic mutants of the safety rules that the fast suites must kill.

A *mutant* is one small change to the code that breaks a rule the project promises
(``>=`` for ``>`` in the ack rule, a fence flag dropped, an fsync error retried, ...),
written as an exact snippet of the source and its mutated form. The gate applies each
mutant alone to a private copy of the tree and runs the tests the mutant names; the
mutant is *killed* when they fail, *survives* when they pass. A surviving mutant is a
missing test, so the gate fails and prints the mutant's diff.

The copy: the repository's files are copied to a scratch directory, and the library
folders are laid out there as the installed package (``scriba/``, ``scriba/client``,
...) on ``PYTHONPATH``, so the tests, and every process they start, import the mutated
copy and never the working tree. The working tree is never written.

Mutants live in a TOML file (``tests/mutants.toml``)::

    [[mutant]]
    id = "ack-quorum-off-by-one"
    file = "scriba/quorum.py"
    find = "acks >= ack_quorum_size"      # must occur exactly once in the file
    replace = "acks > ack_quorum_size"
    tests = ["tests/test_quorum.py"]     # pytest arguments (files, -k expressions)
    why = "an entry confirmed by one ack too few or too many"

A ``find`` that no longer occurs exactly once is a *stale* mutant: the gate fails and
says so, so the list cannot rot silently when the code moves.

Run: ``python -m scriba.testing.mutation tests/mutants.toml [--jobs 2] [--only ID]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

# Library folders that install as subpackages of ``scriba`` (pyproject's package-dir).
_LAYER_DIRS = (
    "meta", "placement", "bookie", "client", "stream", "rsm", "geo",
    "autorecovery", "pipeline", "console", "examples",
)
_PYTEST_EXIT_TESTS_FAILED = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "killed" | "survived" | "stale" | "error"
    elapsed_s: float
    detail: str = ""


def load_mutants(path: Path) -> list[Mutant]:
    with path.open("rb") as f:
        data = tomllib.load(f)
    mutants = []
    seen: set[str] = set()
    for raw in data.get("mutant", []):
        m = Mutant(
            id=str(raw["id"]), file=str(raw["file"]), find=str(raw["find"]),
            replace=str(raw["replace"]), tests=tuple(str(t) for t in raw["tests"]),
            why=str(raw.get("why", "")),
        )
        if m.id in seen:
            raise ValueError(f"mutant id {m.id!r} appears twice in {path}")
        if m.find == m.replace:
            raise ValueError(f"mutant {m.id!r}: find and replace are equal")
        seen.add(m.id)
        mutants.append(m)
    return mutants


def _copy_tree(repo: Path, dest: Path) -> None:
    """Copy the repository's files (git's view, untracked but not ignored included)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.split(b"\0")
    for raw in listing:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = repo / rel
        if not src.is_file():
            continue  # deleted in the work tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def package_view(tree: Path, view: Path) -> None:
    """Lay the copied tree out as the installed package: view/scriba/<layer> -> tree/<layer>."""
    (view / "scriba").mkdir(parents=True)
    for entry in (tree / "scriba").iterdir():
        (view / "scriba" / entry.name).symlink_to(entry)
    for layer in _LAYER_DIRS:
        if (tree / layer / "__init__.py").exists():
            (view / "scriba" / layer).symlink_to(tree / layer)


class Workspace:
    """One private copy of the tree in which mutants are applied one at a time."""

    def __init__(self, repo: Path, root: Path) -> None:
        self.tree = root / "tree"
        self.view = root / "view"
        _copy_tree(repo, self.tree)
        package_view(self.tree, self.view)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.view), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["SCRIBA_MUTATION_RUN"] = "1"
        return env

    def pytest(self, args: Sequence[str], timeout_s: float, *, first_failure: bool = True,
               tail_lines: int = 15) -> tuple[int, str]:
        # The package view is the working directory, so ``python -m`` here and in every
        # child puts the mutated package first on sys.path (the tree's own ``scriba/``
        # folder lacks the layers and would fall through to the installed package).
        paths = [str(self.tree / a) if (self.tree / a.split("::")[0]).exists() else a
                 for a in args]
        cmd = [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
            *(["-x"] if first_failure else []), "--no-header", f"--rootdir={self.tree}", "-c", str(self.tree / "pyproject.toml"),
            "-o", "addopts=--strict-markers", "-o", "timeout=60", *paths,
        ]
        with subprocess.Popen(
            cmd, cwd=self.view, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ) as proc:
            try:
                out, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                late = _interrupt(proc).strip().splitlines()[-tail_lines:]
                return -1, "\n".join([*late, f"timed out after {timeout_s:.0f} s"])
        tail = "\n".join(out.strip().splitlines()[-tail_lines:])
        return proc.returncode, tail

    def run(self, mutant: Mutant, timeout_s: float) -> Outcome:
        started = time.monotonic()
        path = self.tree / mutant.file
        if not path.is_file():
            return Outcome(mutant, "stale", 0.0, f"{mutant.file} does not exist")
        original = path.read_text()
        count = original.count(mutant.find)
        if count != 1:
            return Outcome(mutant, "stale", 0.0, f"snippet found {count} times in {mutant.file}")
        path.write_text(original.replace(mutant.find, mutant.replace))
        try:
            code, tail = self.pytest(mutant.tests, timeout_s)
        finally:
            path.write_text(original)
        elapsed = time.monotonic() - started
        if code == _PYTEST_EXIT_TESTS_FAILED or code == -1:
            return Outcome(mutant, "killed", elapsed)
        if code == 0:
            return Outcome(mutant, "survived", elapsed, tail)
        # 2 interrupted, 3 internal error, 4 usage error, 5 no tests: not a kill
        return Outcome(mutant, "error", elapsed, f"pytest exit {code}\n{tail}")


def mutant_diff(m: Mutant, tree: Path) -> str:
    original = (tree / m.file).read_text()
    mutated = original.replace(m.find, m.replace)
    return "".join(difflib.unified_diff(
        original.splitlines(keepends=True), mutated.splitlines(keepends=True),
        fromfile=f"a/{m.file}", tofile=f"b/{m.file}", n=2,
    ))


def failed_tests(output: str) -> list[str]:
    """The node ids of pytest's ``FAILED``/``ERROR`` summary lines, each once, in order."""
    found = re.findall(r"^(?:FAILED|ERROR) (\S+::\S+)", output, flags=re.MULTILINE)
    return list(dict.fromkeys(found))


def _interrupt(proc: subprocess.Popen[str], grace_s: float = 60.0) -> str:
    """Stop a pytest run that overran as Ctrl-C would: its fixtures tear down and stop the
    servers they started (a SIGKILL would leave them running); SIGKILL after ``grace_s``.
    Returns what it printed (where it was when stopped)."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def check_baseline_passes(ws: Workspace, files: Sequence[str], timeout_s: float) -> None:
    """Every test the mutants name passes unmutated, or the gate cannot judge a kill.

    A test that fails once and then passes alone is reported as flaky (the suite that
    ran before the gate judges flakiness; the gate needs only a tree in which the tests
    can pass). One that fails twice, or a run that fails outside any test, ends the gate.
    """
    # every mutant's tests in one run (about 8 min on 2 quiet cores at 170 mutants): the
    # deadline only guards against a hang
    code, tail = ws.pytest(files, timeout_s * 15, first_failure=False, tail_lines=400)
    if code == 0:
        return
    failed = failed_tests(tail)
    if code != _PYTEST_EXIT_TESTS_FAILED or not failed:
        raise SystemExit(f"mutation gate: the unmutated tests fail (exit {code}):\n{tail}")
    code, again = ws.pytest(failed, timeout_s * 2, first_failure=False)
    if code != 0:
        raise SystemExit(f"mutation gate: the unmutated tests fail twice (exit {code}):\n{again}")
    print("mutation gate: flaky unmutated tests (failed once, passed alone):", *failed, sep="\n  ",
          flush=True)


def run_gate(
    repo: Path, mutants: Sequence[Mutant], *, jobs: int, timeout_s: float, check_baseline: bool
) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="scriba-mutation-") as scratch:
        workspaces = [Workspace(repo, Path(scratch) / f"w{i}") for i in range(max(1, jobs))]
        if check_baseline:
            # the files the mutants name (selectors such as ``-k expr`` narrow a mutant's run,
            # but the baseline runs the whole files: every test there must pass unmutated)
            union = sorted({t.split("::")[0] for m in mutants for t in m.tests
                            if (repo / t.split("::")[0]).exists()})
            check_baseline_passes(workspaces[0], union, timeout_s)
        free: list[Workspace] = list(workspaces)
        outcomes: list[Outcome] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(workspaces)) as pool:
            pending: dict[concurrent.futures.Future[Outcome], Workspace] = {}
            queue = list(mutants)
            while queue or pending:
                while queue and free:
                    ws = free.pop()
                    pending[pool.submit(ws.run, queue.pop(0), timeout_s)] = ws
                done, _ = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for fut in done:
                    free.append(pending.pop(fut))
                    outcome = fut.result()
                    outcomes.append(outcome)
                    print(f"{outcome.verdict:8} {outcome.elapsed_s:5.1f}s  {outcome.mutant.id}",
                          flush=True)
                    if outcome.verdict != "killed":
                        print(mutant_diff(outcome.mutant, workspaces[0].tree)
                              if outcome.verdict != "stale" else "", end="")
                        print(outcome.detail, flush=True)
        return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scriba.testing.mutation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mutants", type=Path, help="the TOML list of mutants")
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per mutant")
    parser.add_argument("--only", action="append", default=[], help="run only these ids")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the check that the unmutated tests pass")
    args = parser.parse_args(argv)
    mutants = load_mutants(args.mutants)
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            parser.error(f"unknown mutant ids: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    started = time.monotonic()
    outcomes = run_gate(args.repo.resolve(), mutants, jobs=args.jobs, timeout_s=args.timeout_s,
                        check_baseline=not args.no_baseline)
    bad = [o for o in outcomes if o.verdict != "killed"]
    print(f"mutation gate: {len(outcomes) - len(bad)} of {len(outcomes)} mutants killed "
          f"in {time.monotonic() - started:.0f} s")
    for o in bad:
        print(f"  {o.verdict}: {o.mutant.id} ({o.mutant.file}) — {o.mutant.why}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
