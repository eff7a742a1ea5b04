# Sourced by scripts/soak.sh and scripts/chaos.sh: make_test_ca DIR NAME writes a test CA
# (DIR/ca.{crt,key}), the daemon's certificate for localhost / 127.0.0.1 (DIR/server.{crt,key})
# and a client certificate (DIR/client.{crt,key}), P-256, valid 2 days.
make_test_ca() {
  local t=$1 name=$2 who ext
  mkdir -p "$t"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=libreyolo $name CA" -keyout "$t/ca.key" -out "$t/ca.crt" 2>/dev/null
  for who in server client; do
    if [ $who = server ]; then ext="subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"; else ext="extendedKeyUsage=clientAuth"; fi
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name-$who" \
      -keyout "$t/$who.key" -out "$t/$who.csr" 2>/dev/null
    openssl x509 -req -in "$t/$who.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial \
      -days 2 -extfile <(printf '%s\n' "$ext") -out "$t/$who.crt" 2>/dev/null
  done
}
