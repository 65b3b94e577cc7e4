#!/usr/bin/env bash
# One-step set-up for a fresh Debian 12 machine (run as root, or with sudo), then one job:
#   bash bootstrap.sh demo   install everything, mount the bundled demo journals, show them
#                            (in /tmp/journalfs-demo, or $JOURNALFS_DEMO_DIR)
#   bash bootstrap.sh test   install everything, run the whole test suite
#   bash bootstrap.sh install
# As root, "install" also puts journalfs on PATH (/usr/local/bin), mount.fuse.journalfs in
# /sbin, the systemd unit template and the man page journalfs(1) (mount_scripts/install.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
job=${1:-demo}

# xfstests (bench/xfstests.sh, tests/test_xfstests.py): its build (patch applies the FUSE
# patch, libtool-bin brings libtoolize, the -dev packages are the headers its configure needs
# or its aio, io_uring, capability and dbm tests use) and what ./check calls (xfs_io, gawk,
# bc, uuidgen). Quota, dbench and accton are optional: tests that need them say "not run".
XFSTESTS_PACKAGES=(
  patch autoconf automake libtool-bin make gcc pkg-config
  xfslibs-dev uuid-dev libacl1-dev libaio-dev liburing-dev libcap-dev libgdbm-dev libgdbm-compat-dev
  xfsprogs e2fsprogs gawk bc uuid-runtime acl attr fio psmisc
)

APT_PACKAGES=(
  python3 python3-venv python3-dev gcc pkg-config        # the venv and pyfuse3's build
  fuse3 libfuse3-dev attr                               # FUSE, getfattr/setfattr
  bindfs                                                # C FUSE passthrough, the benchmark anchor
  gvfs gvfs-daemons dbus python3-gi gir1.2-glib-2.0 libglib2.0-bin  # real gvfs + gio for interop
  openjdk-17-jre-headless                               # Spark
  util-linux procps psmisc                              # mount(8), fuser for the tests
  groff-base                                            # renders journalfs.1 in its test
  acl libcap2-bin                                       # setfacl/getfacl, setcap/getcap (xattr namespace tests)
  autoconf automake make perl openssl                   # pjdfstest's build and run (tests/pjdfstest_build.py)
  fio                                                   # bench/fuse.py's fio rows
  jq                                                    # the demo's payloads checked as a user would
  "${XFSTESTS_PACKAGES[@]}"                             # xfstests (above)
)

install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    missing=()
    for p in "${APT_PACKAGES[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
  fi
  py=${PYTHON:-python3}
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,spark]"
}

install_commands() {
  # As root: `journalfs` on PATH (/usr/local/bin), mount.fuse.journalfs for mount(8) and
  # /etc/fstab, the systemd unit template and the man page, all pointing at this .venv.
  if [ "$(id -u)" = 0 ]; then
    JOURNALFS_BIN="$here/.venv/bin/journalfs" sh mount_scripts/install.sh >/dev/null
  fi
}

#: The demo owns a directory only if it carries this file (written when the demo made it).
DEMO_MARKER=.journalfs-demo

# Append N PUTs to a Kestrel writer segment, one every 0.3 s, as a live writer does.
demo_append_puts() {
  .venv/bin/python - "$1" "$2" <<'PY'
import random, sys, time
from journalfs import demo
from journalfs.formats import CODECS
path, n = sys.argv[1], int(sys.argv[2])
codec = CODECS["kestrel-writer"]
last = list(codec.read(open(path, "rb").read(), path))[-1]["id"]
puts = demo.kestrel_put_records(random.Random(), n, first_id=last + 1,
                                start_ms=int(time.time() * 1000))
for rec in puts:
    with open(path, "ab") as f:
        f.write(codec.write([rec])[4:])  # the frame after the file's magic
    time.sleep(0.3)
PY
}

demo() {
  base=${JOURNALFS_DEMO_DIR:-/tmp/journalfs-demo}
  src=$base/source; mnt=$base/mnt
  jfs=.venv/bin/journalfs
  if [ -e "$base" ] && [ ! -e "$base/$DEMO_MARKER" ]; then
    echo "bootstrap.sh demo: $base exists and was not made by the demo; leaving it alone" \
         "(set JOURNALFS_DEMO_DIR to another directory)" >&2
    return 1
  fi
  echo "== demo directory: $base (set JOURNALFS_DEMO_DIR to change it)"
  if mountpoint -q "$mnt" 2>/dev/null || grep -q " $mnt fuse.journalfs " /proc/self/mounts; then
    "$jfs" umount "$mnt"
  fi
  rm -rf "$src"; mkdir -p "$src" "$mnt"
  touch "$base/$DEMO_MARKER"
  cp -a demo/. "$src/"
  # the embedded default store for $src lives under ~/.local/share/journalfs/stores/
  "$jfs" mount "$src" "$mnt"
  echo "== mounted $src on $mnt"
  set -x
  ls -l "$mnt"
  setfattr -n user.metadata.comment -v "reviewed by ops" "$mnt/README.txt"
  setfattr -n user.metadata.tags -v 0x72656400677265656e00 "$mnt/README.txt"   # a list: red, green
  setfattr -n user.metadata.rating -v 5 "$mnt/photos/2023/cat.jpg"
  getfattr -d -m 'user\.metadata\.' "$mnt/README.txt" "$mnt/photos/2023/cat.jpg"
  mv "$mnt/photos/2023" "$mnt/photos/best"              # metadata follows renames
  getfattr -n user.metadata.rating "$mnt/photos/best/cat.jpg"
  ls "$mnt/.journalfs/records/" "$mnt/.journalfs/records/queues/"
  ls "$mnt/.journalfs/records/queues/jobs.1700000000000" | head -n 5
  cat "$mnt/.journalfs/records/queues/jobs.1700000000000/00000000.put"; echo
  getfattr -d -m 'user\.record\.' "$mnt/.journalfs/records/queues/jobs.1700000000000/00000000.put"
  cat "$mnt/.journalfs/records/jrnl/db.jrnl/00000000.transaction"
  head -n 3 "$mnt/.journalfs/records/wallaby/events.log/records.jsonl"
  ls "$mnt/.journalfs/records/sqlite/shop.db-wal" | head -n 4   # a frame per file: .page, .commit
  ls "$mnt/.journalfs/metadata/journal/"
  getfattr -d "$mnt/.journalfs"                           # the mount's runtime settings
  cat "$mnt/.journalfs/status.json"; echo
  # each system's state, and a live queue: a writer appends while we follow it
  "$jfs" queue "$src/queues/jobs"                         # each reader: head, tail, pending
  "$jfs" queue "$src/queues/jobs" --reader mailer --pending | head -n 6
  "$jfs" events "$src/akka/orders" --id order-17 --to-seq 3
  "$jfs" transactions "$src/jrnl/db.jrnl" --incomplete
  timeout 4 "$jfs" records -f -n 2 --payload text "$src/queues/jobs" & follower=$!
  timeout 4 tail -n 1 -f "$mnt/.journalfs/records/queues/jobs.1700000060000/records.jsonl" &
  sleep 1.5; demo_append_puts "$src/queues/jobs.1700000060000" 3
  wait "$follower" || true
  "$jfs" queue "$src/queues/jobs" --reader mailer          # 3 more pending
  ls "$mnt/.journalfs/queues/queues/jobs/" "$mnt/.journalfs/queues/queues/jobs/mailer" | tail -n 4
  cat "$mnt/.journalfs/queues/queues/jobs/mailer/state.json"
  ls "$mnt/.journalfs/persistence/akka/orders/order-17" | head -n 3
  ls "$mnt/.journalfs/transactions/jrnl/db.jrnl"
  { set +x; } 2>/dev/null
  echo "== the demo stays mounted on $mnt; unmount it with: journalfs umount $mnt"
  echo "== (journalfs is $here/.venv/bin/journalfs; as root bootstrap also put it on PATH)"
}

run_tests() {
  # The tests' data is in the repository (tests/data/). The third-party suites (pjdfstest,
  # xfstests) are found as tests/suites.py says, and skip with a one-line reason when absent.
  .venv/bin/python -m pytest -q -ra --durations=20 -p no:cacheprovider "$@"
}

# Sourcing the script (tests do) defines the functions without running a job.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "$job" in
    install) install; install_commands ;;
    demo) install; install_commands; demo ;;
    test) shift || true; install; install_commands; run_tests "$@" ;;
    *) echo "usage: bash bootstrap.sh demo|test|install" >&2; exit 2 ;;
  esac
fi
