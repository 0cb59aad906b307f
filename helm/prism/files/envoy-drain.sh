#!/bin/bash
# The Envoy gateway's preStop hook (templates/gateway.yaml): Envoy closes its
# listeners and connections at once on SIGTERM, and drains only when told to,
# so the kubelet runs this first and sends SIGTERM when it returns.
#  1. POST /healthcheck/fail: /ready answers 503 (the pod leaves the gateway
#     Service's endpoints if it had not yet) and every connection is closed
#     after the response it carries (HTTP/1.1 Connection: close, HTTP/2
#     GOAWAY), so clients reconnect to another gateway pod.
#  2. POST /drain_listeners?graceful: for Envoy's --drain-time-s, here
#     {{ .Values.gateway.drain.seconds }} s (gateway.drain.seconds), the listener still accepts clients
#     whose view of the endpoints is behind, then stops accepting.
#  3. Wait out that drain and gateway.drain.tailSeconds more for queries
#     still in flight on connections already open.
# The admin interface is bound to loopback, and bash's /dev/tcp reaches it
# without curl, which the Envoy image does not have.
set -u
post() {
  exec 3<>/dev/tcp/127.0.0.1/{{ .Values.gateway.adminPort }} || return 1
  printf 'POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' "$1" >&3
  head -n 1 <&3
  exec 3<&-
}
post /healthcheck/fail
post '/drain_listeners?graceful'
sleep {{ add (int .Values.gateway.drain.seconds) (int .Values.gateway.drain.tailSeconds) }}
