{{/* Chart name, overridable. */}}
{{- define "prism.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix: the release name, with the chart name unless already in it. */}}
{{- define "prism.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Names of each component's objects. */}}
{{- define "prism.admin.name" -}}{{ include "prism.fullname" . | trunc 57 | trimSuffix "-" }}-admin{{- end -}}
{{- define "prism.admin.headless" -}}{{ include "prism.admin.name" . }}-peers{{- end -}}
{{- define "prism.runner.name" -}}{{ include "prism.fullname" . | trunc 56 | trimSuffix "-" }}-runner{{- end -}}
{{- define "prism.injector.name" -}}{{ include "prism.fullname" . | trunc 54 | trimSuffix "-" }}-injector{{- end -}}
{{- define "prism.gateway.name" -}}{{ include "prism.fullname" . | trunc 55 | trimSuffix "-" }}-gateway{{- end -}}

{{/* Labels on every object. */}}
{{- define "prism.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "prism.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prism
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" . "component" "admin"). */}}
{{- define "prism.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prism.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "prism.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Cluster DNS suffix of the release namespace. */}}
{{- define "prism.svcSuffix" -}}{{ .Release.Namespace }}.svc{{- end -}}

{{/* Stable DNS name of admin pod $i: <sts>-<i>.<headless>.<ns>.svc. */}}
{{- define "prism.admin.host" -}}
{{- printf "%s-%d.%s.%s" (include "prism.admin.name" .ctx) (int .i) (include "prism.admin.headless" .ctx) (include "prism.svcSuffix" .ctx) -}}
{{- end -}}

{{/* --peers value: id=raftaddr=grpcaddr for every admin node, comma-separated. */}}
{{- define "prism.admin.peers" -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.admin.replicas) -}}
{{- $host := include "prism.admin.host" (dict "ctx" $ "i" $i) -}}
{{- $peers = append $peers (printf "%s-%d=%s:%d=%s:%d" (include "prism.admin.name" $) $i $host (int $.Values.admin.ports.raft) $host (int $.Values.admin.ports.grpc)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{/* --bootstrap-expect: admin.bootstrapExpect, which must not change for
the release's life (growing admin.replicas keeps it, so new pods join), and
which a cluster of fewer nodes could never reach. */}}
{{- define "prism.admin.bootstrapExpect" -}}
{{- $n := int .Values.admin.bootstrapExpect -}}
{{- if gt $n (int .Values.admin.replicas) -}}
{{- fail (printf "admin.bootstrapExpect (%d) is more than admin.replicas (%d): the first admin.bootstrapExpect pods bootstrap the cluster, so a release of %d admin nodes needs admin.bootstrapExpect=%d, kept at that when admin.replicas grows (docs/operations.md#adding-admin-nodes-to-the-chart)" $n (int .Values.admin.replicas) (int .Values.admin.replicas) (int .Values.admin.replicas)) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* Admin gRPC endpoints the sidecars and tools dial; any node works. */}}
{{- define "prism.admin.endpoints" -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.admin.replicas) -}}
{{- $eps = append $eps (printf "%s:%d" (include "prism.admin.host" (dict "ctx" $ "i" $i)) (int $.Values.admin.ports.grpc)) -}}
{{- end -}}
{{- join "," $eps -}}
{{- end -}}

{{- define "prism.kafka.brokers" -}}
{{- if not .Values.kafka.brokers -}}
{{- fail "kafka.brokers is required: list your Kafka bootstrap brokers as host:port" -}}
{{- end -}}
{{- join "," .Values.kafka.brokers -}}
{{- end -}}

{{/* Pod security context shared by prism components. */}}
{{- define "prism.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.fsGroup }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context: nothing written outside mounted volumes. */}}
{{- define "prism.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/*
Mutual TLS. Every prism container finds its identity in /etc/prism/tls
(ca.crt, tls.crt, tls.key: csi-driver's file names), from a csi-driver
volume (cert-manager mode) or a Secret (secret mode, and generate mode,
whose hook Job writes the Secrets secret mode reads).
*/}}
{{- define "prism.tls.on" -}}{{ if ne .Values.tls.mode "insecure" }}true{{ end }}{{- end -}}
{{- define "prism.tls.dir" -}}/etc/prism/tls{{- end -}}

{{/*
The Secret of a role's identities in secret and generate modes: (dict "ctx"
. "role" "admin"), role one of admin, runner, gateway. The user's in secret
mode; in generate mode the one the hook Job writes, <component>-tls.
*/}}
{{- define "prism.tls.secretName" -}}
{{- if eq .ctx.Values.tls.mode "generate" -}}
{{- include (printf "prism.%s.name" .role) .ctx }}-tls
{{- else -}}
{{- required (printf "tls.secret.%s is required with tls.mode secret" .role) (get .ctx.Values.tls.secret .role) -}}
{{- end -}}
{{- end -}}

{{/* The Secrets of the generate mode's CA and of the operator identity (also cert-manager mode's). */}}
{{- define "prism.tls.caSecret" -}}{{ include "prism.fullname" . }}-ca{{- end -}}
{{- define "prism.tls.operatorSecret" -}}{{ include "prism.fullname" . }}-operator-tls{{- end -}}
{{- define "prism.certs.name" -}}{{ include "prism.fullname" . | trunc 57 | trimSuffix "-" }}-certs{{- end -}}

{{/* The issuer of the mesh's certificates: the user's, or the chart's CA issuer. */}}
{{- define "prism.tls.issuerName" -}}{{ .Values.tls.certManager.issuerRef.name | default (printf "%s-ca" (include "prism.fullname" .)) }}{{- end -}}
{{- define "prism.tls.issuerKind" -}}{{ ternary (.Values.tls.certManager.issuerRef.kind | default "Issuer") "Issuer" (not (empty .Values.tls.certManager.issuerRef.name)) }}{{- end -}}
{{- define "prism.tls.issuerGroup" -}}{{ .Values.tls.certManager.issuerRef.group | default "cert-manager.io" }}{{- end -}}

{{/* The privateKey of a cert-manager Certificate: tls.certManager.privateKey. */}}
{{- define "prism.tls.certificateKey" -}}
{{- $key := .Values.tls.certManager.privateKey -}}
privateKey:
  algorithm: {{ $key.algorithm }}
  size: {{ $key.size | int }}
  encoding: {{ $key.encoding }}
{{- end -}}

{{/* The SPIFFE URI of role/name. */}}
{{- define "prism.tls.uri" -}}spiffe://{{ .ctx.Values.tls.trustDomain }}/{{ .role }}/{{ .name }}{{- end -}}

{{/*
The identity volume of a pod: (dict "ctx" . "role" "admin" "fsGroup" 65532).
In cert-manager mode csi-driver fills ${POD_NAME} in when it requests the
pod's certificate.
*/}}
{{- define "prism.tls.volume" -}}
- name: prism-tls
{{- if eq .ctx.Values.tls.mode "cert-manager" }}
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ include "prism.tls.issuerName" .ctx }}
      csi.cert-manager.io/issuer-kind: {{ include "prism.tls.issuerKind" .ctx }}
      csi.cert-manager.io/issuer-group: {{ include "prism.tls.issuerGroup" .ctx }}
      csi.cert-manager.io/uri-sans: {{ include "prism.tls.uri" (dict "ctx" .ctx "role" .role "name" "${POD_NAME}") | quote }}
      csi.cert-manager.io/key-usages: "digital signature,key encipherment,server auth,client auth"
      {{- $key := .ctx.Values.tls.certManager.privateKey }}
      csi.cert-manager.io/key-algorithm: {{ $key.algorithm }}
      csi.cert-manager.io/key-size: {{ $key.size | int | quote }}
      csi.cert-manager.io/key-encoding: {{ $key.encoding }}
      csi.cert-manager.io/certificate-file: tls.crt
      csi.cert-manager.io/privatekey-file: tls.key
      csi.cert-manager.io/ca-file: ca.crt
      csi.cert-manager.io/duration: {{ .ctx.Values.tls.certManager.duration }}
      csi.cert-manager.io/fs-group: {{ .fsGroup | quote }}
{{- else }}
  secret:
    secretName: {{ include "prism.tls.secretName" . }}
    # Readable by the pod's fsGroup only.
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "prism.tls.mount" -}}
- name: prism-tls
  mountPath: {{ include "prism.tls.dir" . }}
  readOnly: true
{{- end -}}

{{/*
The TLS flags of a prism server: (dict "ctx" . "cert" "tls"), where cert
is the file name without extension in secret mode (e.g. "$(POD_NAME)").
*/}}
{{- define "prism.tls.args" -}}
{{- if include "prism.tls.on" .ctx }}
{{- $cert := ternary "tls" .cert (eq .ctx.Values.tls.mode "cert-manager") }}
- --tls-ca={{ include "prism.tls.dir" .ctx }}/ca.crt
- --tls-cert={{ include "prism.tls.dir" .ctx }}/{{ $cert }}.crt
- --tls-key={{ include "prism.tls.dir" .ctx }}/{{ $cert }}.key
{{- else }}
- --insecure
{{- end }}
{{- end -}}

{{/* The injector's --mesh-tls mode for the chart's tls.mode. */}}
{{- define "prism.tls.injectorMode" -}}
{{- get (dict "cert-manager" "csi" "generate" "secret" "secret" "secret" "insecure" "insecure") .Values.tls.mode -}}
{{- end -}}

{{/*
The runner's control API, where its injected sidecar dials it (docs/architecture.md#kubernetes-stop-order
and the runner's --control-addr): the pods' prism.io/runner-addr annotation (runner.podAnnotations) when
set, since the injector gives the sidecar that, else sidecar.runnerAddr. The runner is rendered
listening on the same address, so the two always agree. The runner serves it on the pod's loopback
only and refuses any other address, so the chart refuses one too.
*/}}
{{- define "prism.runner.controlAddr" -}}
{{- $addr := get (.Values.runner.podAnnotations | default dict) "prism.io/runner-addr" | default .Values.sidecar.runnerAddr -}}
{{- if not (regexMatch "^(127\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}|localhost|\\[::1\\]):[0-9]{1,5}$" $addr) -}}
{{- fail (printf "sidecar.runnerAddr (or the prism.io/runner-addr pod annotation) %q must be a loopback host:port such as 127.0.0.1:7071: the runner serves its sidecar the control API on the pod's loopback only" $addr) -}}
{{- end -}}
{{- $addr -}}
{{- end -}}

{{/* The sidecar's HTTP port (probes, metrics): inject.SidecarHTTPPort. */}}
{{- define "prism.sidecar.httpPort" -}}9102{{- end -}}

{{/*
Query tokens on the Envoy gateway (docs/security.md#query-tokens): the
prism admin flags that say what the Envoys it configures over xDS check.
Secure by default: without a JWKS, an issuer and an audience the chart
refuses to render unless gateway.queryAuth.disabled says the gateway is open.
*/}}
{{- define "prism.gateway.jwksDir" -}}/etc/prism/jwks{{- end -}}
{{- define "prism.gateway.queryAuth.args" -}}
{{- $q := .Values.gateway.queryAuth -}}
{{- if $q.disabled }}
{{- if or $q.jwksUrl $q.jwksConfigMap }}
{{- fail "gateway.queryAuth.disabled=true excludes gateway.queryAuth.jwksUrl and gateway.queryAuth.jwksConfigMap: set one or the other" }}
{{- end }}
- --gateway-no-query-auth
{{- else }}
{{- if not (and (or $q.jwksUrl $q.jwksConfigMap) $q.issuer $q.audience) }}
{{- fail "query tokens for the gateway are required (docs/security.md#query-tokens): set gateway.queryAuth.jwksUrl or gateway.queryAuth.jwksConfigMap, with gateway.queryAuth.issuer and gateway.queryAuth.audience; or gateway.queryAuth.disabled=true to let anyone who reaches the gateway read every mailbox" }}
{{- end }}
{{- if and $q.jwksUrl $q.jwksConfigMap }}
{{- fail "gateway.queryAuth.jwksUrl and gateway.queryAuth.jwksConfigMap exclude each other: Envoy takes one JWKS" }}
{{- end }}
{{- if $q.jwksUrl }}
- {{ printf "--gateway-jwks-url=%s" $q.jwksUrl | quote }}
{{- with $q.jwksCA }}
- {{ printf "--gateway-jwks-ca=%s" . | quote }}
{{- end }}
{{- else }}
{{- if $q.jwksCA }}
{{- fail "gateway.queryAuth.jwksCA is only for gateway.queryAuth.jwksUrl" }}
{{- end }}
- --gateway-jwks-file={{ include "prism.gateway.jwksDir" . }}/jwks.json
{{- end }}
- {{ printf "--gateway-jwt-issuer=%s" $q.issuer | quote }}
- {{ printf "--gateway-jwt-audience=%s" $q.audience | quote }}
- {{ printf "--gateway-jwt-namespaces-claim=%s" $q.namespacesClaim | quote }}
{{- end }}
{{- end -}}

{{/* The port of gateway.queryAuth.jwksUrl, which the gateway's Envoys dial. */}}
{{- define "prism.gateway.jwksPort" -}}
{{- $host := (urlParse .Values.gateway.queryAuth.jwksUrl).host -}}
{{- if regexMatch ":[0-9]+$" $host }}{{ splitList ":" $host | last }}{{ else }}443{{ end -}}
{{- end -}}

{{/*
The xDS node id of a gateway pod. The admin nodes serve a gateway/<name>
identity only as node <name> or <name>/<replica>: in cert-manager mode each pod
is gateway/<pod>, so its pod name; with one shared identity (secret and
generate modes) <name>/<pod>.
*/}}
{{- define "prism.gateway.nodeID" -}}
{{- if has .Values.tls.mode (list "secret" "generate") -}}
{{ default (include "prism.gateway.name" .) .Values.tls.secret.gatewayName }}/$(POD_NAME)
{{- else -}}
$(POD_NAME)
{{- end -}}
{{- end -}}
