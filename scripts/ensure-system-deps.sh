#!/usr/bin/env bash
# System packages the project needs beyond Python: Java 17 (Spark, ZooKeeper), kcat (a C client used
# by the tests and benchmarks), ZooKeeper 3.8 (the cluster mode's coordination service; the
# package's jars under /usr/share/java are what `exactly zookeeper` runs) and Chromium (the web
# console's browser test drives /usr/bin/chromium with Playwright; `playwright install` is never
# used, and that test fails rather than skips without it). Installs them with apt
# when missing and we are root; otherwise says what is missing and carries on (tests that need them
# skip with that reason).
set -u
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || echo "warning: could not install ${missing[*]}" >&2
else
  echo "warning: missing ${missing[*]} (install them with apt-get as root)" >&2
fi
exit 0
