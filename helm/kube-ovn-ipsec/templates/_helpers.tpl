{{/*
Resolution of the two value styles, and the named templates Kube-OVN's own
charts include into their kube-ovn-cni DaemonSet (docs/chart.md). Every
conflicting or unusable value fails the render with what to change.
*/}}

{{/* One switch from two styles: v2 wins when only it is set; both set
     and different is a mistake the operator must resolve. */}}
{{- define "kube-ovn-ipsec.pick" -}}
{{- $v1 := index . 0 -}}{{- $v2 := index . 1 -}}{{- $what := index . 2 -}}{{- $default := index . 3 -}}
{{- if and (not (kindIs "invalid" $v1)) (not (kindIs "invalid" $v2)) (ne (toString $v1) (toString $v2)) -}}
{{- fail (printf "%s is set twice with different values (%v and %v): set one of them" $what $v1 $v2) -}}
{{- end -}}
{{- if not (kindIs "invalid" $v2) -}}{{ $v2 }}{{- else if not (kindIs "invalid" $v1) -}}{{ $v1 }}{{- else -}}{{ $default }}{{- end -}}
{{- end -}}

{{/* "true" when IPsec is wanted. */}}
{{- define "kube-ovn-ipsec.enabled" -}}
{{- include "kube-ovn-ipsec.pick" (list .Values.func.ENABLE_OVN_IPSEC .Values.features.enableOvnIpsec "IPsec (func.ENABLE_OVN_IPSEC / features.enableOvnIpsec)" false) -}}
{{- end -}}

{{/* "true" when Kube-OVN serves OVN's databases over SSL (its
     ENABLE_SSL): the controller's default NB/SB remotes are ssl:, and the
     controller mounts Kube-OVN's client key, certificate and CA. */}}
{{- define "kube-ovn-ipsec.ssl" -}}
{{- include "kube-ovn-ipsec.pick" (list .Values.networking.ENABLE_SSL .Values.networking.enableSsl "SSL to OVN's databases (networking.ENABLE_SSL / networking.enableSsl)" false) -}}
{{- end -}}

{{/* "true" when the controller reaches NB or SB over SSL: Kube-OVN's
     ENABLE_SSL, or an ssl: remote given. */}}
{{- define "kube-ovn-ipsec.ovnTls" -}}
{{- $given := false -}}
{{- range list .Values.controller.ovnNb .Values.controller.ovnSb -}}
{{- if and . (hasPrefix "ssl:" .) -}}{{- $given = true -}}{{- end -}}
{{- end -}}
{{- or (eq (include "kube-ovn-ipsec.ssl" .) "true") $given -}}
{{- end -}}

{{/* "true" when validated CSRs go to cert-manager. */}}
{{- define "kube-ovn-ipsec.certManager" -}}
{{- include "kube-ovn-ipsec.pick" (list .Values.func.CERT_MANAGER_IPSEC_CERT (ternary true nil .Values.ipsec.certManager.enabled) "cert-manager signing (func.CERT_MANAGER_IPSEC_CERT / ipsec.certManager.enabled)" false) -}}
{{- end -}}

{{/* The key directory: absolute, one value. */}}
{{- define "kube-ovn-ipsec.keyDirectory" -}}
{{- $dir := include "kube-ovn-ipsec.pick" (list .Values.OVN_IPSEC_KEY_DIR .Values.ipsec.keyDirectory "the key directory (OVN_IPSEC_KEY_DIR / ipsec.keyDirectory)" "/etc/origin/ovs_ipsec_keys") -}}
{{- if not (hasPrefix "/" $dir) -}}
{{- fail (printf "the key directory %q is not an absolute path" $dir) -}}
{{- end -}}
{{- $dir -}}
{{- end -}}

{{/* The cleanup init container is rendered ("true") when IPsec is off and
     nodes may still hold its state. */}}
{{- define "kube-ovn-ipsec.cleanup" -}}
{{- $mode := toString .Values.ipsec.cleanup.previousState -}}
{{- if eq (include "kube-ovn-ipsec.enabled" .) "true" -}}false
{{- else if eq $mode "true" -}}true
{{- else if eq $mode "false" -}}false
{{- else -}}
{{- /* auto: a reachable cluster answers the namespace lookup; then the
       coordination record decides. Offline (helm template, GitOps), the
       cleanup is rendered: it exits 0 at once on a node without state. */ -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- if $ns -}}
{{- if lookup "v1" "ConfigMap" .Release.Namespace "ovn-ipsec-coordination" -}}true{{- else -}}false{{- end -}}
{{- else -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Refuses what IPsec cannot encrypt. */}}
{{- define "kube-ovn-ipsec.checks" -}}
{{- if eq (include "kube-ovn-ipsec.enabled" .) "true" -}}
{{- $tunnel := include "kube-ovn-ipsec.pick" (list .Values.networking.TUNNEL_TYPE .Values.networking.tunnelType "the tunnel type (networking.TUNNEL_TYPE / networking.tunnelType)" "geneve") -}}
{{- if not (has $tunnel (list "geneve" "vxlan")) -}}
{{- fail (printf "IPsec encrypts geneve and vxlan tunnels only; the tunnel type is %q: use geneve or vxlan, or turn IPsec off" $tunnel) -}}
{{- end -}}
{{- end -}}
{{- if has "SYS_NICE" .Values.cni.capabilities -}}
{{- fail "cni.capabilities lists SYS_NICE: the CNI container always drops it (only the ipsec container gets it); remove it" -}}
{{- end -}}
{{- range list .Values.controller.ovnNb .Values.controller.ovnSb -}}
{{- if and . (not (or (hasPrefix "tcp:" .) (hasPrefix "ssl:" .))) -}}
{{- fail (printf "controller.ovnNb/ovnSb %q: use tcp:HOST:PORT or ssl:HOST:PORT" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kube-ovn-ipsec.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "kube-ovn-ipsec.labels" -}}
app.kubernetes.io/part-of: kube-ovn-ipsec
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* Who and where this node is, from the downward API, and where its
     state lives: what `run` and `cleanup` share. */}}
{{- define "kube-ovn-ipsec.nodeEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: POD_TEMPLATE_HASH
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['controller-revision-hash']
- name: OVN_IPSEC_KEY_DIR
  value: {{ include "kube-ovn-ipsec.keyDirectory" . | quote }}
- name: OVN_IPSEC_TRUST_NAMESPACE
  value: {{ .Release.Namespace | quote }}
{{- end -}}

{{- define "kube-ovn-ipsec.nodeMounts" -}}
- name: host-run-ovs
  mountPath: /run/openvswitch
- name: host-run-ovn
  mountPath: /run/ovn
- name: ovs-ipsec-keys
  mountPath: {{ include "kube-ovn-ipsec.keyDirectory" . }}
{{- end -}}

{{/* The agent's rekeying, as its environment; refused when the margin,
     stretched by the fuzz, reaches a lifetime (the agent would refuse to
     start: say it at render time). */}}
{{- define "kube-ovn-ipsec.rekeying" -}}
{{- $ike := int64 .Values.ipsec.ikeLifetime -}}
{{- $child := int64 .Values.ipsec.childLifetime -}}
{{- $margin := int64 .Values.ipsec.rekeyMargin -}}
{{- $fuzz := int64 .Values.ipsec.rekeyFuzz -}}
{{- $shorter := min $ike $child -}}
{{- if ge (mul $margin (add 100 $fuzz)) (mul $shorter 100) -}}
{{- fail (printf "ipsec.rekeyMargin %d s with %d%% rekeyFuzz starts rekeying before a %d s lifetime has begun: shorten the margin or the fuzz, or lengthen ipsec.ikeLifetime/childLifetime" $margin $fuzz $shorter) -}}
{{- end -}}
- name: OVN_IPSEC_IKE_LIFETIME
  value: {{ $ike | quote }}
- name: OVN_IPSEC_CHILD_LIFETIME
  value: {{ $child | quote }}
- name: OVN_IPSEC_REKEY_MARGIN
  value: {{ $margin | quote }}
- name: OVN_IPSEC_REKEY_FUZZ
  value: {{ $fuzz | quote }}
{{- end -}}

{{/* The `ipsec` container (IPsec on): include under the CNI Pod's
     `containers:`. */}}
{{- define "kube-ovn-ipsec.cniContainers" -}}
{{- if eq (include "kube-ovn-ipsec.enabled" .) "true" -}}
- name: ipsec
  image: {{ include "kube-ovn-ipsec.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/kube-ovn/kube-ovn-ipsec"]
  args:
    - run
    - --status-addr=0.0.0.0:{{ .Values.ipsec.statusPort }}
    - --monitor-log-file=/var/log/openvswitch/ovs-monitor-ipsec.log
  env:
    {{- include "kube-ovn-ipsec.nodeEnv" . | nindent 4 }}
    - name: OVN_IPSEC_CERT_LIFETIME
      value: {{ .Values.ipsec.certificateDuration | quote }}
    - name: OVN_IPSEC_REQUEST_TIMEOUT
      value: {{ .Values.ipsec.requestTimeout | quote }}
    - name: OVN_IPSEC_RESERVED_MARK_BITS
      value: {{ .Values.ipsec.reservedMarkBits | quote }}
    {{- include "kube-ovn-ipsec.rekeying" . | nindent 4 }}
    {{- with .Values.ipsec.tunnelMTU }}
    - name: OVN_IPSEC_TUNNEL_MTU
      value: {{ . | quote }}
    {{- end }}
  securityContext:
    runAsUser: 0
    privileged: false
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      add: [NET_ADMIN, NET_BIND_SERVICE, SYS_NICE]
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ .Values.ipsec.statusPort }}
    periodSeconds: 5
    timeoutSeconds: 2
    failureThreshold: 3
  resources:
    {{- toYaml .Values.ipsec.resources | nindent 4 }}
  volumeMounts:
    {{- include "kube-ovn-ipsec.nodeMounts" . | nindent 4 }}
    - name: host-log-ovs
      mountPath: /var/log/openvswitch
{{- end -}}
{{- end -}}

{{/* The one-shot `ipsec-cleanup` init container (IPsec off, previous
     state): include under the CNI Pod's `initContainers:`. No
     restartPolicy (not a sidecar), no probes. */}}
{{- define "kube-ovn-ipsec.cniInitContainers" -}}
{{- if eq (include "kube-ovn-ipsec.cleanup" .) "true" -}}
- name: ipsec-cleanup
  image: {{ include "kube-ovn-ipsec.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/kube-ovn/kube-ovn-ipsec"]
  args: ["cleanup"]
  env:
    {{- include "kube-ovn-ipsec.nodeEnv" . | nindent 4 }}
    - name: OVN_IPSEC_CLEANUP_WAIT
      value: {{ .Values.ipsec.cleanup.wait | quote }}
  securityContext:
    runAsUser: 0
    privileged: false
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      add: [NET_ADMIN, NET_BIND_SERVICE]
  terminationMessagePolicy: FallbackToLogsOnError
  resources:
    {{- toYaml .Values.ipsec.cleanup.resources | nindent 4 }}
  volumeMounts:
    {{- include "kube-ovn-ipsec.nodeMounts" . | nindent 4 }}
{{- end -}}
{{- end -}}

{{/* The volumes the two containers above mount: include under the CNI
     Pod's `volumes:` (names that Kube-OVN's chart does not use already
     are prefixed). */}}
{{- define "kube-ovn-ipsec.cniVolumes" -}}
{{- if or (eq (include "kube-ovn-ipsec.enabled" .) "true") (eq (include "kube-ovn-ipsec.cleanup" .) "true") -}}
- name: ovs-ipsec-keys
  hostPath:
    path: {{ include "kube-ovn-ipsec.keyDirectory" . }}
    type: DirectoryOrCreate
{{- end -}}
{{- end -}}
