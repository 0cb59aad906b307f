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
