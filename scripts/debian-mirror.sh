#!/usr/bin/env bash
# Print the Debian mirror apt on this machine uses for SUITE (default bookworm), so image and
# chroot builds fetch from the same place as apt-get (deb822 *.sources first, then one-line
# *.list files); falls back to http://deb.debian.org/debian.
#   scripts/debian-mirror.sh [SUITE]
set -euo pipefail
SUITE=${1:-bookworm}
found=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  case "$f" in
    *.sources)
      found=$(awk -v suite="$SUITE" '
        BEGIN { RS=""; FS="\n" }
        { uri=""; ok=0
          for (i=1;i<=NF;i++) {
            if ($i ~ /^URIs:/)   { split($i,a,/[ \t]+/); uri=a[2] }
            if ($i ~ /^Suites:/) { n=split($i,s,/[ \t]+/); for (j=2;j<=n;j++) if (s[j]==suite) ok=1 }
          }
          if (ok && uri!="") { print uri; exit } }' "$f") ;;
    *)
      found=$(awk -v suite="$SUITE" '$1=="deb" { for (i=2;i<=NF;i++) if ($i !~ /^\[/) { if ($(i+1)==suite) { print $i; exit } else break } }' "$f") ;;
  esac
  [ -n "$found" ] && break
done
echo "${found:-http://deb.debian.org/debian}"
