"""Benchmark harness: the tail visibility run of ``bench_stream.py`` for two versions of
the code, alternating in one session, so that a busy machine loads both alike.

``--base REF`` is a git ref (default ``main``). Its tree is exported once into a
temporary folder and laid out as an installed ``scriba`` package (each library folder
as a subpackage, as ``pyproject.toml``'s ``package-dir`` maps them); a run of the base
puts that folder first on ``PYTHONPATH``, so the benchmark, its children and the bookie
processes all import the base's code (the editable install's finder comes after the
path). A run of the head uses this tree. Both run this tree's ``bench_stream.py`` (the
same measurement of two versions of the library). Each round runs base then head, or head then
base on alternate rounds, each with its own etcd and bookies
(``bench_stream.py --parts tail``: a stream tail and a bare ledger's tail, 1k records/s).

Reported per run: the stream tail's and the bare ledger tail's p50/p99, and the stream
p99 over the ledger p99 of the same run; CPU µs per record of all processes and of the
reader alone; then, per round, head over base for each p99;
and the medians over the rounds. Not a timed test: figures on 2 shared cores vary, and
only the ratios of one session compare.

Run: ``.venv/bin/python benchmarks/ab_tail.py [--base main] [--rounds 4] [--seconds 5]
[--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def export(ref: str, dest: Path) -> Path:
    """``ref``'s tree as an importable ``scriba`` package under ``dest/pkg``; returns ``dest``."""
    tree = dest / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    pkg = dest / "pkg"
    shutil.copytree(tree / dirs["scriba"], pkg / "scriba")
    for name, folder in dirs.items():
        if name != "scriba":
            shutil.copytree(tree / folder, pkg / name.replace(".", "/"))
    return dest


def env_with(pythonpath: str | None) -> dict[str, str]:
    """This process's environment, with ``pythonpath`` (a base's exported tree) first on the path."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return env


def alternate(rounds: int, run_one: Callable[[str], dict[str, Any]], ratio_keys: tuple[str, ...]
              ) -> list[dict[str, dict[str, Any]]]:
    """``rounds`` rounds of ``run_one("base")`` and ``run_one("head")`` (head first on odd
    rounds), each with the head/base ratios of ``ratio_keys``; printed as they come."""
    out: list[dict[str, dict[str, Any]]] = []
    for i in range(rounds):
        one: dict[str, dict[str, Any]] = {}
        for name in ("base", "head") if i % 2 == 0 else ("head", "base"):
            one[name] = run_one(name)
            print(f"round {i + 1} {name}: {json.dumps(one[name])}", flush=True)
        one["head/base"] = {key: round(one["head"][key] / one["base"][key], 3) for key in ratio_keys}
        print(f"round {i + 1} head/base: {json.dumps(one['head/base'])}", flush=True)
        out.append(one)
    return out


def report(rounds: list[dict[str, dict[str, Any]]], base: str, json_path: str | None) -> None:
    """The medians over the rounds (printed; with ``json_path`` also written there, with the rounds)."""
    medians = {name: {key: round(statistics.median(r[name][key] for r in rounds), 3) for key in rounds[0][name]}
               for name in ("base", "head", "head/base")}
    print(f"medians over {len(rounds)} rounds (base {base}; 2 shared cores: figures vary):")
    for name, m in medians.items():
        print(f"  {name:9} {json.dumps(m)}")
    if json_path:
        Path(json_path).write_text(json.dumps({"base": base, "rounds": rounds, "medians": medians}, indent=1))


def run(bench: Path, pythonpath: str | None, seconds: float) -> dict[str, Any]:
    env = env_with(pythonpath)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run([sys.executable, str(bench), "--seconds", str(seconds), "--parts", "tail",
                               "--json", out.name], env=env, capture_output=True, text=True, timeout=seconds * 4 + 600)
        if done.returncode != 0:
            raise RuntimeError(f"bench_stream failed ({done.returncode}):\n{done.stderr[-3000:]}")
        r = json.loads(Path(out.name).read_text())
    s, led = r["tail"], r["ledger_tail"]
    return {"stream_p50_ms": s["p50_ms"], "stream_p99_ms": s["p99_ms"], "ledger_p50_ms": led["p50_ms"],
            "ledger_p99_ms": led["p99_ms"], "stream_over_ledger_p99": round(s["p99_ms"] / led["p99_ms"], 3),
            # CPU µs per record of the writer, the reader and the bookies while records flowed
            "stream_cpu_us": s["cpu_us_per_record"], "ledger_cpu_us": led["cpu_us_per_record"],
            "stream_reader_cpu_us": s["reader_cpu_us_per_record"], "ledger_reader_cpu_us": led["reader_cpu_us_per_record"]}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--base", default="main", help="the git ref to compare against")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ab-tail-") as tmp:
        base = export(args.base, Path(tmp))
        bench = ROOT / "benchmarks" / "bench_stream.py"  # one measurement, two versions of the library
        variants = {"base": (bench, str(base / "pkg")), "head": (bench, None)}
        rounds = alternate(args.rounds, lambda name: run(*variants[name], args.seconds),
                           ("stream_p99_ms", "ledger_p99_ms", "stream_cpu_us", "ledger_cpu_us",
                            "stream_reader_cpu_us", "ledger_reader_cpu_us"))
    report(rounds, args.base, args.json)

if __name__ == "__main__":
    main(sys.argv[1:])
