#!/usr/bin/env bash
# xfstests (fstests), the Linux filesystem test suite, on journalfs, bindfs and native ext4,
# side by side: the fixed sample of quick-group generic tests, then a table and JSON.
#
#   sudo bench/xfstests.sh [TARGET...]        TARGETs: journalfs bindfs ext4 (default: all)
#
# Needs root (loop devices, mounts, the users the suite expects), the Debian packages in
# bootstrap.sh's XFSTESTS_PACKAGES (`bash bootstrap.sh install` installs them), and the suite,
# which stays outside the repository: XFSTESTS_DIR, else where tests/suites.py looks
# ($JOURNALFS_XFSTESTS, $JOURNALFS_SHARED/conformance/xfstests, ../shared/conformance/xfstests),
# holding xfstests-src.tar.gz, xfstests-fuse.patch (the two changes a FUSE passthrough needs)
# and sample.txt. Without either it says why in one line and exits 77 (skipped).
# tests/test_xfstests.py runs it on journalfs and ext4 with a subset of the tests in CI.
#
# Environment (all optional):
#   XFSTESTS_WORK   loop images, results             (default /tmp/journalfs-xfstests)
#   XFSTESTS_BUILD  where builds are kept, one per hash of tarball and patch
#                   (default /tmp/journalfs-xfstests-build)
#   XFSTESTS_TESTS  tests to run instead of sample.txt, e.g. "generic/306 generic/426"
#   XFSTESTS_EXTRA  tests run besides the sample (default: the six issue #27 names)
#   XFSTESTS_TIMEOUT  seconds one target may run      (default 3600)
#   PYTHON          the Python with journalfs's dependencies (default: the repo's .venv)
#
# Everything runs in a private mount namespace in which this tree's mount(8) helper lies over
# /usr/sbin: nothing is installed on the system, and no mount outlives the run. The users the
# suite needs (fsgqa, 123456-fsgqa, fsgqa2) are created if missing and removed by the last
# run to end.
# Output: a table (pass / fail / notrun per target, then every test whose result differs
# between targets) on stdout, and $XFSTESTS_WORK/results.json (per target and test: status,
# reason, seconds, and the files: expected output, .out.bad, .full). The table includes earlier
# runs of the other targets in the same XFSTESTS_WORK on the same tests: after a change to
# journalfs, `bench/xfstests.sh journalfs` compares with the bindfs and ext4 runs already made.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
SKIP=77
skip() { echo "xfstests.sh: skipped: $*"; exit $SKIP; }
die() { echo "xfstests.sh: $*" >&2; exit 1; }

python=${PYTHON:-$here/.venv/bin/python}
[ -x "$python" ] || die "no Python at $python (run bootstrap.sh install, or set PYTHON)"
# where the suite is: tests/suites.py's rules (JOURNALFS_XFSTESTS, JOURNALFS_SHARED,
# ../shared), XFSTESTS_DIR first
[ -z "${XFSTESTS_DIR:-}" ] || export JOURNALFS_XFSTESTS=$XFSTESTS_DIR
suite=$("$python" "$here/tests/suites.py" xfstests xfstests-src.tar.gz) || skip "$suite"
[ "$(id -u)" = 0 ] || skip "needs root (loop devices, mounts, test users)"
# the Debian packages: bootstrap.sh's XFSTESTS_PACKAGES (bindfs for its target, which
# bootstrap.sh installs too)
deps=$(bash -c 'source "$1" >/dev/null && echo "${XFSTESTS_PACKAGES[@]}"' _ "$here/bootstrap.sh")
case " $* " in *" bindfs "*|"  ") deps="$deps bindfs" ;; esac
missing=$(for p in $deps; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null \
          | grep -q "install ok installed" || printf '%s ' "$p"; done)
[ -z "$missing" ] || skip "missing Debian packages: ${missing}(apt-get install them)"

work=${XFSTESTS_WORK:-/tmp/journalfs-xfstests}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(journalfs bindfs ext4)
for t in "${targets[@]}"; do
    case $t in journalfs|bindfs|ext4) ;; *) die "unknown target $t (journalfs, bindfs, ext4)" ;; esac
done
if [ -n "${XFSTESTS_TESTS:-}" ]; then
    tests=$XFSTESTS_TESTS
else
    # the fixed sample, plus the tests issue #27 names that it does not hold: remount
    # (306, 452), open by handle (426, 467, 756), setgid under a default ACL (697)
    tests=$(grep -v '^#' "$suite/sample.txt" | tr '\n' ' ')
    for t in ${XFSTESTS_EXTRA-generic/306 generic/452 generic/426 generic/467 generic/756 generic/697}; do
        case " $tests " in *" $t "*) ;; *) tests="$tests$t " ;; esac
    done
fi
mkdir -p "$work"

# -- build (once per source tarball and patch, shared by every run on this machine) -----------
stamp=$(cat "$suite/xfstests-src.tar.gz" "$suite/xfstests-fuse.patch" | sha1sum | cut -c1-16)
build=${XFSTESTS_BUILD:-/tmp/journalfs-xfstests-build}
src=$build/$stamp
mkdir -p "$build"
(
    flock 9  # two runs at once (the test suite and a bench run) build it once
    if [ ! -e "$src/.journalfs-built" ]; then
        echo "xfstests.sh: building xfstests in $src (about 1 min on 2 cores)" >&2
        rm -rf "$src"
        mkdir -p "$src"
        tar -xzf "$suite/xfstests-src.tar.gz" -C "$src"
        (cd "$src" && patch -p1 -s < "$suite/xfstests-fuse.patch")
        start=$(date +%s)
        (cd "$src" && make -j"$(nproc)" > "$src/build.log" 2>&1) \
            || die "build failed, see $src/build.log"
        echo "$(( $(date +%s) - start ))" > "$src/.journalfs-built"
    fi
) 9> "$build/$stamp.lock"

# -- users the suite expects -------------------------------------------------------------------
# Made if missing and noted in $build/users-made; removed by the last run to end (runs at once,
# e.g. CI's test and a bench run, share them: each holds a shared lock while it runs).
users_made=$build/users-made
exec 8> "$build/users.lock"
flock -s 8
cleanup() {
    if flock -xn 8; then  # no other run holds the lock: the users are no longer needed
        for u in $(sort -u "$users_made" 2>/dev/null); do userdel -r "$u" >/dev/null 2>&1 || true; done
        rm -f "$users_made"
    fi
}
trap cleanup EXIT
for u in fsgqa 123456-fsgqa fsgqa2; do
    if ! id "$u" >/dev/null 2>&1; then
        if useradd -m "$u" 2>/dev/null; then echo "$u" >> "$users_made"; fi
        id "$u" >/dev/null 2>&1 || die "cannot create the user $u the suite needs"
    fi
done

# -- the mount(8) helper of this tree, laid over /usr/sbin inside the namespace ----------------
mkdir -p "$work/sbin" "$work/bin"
cat > "$work/bin/journalfs" <<EOF
#!/bin/sh
PYTHONPATH=$here\${PYTHONPATH:+:\$PYTHONPATH} exec "$python" -c 'import sys; from journalfs.cli import main; sys.argv[0] = "journalfs"; sys.exit(main())' "\$@"
EOF
chmod 755 "$work/bin/journalfs"
sed "s|@JOURNALFS_BIN@|$work/bin/journalfs|" "$here/mount_scripts/mount.fuse.journalfs" \
    > "$work/sbin/mount.fuse.journalfs"
chmod 755 "$work/sbin/mount.fuse.journalfs"

# -- one target: images, config, ./check, all inside its own mount namespace -------------------
run_target() {
    local target=$1 dir=$work/$1
    rm -rf "$dir"
    mkdir -p "$dir/img" "$dir/dev/test" "$dir/dev/scratch" "$dir/mnt/test" "$dir/mnt/scratch" \
        "$dir/store/test" "$dir/store/scratch" "$dir/results"
    for d in test scratch; do
        truncate -s 6G "$dir/img/$d.img"
        mkfs.ext4 -q -F "$dir/img/$d.img"
    done
    local fuse_opts="allow_other,dev,suid"
    {
        echo "export TEST_DIR=$dir/mnt/test SCRATCH_MNT=$dir/mnt/scratch"
        echo "export RESULT_BASE=$dir/results"
        case $target in
            ext4)
                echo "export FSTYP=ext4 TEST_DEV=@TEST_LOOP@ SCRATCH_DEV=@SCRATCH_LOOP@" ;;
            journalfs)
                echo "export FSTYP=fuse FUSE_SUBTYP=.journalfs"
                echo "export TEST_DEV=$dir/dev/test SCRATCH_DEV=$dir/dev/scratch"
                # each daemon logs into its store (where it logs without a system log, also
                # with one): tests/test_xfstests.py reads it
                local test_store=$dir/store/test scratch_store=$dir/store/scratch
                echo "export TEST_FS_MOUNT_OPTS='-o $fuse_opts,store=$test_store,log_file=$test_store/journalfs.log'"
                echo "export MOUNT_OPTIONS='-o $fuse_opts,store=$scratch_store,log_file=$scratch_store/journalfs.log'" ;;
            bindfs)
                echo "export FSTYP=fuse FUSE_SUBTYP=.bindfs"
                echo "export TEST_DEV=$dir/dev/test SCRATCH_DEV=$dir/dev/scratch"
                echo "export TEST_FS_MOUNT_OPTS='-o $fuse_opts'"
                echo "export MOUNT_OPTIONS='-o $fuse_opts'" ;;
        esac
    } > "$dir/config.in"
    # shellcheck disable=SC2016
    timeout --signal=TERM --kill-after=60 "${XFSTESTS_TIMEOUT:-3600}" 8>&- \
    unshare --mount --propagation private bash -c '
        set -eu
        work=$1 dir=$2 target=$3 src=$4 tests=$5
        mount -t overlay overlay -o "lowerdir=$work/sbin:/usr/sbin" /usr/sbin
        loops=()
        for d in test scratch; do
            loops+=("$(losetup -f --show "$dir/img/$d.img")")
            echo "${loops[-1]}" >> "$dir/loops"  # detached by the caller once all is gone
        done
        if [ "$target" != ext4 ]; then  # SOURCE directories on ext4, as for a real user
            mount "${loops[0]}" "$dir/dev/test"
            mount "${loops[1]}" "$dir/dev/scratch"
        fi
        sed -e "s|@TEST_LOOP@|${loops[0]}|" -e "s|@SCRATCH_LOOP@|${loops[1]}|" \
            "$dir/config.in" > "$dir/config"
        cd "$src"
        HOST_OPTIONS=$dir/config ./check $tests
    ' xfstests "$work" "$dir" "$target" "$src" "$tests" > "$dir/check.log" 2>&1 || true
    # the namespace's mounts go with its last process (a FUSE daemon may take a moment to
    # exit after its unmount): only then can the loop devices go
    local loop tries
    for loop in $(cat "$dir/loops" 2>/dev/null); do
        for tries in $(seq 60); do
            losetup -d "$loop" 2>/dev/null || true
            losetup -a | grep -q "^$loop:" || break
            sleep 1
        done
    done
}

for t in "${targets[@]}"; do
    echo "xfstests.sh: running $(echo "$tests" | wc -w) tests on $t (log: $work/$t/check.log)" >&2
    start=$(date +%s)
    run_target "$t"
    echo $(( $(date +%s) - start )) > "$work/$t/seconds"
    echo "$tests" > "$work/$t/tests"
done
# the table also shows earlier runs of the other targets on the same tests (same $work)
report=()
for t in journalfs bindfs ext4; do
    [ "$(cat "$work/$t/tests" 2>/dev/null)" = "$tests" ] && report+=("$t")
done

# -- results: table and JSON ------------------------------------------------------------------
"$python" - "$work" "$src" "$tests" "${report[@]}" <<'EOF'
import json, os, re, sys

work, src, tests, targets = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]

def outcome(target):
    """test -> {status, reason, seconds, files} from ./check's log and its result files;
    seconds is ./check's record for a passing test, files names the expected output, the
    test's output where it differs (out_bad) and its log (full)."""
    log = open(os.path.join(work, target, "check.log"), errors="replace").read()
    results = os.path.join(work, target, "results")
    times = {}
    if os.path.exists(os.path.join(results, "check.time")):
        for row in open(os.path.join(results, "check.time")):
            if len(row.split()) == 2:
                times[row.split()[0]] = int(row.split()[1])
    out = {}
    for test in tests:
        base = None
        for root, _, names in os.walk(results):
            if os.path.basename(test) + ".notrun" in names or \
                    os.path.basename(test) + ".out.bad" in names:
                base = os.path.join(root, os.path.basename(test))
        line = next((l for l in log.splitlines() if l.startswith(test + " ")), "")
        files = {"expected": os.path.join(src, "tests", test + ".out")}
        for kind, suffix in (("out_bad", ".out.bad"), ("full", ".full")):
            if os.path.exists(os.path.join(results, test + suffix)):
                files[kind] = os.path.join(results, test + suffix)
        if base and os.path.exists(base + ".notrun"):
            status, reason = "notrun", open(base + ".notrun", errors="replace").read().strip()
        elif "[not run]" in line:
            status, reason = "notrun", line.split("[not run]", 1)[1].strip()
        elif re.search(r"- output mismatch|\[failed|\[expunged\]", line) or \
                (base and os.path.exists(base + ".out.bad")):
            status, reason = "fail", line[len(test):].strip()[:200]
        elif re.match(re.escape(test) + r"\s+\d+s", line) or re.match(re.escape(test) + r"\s+\S*\s*\d+s", line):
            status, reason = "pass", ""
        else:
            status, reason = "missing", "no result in the log (the run stopped early?)"
        out[test] = {"status": status, "reason": reason, "seconds": times.get(test),
                     "files": files}
    return out

data = {t: outcome(t) for t in targets}
seconds = {t: int(open(os.path.join(work, t, "seconds")).read()) for t in targets}
summary = {t: {s: sum(1 for v in data[t].values() if v["status"] == s)
               for s in ("pass", "fail", "notrun", "missing")} for t in targets}
report = {"tests": len(tests), "targets": {t: {"summary": summary[t], "seconds": seconds[t],
          "results": data[t]}
          for t in targets}}
with open(os.path.join(work, "results.json"), "w") as f:
    json.dump(report, f, indent=1)

print(f"xfstests: {len(tests)} generic tests")
print(f"| target | pass | fail | notrun | time |")
print(f"|---|---:|---:|---:|---:|")
for t in targets:
    s = summary[t]
    extra = f" (+{s['missing']} without result)" if s["missing"] else ""
    print(f"| {t} | {s['pass']} | {s['fail']}{extra} | {s['notrun']} | {seconds[t] // 60} min {seconds[t] % 60} s |")
print()
differ = [k for k in tests if len({data[t][k]["status"] for t in targets}) > 1 or
          any(data[t][k]["status"] == "fail" for t in targets)]
if differ:
    print("| test | " + " | ".join(targets) + " |")
    print("|---|" + "---|" * len(targets))
    for k in differ:
        print(f"| {k} | " + " | ".join(
            data[t][k]["status"] + (f": {data[t][k]['reason'][:70]}" if data[t][k]["reason"] else "")
            for t in targets) + " |")
if "ext4" in targets:
    print()
    for t in targets:
        if t != "ext4":
            worse = [k for k in tests if data[t][k]["status"] in ("fail", "missing")
                     and data["ext4"][k]["status"] == "pass"]
            print(f"{t}: failing where ext4 passes: {' '.join(worse) or 'none'}")
print(f"\nJSON: {os.path.join(work, 'results.json')}")
EOF
