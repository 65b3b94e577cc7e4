#!/bin/sh
# Install the journalfs mount helper and systemd unit, pointing them at the current journalfs:
#     sudo sh mount_scripts/install.sh
# Variables (all optional):
#   JOURNALFS_BIN  journalfs executable to use  (default: active venv, this repo's .venv, PATH)
#   DESTDIR        staging root prepended to every target path      (default: empty)
#   PREFIX         where the "journalfs" command shim goes, PREFIX/bin  (default: /usr/local)
#   SBINDIR        mount.fuse.journalfs; mount(8) only searches /sbin  (default: /sbin)
#   UNITDIR        systemd unit directory            (default: /etc/systemd/system)
#   MANDIR         manual pages; journalfs.1 goes to MANDIR/man1  (default: PREFIX/share/man)
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${PREFIX:-/usr/local}
SBINDIR=${SBINDIR:-/sbin}
UNITDIR=${UNITDIR:-/etc/systemd/system}
MANDIR=${MANDIR:-$PREFIX/share/man}
DESTDIR=${DESTDIR:-}

die() {
    echo "install.sh: $*" >&2
    exit 1
}

locate_journalfs() {
    for candidate in "${JOURNALFS_BIN:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/journalfs}" \
            "$HERE/../.venv/bin/journalfs" "$(command -v journalfs 2>/dev/null || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] \
                && ! grep -q 'journalfs-mount-helper' "$candidate" 2>/dev/null; then
            # absolute path without resolving the venv's python symlinks
            echo "$(cd "$(dirname "$candidate")" && pwd)/$(basename "$candidate")"
            return
        fi
    done
    die "no journalfs executable found; set JOURNALFS_BIN"
}

# install_file SOURCE TARGET MODE: copy with @JOURNALFS_BIN@ filled in
install_file() {
    mkdir -p "$(dirname "$2")"
    sed "s|@JOURNALFS_BIN@|$JOURNALFS|g" "$1" > "$2.tmp.$$"
    chmod "$3" "$2.tmp.$$"
    mv -f "$2.tmp.$$" "$2"
    echo "installed $2"
}

JOURNALFS=$(locate_journalfs)
case $JOURNALFS in *'|'*) die "unsupported character in path $JOURNALFS" ;; esac

install_file "$HERE/mount.fuse.journalfs" "$DESTDIR$SBINDIR/mount.fuse.journalfs" 755
install_file "$HERE/mount.fuse.journalfs" "$DESTDIR$PREFIX/bin/journalfs" 755
install_file "$HERE/journalfs@.service" "$DESTDIR$UNITDIR/journalfs@.service" 644
# the manual page is written by the journalfs being installed, from its own argument parsers
page="$DESTDIR$MANDIR/man1/journalfs.1"
mkdir -p "$(dirname "$page")"
"$JOURNALFS" --man > "$page.tmp.$$" || die "$JOURNALFS --man failed"
chmod 644 "$page.tmp.$$"
mv -f "$page.tmp.$$" "$page"
echo "installed $page"
if [ -z "$DESTDIR" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
echo "journalfs: $JOURNALFS"
