"""`make blktests`: blktests' nvme group in a Linux guest, against the kernel's nvmet and
against pynvmf, side by side.

blktests is in no package archive this project installs from, so BLKTESTS_DIR names a
checkout (https://github.com/linux-blktests/blktests). The harness copies it, applies
contrib/blktests/blktests-target-control.patch (unless --no-patch: it makes blktests pass
TLS settings and host key, hash and DH group changes to NVME_TARGET_CONTROL, which
master writes to the local nvmet's configfs only), builds its helper programs here
(static), boots one guest (the newest kernel peer blktests.guest knows, or --peer) and
runs each test of the group with NVMET_TRTYPES=tcp (or, with --trtype rdma, over
soft-RoCE in the guest: tests/blktests/rdma.py) against each target in turn:

- ``nvmet``: blktests' own default, the guest kernel's nvmet on 127.0.0.1, configured by
  blktests itself through configfs;
- ``nvmet-control``: the same nvmet, configured through contrib/blktests/nvmet-target-control
  (the NVME_TARGET_CONTROL code paths, as for any external target);
- ``pynvmf``: ``pynvmf target --empty --rpc-listen`` on this machine, reached from the guest
  at 10.0.2.2 (user-mode networking), through contrib/blktests/nvme-target-control.

Each test runs alone (``./check nvme/NNN`` under ``timeout``), so one that hangs costs
its own time only. The results (per target: status, reason, runtime, what a failed test
printed) go to ``--out`` as JSON, and the table (test, nvmet, nvmet-control, pynvmf,
why) to ``--out``/blktests.md; ``--notes FILE`` (JSON: test -> why; default
tests/blktests/notes.json, what docs/blktests.md says) fills the last column.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.blktests import rdma
from tests.blktests.guest import PEERS
from tests.support.guest import Guest
from tests.support.guest_assets import TLSHD_CONF
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

log = logging.getLogger("blktests")

REPO = Path(__file__).resolve().parents[2]
CONTRIB = REPO / "contrib" / "blktests"
PATCH = CONTRIB / "blktests-target-control.patch"
NOTES = Path(__file__).resolve().parent / "notes.json"
# The "why" column per transport: over RDMA the tests' reasons differ (TLS is TCP's).
NOTES_BY_TRTYPE = {"tcp": NOTES, "rdma": NOTES.with_name("notes-rdma.json")}
TARGETS = ("nvmet", "nvmet-control", "pynvmf")
TRTYPES = ("tcp", "rdma")
GUEST_TREE = "/tmp/blktests"
GUEST_CONTROL = "/opt/blktests-control"

# blktests in a guest without systemd as PID 1: what its TLS tests ask systemctl for
# (is tlshd there, start it, stop it), done by hand.
SYSTEMCTL = r"""#!/bin/sh
# systemctl for blktests in the pynvmf guest (no systemd running): tlshd only.
unit=""
for a in "$@"; do case "$a" in -*) ;; *) unit="$a" ;; esac; done
case "$1" in
list-unit-files) echo "tlshd.service enabled" ;;
is-active) pgrep -x "${unit%.service}" > /dev/null; exit ;;
start) [ "${unit%.service}" = tlshd ] && { tlshd -c /etc/tlshd.conf > /tmp/tlshd.log 2>&1 & } ;;
stop) [ "${unit%.service}" = tlshd ] && pkill -x tlshd ;;
--version) echo "systemd 257 (a stand-in)" ;;
*) echo "systemctl stand-in: $* is not handled" >&2; exit 1 ;;
esac
exit 0
"""


# blktests' settings for every target; what the control scripts add is below.
CONFIG_COMMON = {
    "NVMET_TRTYPES": "tcp",
    # One backend for all three (the control scripts offer "device"); tests that ask for
    # --blkdev file get a file from nvmet either way.
    "NVMET_BLKDEV_TYPES": "device",
}


def trtype_settings(trtype: str) -> dict[str, str]:
    """blktests' settings for a transport, on top of CONFIG_COMMON."""
    return dict(rdma.SETTINGS) if trtype == "rdma" else {}


@dataclass
class Result:
    test: str
    status: str  # pass, fail, not run, timeout
    reason: str = ""  # why it failed (output, exit, dmesg) or was not run
    runtime: str = ""
    detail: str = ""  # the diff of a failed test's output, trimmed


@dataclass
class Run:
    target: str
    results: dict[str, Result] = field(default_factory=dict)
    seconds: float = 0.0


# -- the blktests tree ----------------------------------------------------------------------


def _git(tree: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def blktests_version(tree: Path) -> dict[str, str]:
    return {
        "commit": _git(tree, "rev-parse", "HEAD") or "unknown (not a git checkout)",
        "date": _git(tree, "log", "-1", "--format=%cs"),
        "subject": _git(tree, "log", "-1", "--format=%s"),
    }


def prepare_tree(source: Path, work: Path, patch: bool) -> Path:
    """A copy of the checkout, patched, with its helper programs built (static, so the
    guest's C library does not matter)."""
    tree = work / "blktests"
    shutil.copytree(source, tree, ignore=shutil.ignore_patterns(".git", "results"))
    if patch:
        subprocess.run(
            ["patch", "-p1", "--quiet", "--forward", "-i", str(PATCH)], cwd=tree, check=True
        )
    # A helper that does not build (missing headers) only fails the tests that use it.
    subprocess.run(
        ["make", "-k", "-C", "src", "LDFLAGS=-static"],
        cwd=tree,
        capture_output=True,
        check=False,
    )
    return tree


def group_tests(tree: Path, selection: list[str]) -> list[str]:
    """Test names (nvme/003 ...) of a selection of groups and tests."""
    names: list[str] = []
    for item in selection:
        if "/" in item:
            names.append(item)
            continue
        names += sorted(
            f"{item}/{p.name}"
            for p in (tree / "tests" / item).iterdir()
            if re.fullmatch(r"\d{3}", p.name)
        )
    return names


def _tarball(files: dict[str, Path | bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, what in files.items():
            if isinstance(what, Path):
                tar.add(what, arcname=name)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(what)
                info.mode = 0o755
                tar.addfile(info, io.BytesIO(what))
    return buf.getvalue()


# -- the guest side -------------------------------------------------------------------------


def target_exports(
    target: str, trtype: str, img_size: str, machine_rpc: str = "", nvme_port: int = 0
) -> dict[str, str]:
    """What a target's control script is told. Over TCP pynvmf runs on this machine
    (its RPC at machine_rpc as the guest reaches it, listening on 127.0.0.1:nvme_port);
    over RDMA, in the guest (rdma.exports)."""
    if trtype == "rdma":
        return rdma.exports(target, img_size)
    if target == "pynvmf":
        return {
            "PYNVMF_RPC": machine_rpc,
            "PYNVMF_TRSVCID": str(nvme_port),
            "PYNVMF_LISTEN": f"127.0.0.1:{nvme_port}",
            "NVME_IMG_SIZE": img_size,
        }
    if target == "nvmet-control":
        return {"NVME_IMG_SIZE": img_size}
    return {}


def _config(target: str, settings: dict[str, str], exports: dict[str, str]) -> str:
    lines = [f"{k}={shlex.quote(v)}" for k, v in {**CONFIG_COMMON, **settings}.items()]
    if target != "nvmet":
        script = "nvmet-target-control" if target == "nvmet-control" else "nvme-target-control"
        lines.append(f"NVME_TARGET_CONTROL={GUEST_CONTROL}/{script}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
    return "\n".join(lines) + "\n"


_RESULT = re.compile(r"^(\w+)\t(.*)$", re.MULTILINE)


def parse_results(
    test: str, files: dict[str, str], console: str, device_test: bool = False
) -> Result:
    """A test's outcome from blktests' results file (key<TAB>value lines), its .out.bad,
    and what ./check printed (the reasons of a test not run)."""
    record = files.get("record", "")
    values = dict(_RESULT.findall(record))
    status = values.get("status", "")
    if status == "pass" or status == "passed":
        status = "pass"
    result = Result(test, status or "unknown", values.get("reason", ""), values.get("runtime", ""))
    if not record and device_test:
        # blktests runs a test_device() test once per TEST_DEVS entry; there are none.
        return Result(test, "not run", "needs a test device (TEST_DEVS: none here)")
    if result.status == "not run":
        m = re.search(r"\[not run\]\n((?:    .*\n?)+)", console)
        reasons = [line.strip() for line in m.group(1).splitlines()] if m else []
        # (check prints the last run's runtime among the reasons)
        result.reason = "; ".join(r for r in reasons if not r.startswith("runtime"))
    if result.status == "fail":
        result.detail = files.get("diff", "")[-3000:]
    elif result.status == "unknown":
        result.detail = console[-3000:]  # no record: what ./check said instead
    return result


def run_target(
    guest: Guest,
    target: str,
    tests: list[str],
    config: str,
    test_timeout: float,
    device_tests: set[str],
) -> Run:
    run = Run(target)
    started = time.monotonic()
    guest.write_file(f"{GUEST_TREE}/config", config)
    guest.run(f"rm -rf {GUEST_TREE}/results")
    for test in tests:
        t0 = time.monotonic()
        out = guest.run(
            # The TLS PSKs earlier tests put in the kernel's keyring go first: the host
            # offers the first one that matches, which an external target may not have.
            f"for k in $(keyctl rlist %:.nvme); do keyctl unlink $k %:.nvme; done;"
            f" cd {GUEST_TREE} && timeout -k 30 {int(test_timeout)} ./check {test} 2>&1",
            timeout=test_timeout + 90,
            check=False,
        )
        # The record of the last condition run (tr=tcp ...), its .out.bad and diff.
        files = guest.run(
            f"cd {GUEST_TREE}/results && f=$(ls -t */{test} 2>/dev/null | head -1);"
            ' [ -n "$f" ] && cat "$f"; echo "__DIFF__";'
            f' [ -f "$f.out.bad" ] && diff -u {GUEST_TREE}/tests/{test}.out "$f.out.bad"',
            check=False,
        ).output
        record, _, diff = files.partition("__DIFF__\n")
        if out.rc == 124 or out.rc == 137:
            result = Result(test, "timeout", f"no end within {test_timeout:.0f} s")
        else:
            result = parse_results(
                test, {"record": record, "diff": diff}, out.output, test in device_tests
            )
        run.results[test] = result
        log.info(
            "%s %s: %s %s (%.0f s)",
            target,
            test,
            result.status,
            result.reason,
            time.monotonic() - t0,
        )
    run.seconds = time.monotonic() - started
    return run


# -- the table ------------------------------------------------------------------------------

_SHOW = {
    "pass": "pass",
    "fail": "FAIL",
    "not run": "not run",
    "timeout": "TIMEOUT",
    "unknown": "no record",
}


def _cell(result: Result | None) -> str:
    if result is None:
        return "—"
    text = _SHOW.get(result.status, result.status)
    if result.status == "fail" and result.reason:
        text += f" ({result.reason})"
    return text


def table(runs: list[Run], notes: dict[str, str]) -> str:
    tests = sorted({t for run in runs for t in run.results})
    head = ["test", *(run.target for run in runs), "why"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for test in tests:
        cells = [_cell(run.results.get(test)) for run in runs]
        why = notes.get(test, "")
        if not why:
            present = [r.results[test] for r in runs if test in r.results]
            skipped = {r.reason for r in present}
            if all(r.status == "not run" for r in present):
                why = "not run: " + "; ".join(sorted(s for s in skipped if s))
        rows.append("| " + " | ".join([test, *cells, why.replace("|", "\\|")]) + " |")
    return "\n".join(rows) + "\n"


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make blktests", description=__doc__.splitlines()[0])
    ap.add_argument("--blktests-dir", default=os.environ.get("BLKTESTS_DIR", ""))
    ap.add_argument("--peer", default="", help=f"one of {', '.join(PEERS)} (default: newest)")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--tests", default="nvme", help="groups and tests, comma-separated")
    ap.add_argument(
        "--trtype",
        choices=TRTYPES,
        default="tcp",
        help="NVMET_TRTYPES: rdma runs every target in the guest, over soft-RoCE",
    )
    ap.add_argument("--test-timeout", type=float, default=900)
    ap.add_argument("--img-size", default="1G", help="blktests' NVME_IMG_SIZE")
    ap.add_argument("--timeout", default="30", help="blktests' TIMEOUT (timed tests' fio)")
    ap.add_argument("--no-patch", action="store_true")
    ap.add_argument("--target-args", default="", help="more `pynvmf target` arguments")
    ap.add_argument("--out", default=str(REPO / "build" / "blktests"))
    ap.add_argument(
        "--notes",
        default="",
        help="JSON: test -> why, the table's last column (default: the one docs/blktests.md's"
        " table for --trtype has)",
    )
    ap.add_argument(
        "--render",
        nargs="+",
        default=[],
        metavar="DIR",
        help="write the table of earlier runs (the JSON files --out left) and stop",
    )
    args = ap.parse_args(argv)
    notes_file = Path(args.notes or NOTES_BY_TRTYPE[args.trtype])
    notes = json.loads(notes_file.read_text()) if notes_file.is_file() else {}
    if args.render:
        print(render([Path(d) for d in args.render], notes))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.blktests_dir:
        ap.error(
            "BLKTESTS_DIR (or --blktests-dir) must name a blktests checkout:"
            " git clone https://github.com/linux-blktests/blktests"
        )
    source = Path(args.blktests_dir).resolve()
    if not (source / "check").is_file():
        ap.error(f"{source} is not a blktests checkout (no ./check)")
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"--targets: {t!r} is not one of {', '.join(TARGETS)}")
    peer = PEERS[args.peer or list(PEERS)[-1]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="pynvmf-blktests-") as tmp:
        work = Path(tmp)
        tree = prepare_tree(source, work, patch=not args.no_patch)
        tests = group_tests(tree, args.tests.split(","))
        device_tests = {t for t in tests if "test_device()" in (tree / "tests" / t).read_text()}
        bundle = _tarball(
            {
                "blktests": tree,
                "control/nvme-target-control": CONTRIB / "nvme-target-control",
                "control/nvmet-target-control": CONTRIB / "nvmet-target-control",
                "control/blktests_control.py": CONTRIB / "blktests_control.py",
            }
        )
        rpc_port, nvme_port = free_tcp_port(), free_tcp_port()
        target: TargetProcess | None = None
        if "pynvmf" in targets and args.trtype == "tcp":
            target = TargetProcess(
                None,
                work,
                ["--empty", "--rpc-listen", f"127.0.0.1:{rpc_port}", *args.target_args.split()],
            )
            target.start()
        settings = {
            "NVME_IMG_SIZE": args.img_size,
            "TIMEOUT": args.timeout,
            **trtype_settings(args.trtype),
        }
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "pynvmf_commit": _git(REPO, "rev-parse", "--short", "HEAD"),
            "pynvmf_dirty": bool(_git(REPO, "status", "--porcelain", "--untracked-files=no")),
            "blktests": blktests_version(source),
            "patched": not args.no_patch,
            "peer": peer.name,
            "command": "make blktests " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
            "settings": settings,
        }
        runs: list[Run] = []
        try:
            with Guest(
                peer=peer,
                memory_mb=3072,
                boot_timeout=300,
                extra_files={
                    "/usr/local/sbin/systemctl": SYSTEMCTL,
                    "/etc/tlshd.conf": TLSHD_CONF,
                },
            ) as guest:
                guest.write_file("/tmp/blktests.tgz", bundle)
                guest.run(
                    f"mkdir -p {GUEST_CONTROL} && tar -xzf /tmp/blktests.tgz -C /tmp"
                    f" && mv /tmp/control/* {GUEST_CONTROL}/ && chmod 755 {GUEST_CONTROL}/*"
                    " && chmod 755 /usr/local/sbin/systemctl"
                    " && (mountpoint -q /sys/kernel/config"
                    " || mount -t configfs configfs /sys/kernel/config)"
                    " && (mountpoint -q /sys/kernel/debug"
                    " || mount -t debugfs debugfs /sys/kernel/debug)"
                    " && modprobe nvme-tcp && rm -f /etc/nvme/hostnqn /etc/nvme/hostid"
                    # What udev would make, and bash's process substitution needs.
                    " && ln -sfn /proc/self/fd /dev/fd",
                    timeout=300,
                )
                meta["kernel"] = guest.run("uname -r").output.strip()
                meta["nvme_cli"] = guest.run("nvme version | head -2 | tr '\\n' ' '").output.strip()
                if args.trtype == "rdma":
                    rdma.prepare(guest)
                for name in targets:
                    exports = target_exports(
                        name,
                        args.trtype,
                        args.img_size,
                        f"{guest.host_address}:{rpc_port}",
                        nvme_port,
                    )
                    if args.trtype == "rdma" and name != "nvmet":
                        rdma.ensure_soft_roce(guest)
                    if args.trtype == "rdma" and name == "pynvmf":
                        rdma.start_target(guest, args.target_args.split())
                    config = _config(name, settings, exports)
                    try:
                        run = run_target(
                            guest, name, tests, config, args.test_timeout, device_tests
                        )
                    finally:
                        if args.trtype == "rdma" and name == "pynvmf":
                            (out / "pynvmf-target.log").write_text(rdma.stop_target(guest))
                    runs.append(run)
                    (out / f"{name}.json").write_text(
                        json.dumps(
                            {
                                "meta": meta,
                                "seconds": run.seconds,
                                "results": {t: asdict(r) for t, r in run.results.items()},
                            },
                            indent=1,
                        )
                    )
        finally:
            if target is not None:
                target.stop(expect=None)
                (out / "pynvmf-target.log").write_text(target.stderr())
    text = _report(meta, runs, notes)
    (out / "blktests.md").write_text(text)
    print(text)
    return 0


def render(dirs: list[Path], notes: dict[str, str]) -> str:
    """The report of runs saved by earlier invocations (one JSON file per target and run),
    in TARGETS' order; a later directory's result for a test replaces an earlier one's
    (a rerun of some tests), and each run is listed with what it ran."""
    runs: dict[str, Run] = {}
    heads: list[str] = []
    for d in dirs:
        ran = []
        for path in sorted(d.glob("*.json")):
            saved = json.loads(path.read_text())
            run = runs.setdefault(path.stem, Run(path.stem))
            run.results.update({t: Result(**r) for t, r in saved["results"].items()})
            run.seconds += saved["seconds"]
            ran.append(f"{path.stem} {len(saved['results'])} tests {saved['seconds'] / 60:.0f} min")
            meta = saved["meta"]
        if ran:
            heads.append(_head(meta) + "\n" + "Ran: " + ", ".join(ran))
    ordered = [runs[name] for name in TARGETS if name in runs]
    return "\n\n".join([*heads, table(ordered, notes)])


def _head(meta: dict) -> str:
    bt = meta["blktests"]
    return "\n".join(
        [
            f"Date {meta['date']}; pynvmf {meta['pynvmf_commit']}"
            + (" (with uncommitted changes)" if meta["pynvmf_dirty"] else "")
            + f"; blktests {bt['commit'][:12]} ({bt['date']}: {bt['subject']})"
            + (", with contrib/blktests/blktests-target-control.patch" if meta["patched"] else "")
            + f"; guest kernel {meta.get('kernel', '?')} ({meta['peer']}),"
            + f" {meta.get('nvme_cli', '')}",
            f"Command: `{meta['command']}`; settings {meta['settings']}",
        ]
    )


def _report(meta: dict, runs: list[Run], notes: dict[str, str]) -> str:
    times = ", ".join(f"{r.target} {r.seconds / 60:.0f} min" for r in runs)
    return f"{_head(meta)}\nTime per target: {times}\n\n{table(runs, notes)}"


if __name__ == "__main__":
    sys.exit(main())
