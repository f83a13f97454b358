#!/usr/bin/env bash
# Makes a cluster's TLS files with openssl: a CA, and one certificate for
# every kolo component signed by it, naming the coordinator's addresses.
#
#   scripts/tls-certs.sh DIR [HOST_OR_IP...]
#
# DIR gets ca.pem (give it to everyone), ca-key.pem (keep it offline: it
# signs new certificates), cert.pem and key.pem (0600); point every
# component at DIR with --tls-dir DIR or KOLO_TLS_DIR=DIR. The names are
# those clients dial the coordinator by (default: localhost, 127.0.0.1 and
# this host's name). An existing CA in DIR is reused, so running it again
# with more names re-issues cert.pem under the same CA.
set -euo pipefail
if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
command -v openssl >/dev/null || { echo "tls-certs.sh: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
dir="$1"
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1 "$(hostname)")
mkdir -p "$dir"
umask 077
san=""
for n in "${names[@]}"; do
  if [[ "$n" =~ ^[0-9.]+$ || "$n" == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san="${san%,}"
if [ ! -s "$dir/ca.pem" ] || [ ! -s "$dir/ca-key.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
    -subj "/CN=kolo cluster CA" -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=kolo" \
  -keyout "$dir/key.pem" -out "$tmp/req.pem" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
  "$san" >"$tmp/ext.cnf"
openssl x509 -req -in "$tmp/req.pem" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
  -CAcreateserial -CAserial "$tmp/ca.srl" -days 825 -extfile "$tmp/ext.cnf" \
  -out "$dir/cert.pem" 2>/dev/null
chmod 600 "$dir/key.pem" "$dir/ca-key.pem"
chmod 644 "$dir/ca.pem" "$dir/cert.pem"
echo "kolo TLS files in $dir (names: ${names[*]})"
