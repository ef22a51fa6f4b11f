"""Run every benchmark script in benchmarks/, one after the other (`make bench`).

The order is fixed for the known scripts (target_core, inline_data, digests,
copy_offload, network_matrix, scaling); any other benchmarks/*.py (but this one)
runs after them, in name order, except crc32c_libs: it compares CRC32C packages
that only its own throwaway venv holds (see its docstring), so it runs only when
named with --only. With --quick each script gets its own --quick
(a script without one, such as target_core.py, gets its shortest settings
instead). Each script runs with this interpreter from the repository root; the
exit status is non-zero if any of them failed. copy_offload and network_matrix
need root (network namespaces).

    python3 benchmarks/run_all.py [--quick] [--only scaling,digests] [--stop-on-failure]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ORDER = ["target_core", "inline_data", "digests", "copy_offload", "network_matrix", "scaling"]
# What --quick becomes for scripts that have no --quick option.
QUICK_FALLBACK = {"target_core": ["--runtime", "1", "--repeat", "1"]}
# Scripts that need an environment of their own (a venv, a QEMU guest): run only when
# named with --only.
ON_REQUEST = {"crc32c_libs", "tls_guest"}


def scripts() -> list[Path]:
    known = [HERE / f"{name}.py" for name in ORDER if (HERE / f"{name}.py").exists()]
    others = sorted(
        p
        for p in HERE.glob("*.py")
        if p.stem not in ORDER and p.resolve() != Path(__file__).resolve()
    )
    return known + others


def arguments(script: Path, quick: bool) -> list[str]:
    if not quick:
        return []
    if '"--quick"' in script.read_text():
        return ["--quick"]
    return QUICK_FALLBACK.get(script.stem, [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    parser.add_argument("--only", help="comma-separated script names (without .py) to run")
    parser.add_argument(
        "--stop-on-failure", action="store_true", help="stop at the first failing script"
    )
    args = parser.parse_args()
    selected = scripts()
    if not args.only:
        selected = [p for p in selected if p.stem not in ON_REQUEST]
    else:
        wanted = {name.strip().removesuffix(".py") for name in args.only.split(",")}
        unknown = wanted - {p.stem for p in selected}
        if unknown:
            parser.error(f"no such benchmark: {', '.join(sorted(unknown))}")
        selected = [p for p in selected if p.stem in wanted]

    outcomes: list[tuple[str, int, float]] = []
    for script in selected:
        cmd = [sys.executable, str(script.relative_to(REPO)), *arguments(script, args.quick)]
        print(f"\n=== {' '.join(cmd)}", flush=True)
        started = time.perf_counter()
        try:
            code = subprocess.run(cmd, cwd=REPO, check=False).returncode
        except KeyboardInterrupt:
            outcomes.append((script.stem, 130, time.perf_counter() - started))
            break
        outcomes.append((script.stem, code, time.perf_counter() - started))
        if code and args.stop_on_failure:
            break

    print("\n=== summary")
    width = max((len(name) for name, _, _ in outcomes), default=0)
    for name, code, seconds in outcomes:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"{name:<{width}}  {seconds:7.1f} s  {status}")
    not_run = [p.stem for p in selected][len(outcomes) :]
    if not_run:
        print(f"not run: {', '.join(not_run)}")
    failed = [name for name, code, _ in outcomes if code]
    return 1 if failed or not_run else 0


if __name__ == "__main__":
    sys.exit(main())
