{{/*
Names. Kubernetes names of namespaced objects here are at most 63 characters (DNS labels).
*/}}
{{- define "declop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "declop.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Cluster-scoped objects (ClusterRole, ClusterRoleBinding) carry the release namespace in their
name, so the same release name in two namespaces does not collide.
*/}}
{{- define "declop.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "declop.fullname" .) | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "declop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: name + instance only. Selectors are immutable, so nothing that changes between
releases (version, chart) may appear here.
*/}}
{{- define "declop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "declop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "declop.labels" -}}
helm.sh/chart: {{ include "declop.chart" . }}
{{ include "declop.selectorLabels" . }}
app.kubernetes.io/version: {{ include "declop.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: declop
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "declop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "declop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "declop.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "declop.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (include "declop.imageTag" .) }}
{{- if .Values.image.digest }}
{{- $ref = printf "%s@%s" $ref .Values.image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{- define "declop.handlersConfigMapName" -}}
{{- if .Values.handlers.existingConfigMap }}
{{- .Values.handlers.existingConfigMap }}
{{- else }}
{{- printf "%s-handlers" (include "declop.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The one handler source: "files", "existingConfigMap", "image", or "example" (the chart's example,
when no source is given and handlers.example is true). Fails, saying what to do, when two sources
are given, or none with handlers.example=false.
*/}}
{{- define "declop.handlersMode" -}}
{{- $h := .Values.handlers }}
{{- $given := list }}
{{- if $h.files }}
{{- $given = append $given (printf "handlers.files (%s)" (keys $h.files | sortAlpha | join ", ")) }}
{{- end }}
{{- if $h.existingConfigMap }}
{{- $given = append $given (printf "handlers.existingConfigMap=%s" $h.existingConfigMap) }}
{{- end }}
{{- if or $h.module $h.path }}
{{- $image := list }}
{{- if $h.module }}{{ $image = append $image (printf "handlers.module=%s" $h.module) }}{{ end }}
{{- if $h.path }}{{ $image = append $image (printf "handlers.path=%s" $h.path) }}{{ end }}
{{- $given = append $given (join " + " $image) }}
{{- end }}
{{- if gt (len $given) 1 }}
{{- fail (printf "declop: handlers are given twice: %s. Give exactly one source: handlers.files (a ConfigMap made from your files), handlers.existingConfigMap (a ConfigMap you manage), or handlers.module / handlers.path (handlers inside your image)." (join " and " $given)) }}
{{- end }}
{{- if $h.files }}
{{- $py := 0 }}
{{- range $name, $_ := $h.files }}{{ if hasSuffix ".py" $name }}{{ $py = add1 $py }}{{ end }}{{ end }}
{{- if eq $py 0 }}
{{- fail (printf "declop: handlers.files has no *.py file (%s); declop imports every *.py file of the ConfigMap." (keys $h.files | sortAlpha | join ", ")) }}
{{- end }}
{{- print "files" }}
{{- else if $h.existingConfigMap }}
{{- print "existingConfigMap" }}
{{- else if or $h.module $h.path }}
{{- print "image" }}
{{- else if $h.example }}
{{- print "example" }}
{{- else }}
{{- fail "declop: no handlers given (and handlers.example=false). Give exactly one source: handlers.files (a ConfigMap made from your files: --set-file handlers.files.handlers\\.py=./handlers.py), handlers.existingConfigMap (the name of a ConfigMap you manage), or handlers.module / handlers.path (handlers inside your image, built FROM the declop image)." }}
{{- end }}
{{- end }}

{{/*
Leader election: leaderElection.enabled when it is a boolean, otherwise on for replicaCount > 1.
Renders "true" or "false".
*/}}
{{- define "declop.leaderElect" -}}
{{- $enabled := .Values.leaderElection.enabled }}
{{- if .Values.sharding.enabled }}
{{- false }}
{{- else if kindIs "bool" $enabled }}
{{- $enabled }}
{{- else }}
{{- gt (int .Values.replicaCount) 1 }}
{{- end }}
{{- end }}

{{- define "declop.leaseName" -}}
{{- default (include "declop.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "declop.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace }}
{{- end }}

{{/*
Well-known mistaken keys (replicas for replicaCount …) → the value meant. values.schema.json lets
exactly these through (each marked "x-did-you-mean") so that this check can name the right key:
the schema alone would only say "additional properties 'replicas' not allowed". Every other
unknown key is still refused by the schema.
*/}}
{{- define "declop.mistakes" -}}
{{- $mistakes := dict }}
{{- $_ := set $mistakes "annotations" "podAnnotations" }}
{{- $_ := set $mistakes "args" "extraArgs" }}
{{- $_ := set $mistakes "containerSecurityContext" "securityContext" }}
{{- $_ := set $mistakes "env" "extraEnv" }}
{{- $_ := set $mistakes "handlers.configMap" "handlers.existingConfigMap" }}
{{- $_ := set $mistakes "handlers.file" "handlers.files" }}
{{- $_ := set $mistakes "image.name" "image.repository" }}
{{- $_ := set $mistakes "image.pullSecrets" "imagePullSecrets" }}
{{- $_ := set $mistakes "imagePullPolicy" "image.pullPolicy" }}
{{- $_ := set $mistakes "imageTag" "image.tag" }}
{{- $_ := set $mistakes "labels" "commonLabels" }}
{{- $_ := set $mistakes "leaderElect" "leaderElection.enabled" }}
{{- $_ := set $mistakes "leaderElection.enable" "leaderElection.enabled" }}
{{- $_ := set $mistakes "metrics.serviceMonitor" "serviceMonitor.enabled" }}
{{- $_ := set $mistakes "namespaces" "watchNamespaces" }}
{{- $_ := set $mistakes "pdb" "podDisruptionBudget" }}
{{- $_ := set $mistakes "pullSecrets" "imagePullSecrets" }}
{{- $_ := set $mistakes "rbac.enabled" "rbac.create" }}
{{- $_ := set $mistakes "replica" "replicaCount" }}
{{- $_ := set $mistakes "replicas" "replicaCount" }}
{{- $_ := set $mistakes "serviceAccount.enabled" "serviceAccount.create" }}
{{- $_ := set $mistakes "serviceAccountName" "serviceAccount.name" }}
{{- $_ := set $mistakes "terminationGracePeriodSeconds" "gracePeriod" }}
{{- $_ := set $mistakes "volumeMounts" "extraVolumeMounts" }}
{{- $_ := set $mistakes "volumes" "extraVolumes" }}
{{- $_ := set $mistakes "watchNamespace" "watchNamespaces" }}
{{- $_ := set $mistakes "webhook" "webhooks" }}
{{- $_ := set $mistakes "webhooks.enable" "webhooks.enabled" }}
{{- range $path, $meant := $mistakes }}
{{- $parts := splitList "." $path }}
{{- $node := $.Values }}
{{- range $part := initial $parts }}
{{- $node = and (kindIs "map" $node) (get $node $part) }}
{{- end }}
{{- if and (kindIs "map" $node) (hasKey $node (last $parts)) }}
{{- fail (printf "declop: unknown value '%s': did you mean '%s'? (values.yaml lists every value)" $path $meant) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Every check that is not a schema check. Included by deployment.yaml, so any render fails on it.
*/}}
{{- define "declop.validate" -}}
{{- include "declop.mistakes" . }}
{{- $_ := include "declop.handlersMode" . }}
{{- if and .Values.sharding.enabled (lt (int .Values.sharding.shards) (int .Values.replicaCount)) }}
{{- fail (printf "declop: sharding.shards=%d is less than replicaCount=%d: some replicas would reconcile nothing; use at least as many ranges as replicas (e.g. 16)." (int .Values.sharding.shards) (int .Values.replicaCount)) }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (ne (include "declop.leaderElect" .) "true") (not .Values.sharding.enabled) }}
{{- fail (printf "declop: replicaCount=%d with leaderElection.enabled=false would have %d Pods reconcile the same objects at once; enable leader election (leaderElection.enabled=true) or use replicaCount=1." (int .Values.replicaCount) (int .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not (and .Values.metrics.enabled .Values.metrics.service.enabled)) }}
{{- fail "declop: serviceMonitor.enabled=true needs metrics.enabled=true and metrics.service.enabled=true (it scrapes the metrics Service)." }}
{{- end }}
{{- if and (eq .Values.rbac.scope "namespaces") (not .Values.watchNamespaces) }}
{{- fail "declop: rbac.scope=namespaces needs the namespaces in watchNamespaces (it grants access there only); use rbac.scope=cluster to watch all namespaces." }}
{{- end }}
{{- if and .Values.webhooks.conversionCRDs (not .Values.webhooks.enabled) }}
{{- fail (printf "declop: webhooks.conversionCRDs (%s) needs webhooks.enabled=true: the converters are served by the webhook server." (join ", " .Values.webhooks.conversionCRDs)) }}
{{- end }}
{{- if .Values.webhooks.enabled }}
{{- $taken := dict (toString .Values.health.port) "health.port" }}
{{- if .Values.metrics.enabled }}{{ $_ := set $taken (toString .Values.metrics.port) "metrics.port" }}{{ end }}
{{- with get $taken (toString .Values.webhooks.port) }}
{{- fail (printf "declop: webhooks.port=%d is also %s; give the webhook server its own port (default 9443)." (int $.Values.webhooks.port) .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The RBAC rules of the watched resources, the event recorder and rbac.rules, as a YAML list:
rbac.generated as written by `declop rbac --values` (every rule the handlers need), else the
hand-typed rbac.watch entries and the event recorder.
*/}}
{{- define "declop.watch" -}}
{{- $watch := .Values.rbac.watch }}
{{- if eq (include "declop.handlersMode" .) "example" }}
{{- $watch = prepend $watch (dict "group" "" "resource" "pods") }}
{{- end }}
{{- toJson $watch }}
{{- end }}

{{- /* The verbs declop sends, by feature: files/permissions.json (one list, read by the tests too). */ -}}
{{- define "declop.permissions" -}}
{{- .Files.Get "files/permissions.json" }}
{{- end }}

{{- define "declop.rules" -}}
{{- $perms := include "declop.permissions" . | fromJson }}
{{- if .Values.rbac.generated }}
{{- if .Values.rbac.watch }}
{{- fail "declop: rbac.watch and rbac.generated are both given: rbac.generated (written by `declop rbac handlers.py --values FILE`) already has every rule the handlers need; drop rbac.watch (docs/rbac.md)." }}
{{- end }}
{{ toYaml .Values.rbac.generated }}
{{- else }}
{{- range (include "declop.watch" . | fromJsonArray) }}
{{- $verbs := $perms.watch.verbs }}
{{- if .finalizers }}{{ $verbs = concat $verbs $perms.finalizers.verbs }}{{ end }}
{{- $verbs = concat $verbs (default list .verbs) | uniq }}
- apiGroups: [{{ default "" .group | quote }}]
  resources: [{{ .resource | quote }}]
  verbs: {{ toJson $verbs }}
{{- if .status }}
- apiGroups: [{{ default "" .group | quote }}]
  resources: [{{ printf "%s/status" .resource | quote }}]
  verbs: {{ toJson $perms.status.verbs }}
{{- end }}
{{- end }}
- apiGroups: [{{ $perms.events.apiGroup | quote }}]
  resources: [{{ $perms.events.resource | quote }}]
  verbs: {{ toJson $perms.events.verbs }}
{{- end }}
{{- with .Values.rbac.rules }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Webhooks. The Service the apiserver calls (release namespace); the name the operator gives its
ValidatingWebhookConfiguration and MutatingWebhookConfiguration (cluster-scoped: named like the
ClusterRole, with the release namespace, so two releases never collide); the Secret holding the
CA declop generates, `<name>-webhook-ca` in the release namespace (declop derives it from the
name). The operator is told these names, so that the RBAC can be restricted to them.
*/}}
{{- define "declop.webhookServiceName" -}}
{{- printf "%s-webhook" (include "declop.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "declop.webhookName" -}}
{{- include "declop.clusterName" . }}
{{- end }}

{{- define "declop.webhookCASecretName" -}}
{{- printf "%s-webhook-ca" (include "declop.webhookName" .) }}
{{- end }}
