#!/usr/bin/env bash
# One-step set-up for a fresh Debian 12 machine (run as root), then one job:
#   bash bootstrap.sh demo   install everything, mount the bundled demo journals, show them
#   bash bootstrap.sh test   install everything, run the whole test suite
#   bash bootstrap.sh install
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
job=${1:-demo}

APT_PACKAGES=(
  python3 python3-venv python3-dev gcc pkg-config        # the venv and pyfuse3's build
  fuse3 libfuse3-dev attr                               # FUSE, getfattr/setfattr
  bindfs                                                # C FUSE passthrough, the benchmark anchor
  gvfs gvfs-daemons dbus python3-gi gir1.2-glib-2.0 libglib2.0-bin  # real gvfs + gio for interop
  openjdk-17-jre-headless                               # Spark
  util-linux procps psmisc
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

demo() {
  base=${JOURNALFS_DEMO_DIR:-/tmp/journalfs-demo}
  src=$base/source; mnt=$base/mnt
  if mountpoint -q "$mnt" 2>/dev/null; then .venv/bin/journalfs umount "$mnt"; fi
  rm -rf "$src"; mkdir -p "$src" "$mnt"
  cp -a demo/. "$src/"
  .venv/bin/journalfs mount "$src" "$mnt"
  echo "== mounted $src on $mnt"
  set -x
  ls "$mnt"
  setfattr -n user.metadata.comment -v "reviewed by ops" "$mnt/README.txt"
  printf 'red\0green\0' > /tmp/journalfs-demo-list; setfattr -n user.metadata.emblems -v "$(cat /tmp/journalfs-demo-list | tr '\0' ',')" "$mnt/README.txt"
  getfattr -d -m 'user\.metadata\.' "$mnt/README.txt"
  ls "$mnt/.journalfs/records/"
  ls "$mnt/.journalfs/records/queues/jobs.1700000000000" | head -n 5
  cat "$mnt/.journalfs/records/jrnl/db.jrnl/00000000.transaction"
  getfattr -d -m 'user\.record\.' "$mnt/.journalfs/records/queues/jobs.1700000000000/00000000.put"
  head -c 600 "$mnt/.journalfs/status.json"; echo
  ls "$mnt/.journalfs/metadata/journal/"
  { set +x; } 2>/dev/null
  echo "== the demo stays mounted on $mnt; unmount with: .venv/bin/journalfs umount $mnt"
}

run_tests() {
  # shared/ sits beside the repo (../shared); tests read the conformance data from there
  export JOURNALFS_SHARED=${JOURNALFS_SHARED:-$(cd .. && pwd)/shared}
  .venv/bin/python -m pytest -q -ra --durations=20 -p no:cacheprovider "$@"
}

case "$job" in
  install) install ;;
  demo) install; demo ;;
  test) shift || true; install; run_tests "$@" ;;
  *) echo "usage: bash bootstrap.sh demo|test|install" >&2; exit 2 ;;
esac
