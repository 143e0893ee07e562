//! Names that other components, the chart and the tests depend on
//! (SPEC.md: "Names in `code` are the contract").
//!
//! Grouped by where the name lives: Kubernetes objects, OVSDB columns, the
//! host, and numeric defaults. Change one only together with everything that
//! uses it.

/// Kubernetes annotation keys, token extra keys and object names.
pub mod k8s {
    /// CSR annotation: the requesting Node's name (SPEC §2).
    pub const ANNOTATION_NODE: &str = "kube-ovn.io/ipsec-node";
    /// CSR annotation: the requesting Node's UID (SPEC §2).
    pub const ANNOTATION_NODE_UID: &str = "kube-ovn.io/ipsec-node-uid";
    /// CSR annotation: the chassis (OVS `system-id`) the certificate names.
    pub const ANNOTATION_CHASSIS: &str = "kube-ovn.io/ipsec-chassis";
    /// CSR annotation: the agent's identity generation this CSR is for.
    pub const ANNOTATION_GENERATION: &str = "kube-ovn.io/ipsec-generation";
    /// Node annotation: the node's signed coordination receipt (SPEC §7).
    pub const ANNOTATION_RECEIPT: &str = "kube-ovn.io/ipsec-receipt";
    /// Node annotation: the node's signed release receipt (SPEC §7, §8).
    pub const ANNOTATION_RELEASE_RECEIPT: &str = "kube-ovn.io/ipsec-release-receipt";
    /// Node annotation Kube-OVN publishes with the node's chassis.
    pub const ANNOTATION_OVN_CHASSIS: &str = "ovn.kubernetes.io/chassis";

    /// CSR `spec.extra` key the API server stamps from a Pod-bound
    /// ServiceAccount token: the Pod's UID. The node cannot forge it.
    pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
    /// CSR `spec.extra` key: the bound Pod's name.
    pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
    /// CSR `spec.extra` key: the bound Pod's Node name.
    pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

    /// The CSR `signerName` this project owns.
    pub const SIGNER_NAME: &str = "kubeovn.io/signer";
    /// The exact CSR `usages` list, in order.
    pub const CSR_USAGES: [&str; 1] = ["ipsec tunnel"];
    /// Every IPsec CSR name starts with this (the `csr` module derives the
    /// names, `csr::csr_name`).
    pub const CSR_NAME_PREFIX: &str = "ovn-ipsec-";
    /// Organisation (`O=`) of every IPsec leaf subject.
    pub const SUBJECT_ORGANIZATION: &str = "kube-ovn";

    /// ConfigMap with the trust bundle, in the controller's namespace.
    pub const TRUST_CONFIGMAP: &str = "ovn-ipsec-trust";
    /// Key of the PEM trust bundle in [`TRUST_CONFIGMAP`].
    pub const TRUST_CONFIGMAP_KEY: &str = "ca.crt";
    /// Annotation on [`TRUST_CONFIGMAP`]: the hex SHA-256 of the DER of the
    /// CA the controller signs with now, written once it does. A node whose
    /// leaf came from another CA and predates this one renews onto it
    /// within the agent's rotation spread (a CA rotation). Absent (e.g. an
    /// operator-provided bundle in cert-manager mode): no early renewal.
    pub const SIGNING_CA_ANNOTATION: &str = "kube-ovn.io/ipsec-signing-ca";
    /// Secret with the built-in signer's CA key and certificate.
    pub const CA_SECRET: &str = "ovn-ipsec-ca";
    /// ConfigMap holding the coordination record (only the controller writes).
    pub const COORDINATION_CONFIGMAP: &str = "ovn-ipsec-coordination";
    /// Key of the JSON coordination record in [`COORDINATION_CONFIGMAP`].
    pub const COORDINATION_CONFIGMAP_KEY: &str = "state";
    /// Key of the cohort's status in [`COORDINATION_CONFIGMAP`] (JSON,
    /// written by the controller for `kube-ovn-ipsec-controller status`).
    pub const COORDINATION_STATUS_KEY: &str = "status";
    /// Annotation on [`COORDINATION_CONFIGMAP`] holding the operator's
    /// retirement requests: a JSON object, Node name → the UID the cohort
    /// froze for it (`kube-ovn-ipsec-controller retire-node`).
    pub const ANNOTATION_RETIRE: &str = "kube-ovn.io/ipsec-retire";
    /// Name of the agent container in the kube-ovn-cni DaemonSet while
    /// IPsec is enabled (SPEC §9).
    pub const CONTAINER_IPSEC: &str = "ipsec";
    /// Name of the cleanup init container that replaces [`CONTAINER_IPSEC`]
    /// once IPsec is disabled (SPEC §8): the DaemonSet's "cleanup shape" is
    /// this init container and no [`CONTAINER_IPSEC`].
    pub const INIT_CONTAINER_CLEANUP: &str = "ipsec-cleanup";
}

/// OVSDB (`Open_vSwitch` database) column keys.
pub mod ovs {
    /// `Open_vSwitch . other_config` key: path of the active private key.
    pub const OTHER_CONFIG_PRIVATE_KEY: &str = "private_key";
    /// `Open_vSwitch . other_config` key: path of the active certificate.
    pub const OTHER_CONFIG_CERTIFICATE: &str = "certificate";
    /// `Open_vSwitch . other_config` key: path of the active CA bundle.
    pub const OTHER_CONFIG_CA_CERT: &str = "ca_cert";
    /// The three identity keys, always written together in one transaction.
    pub const IDENTITY_KEYS: [&str; 3] = [
        OTHER_CONFIG_PRIVATE_KEY,
        OTHER_CONFIG_CERTIFICATE,
        OTHER_CONFIG_CA_CERT,
    ];

    /// `Open_vSwitch . external_ids` key: the chassis name.
    pub const EXTERNAL_ID_SYSTEM_ID: &str = "system-id";
    /// `Open_vSwitch.external_ids` key: the tunnel types ovn-controller
    /// builds (comma-separated; Kube-OVN writes its `TUNNEL_TYPE`).
    pub const EXTERNAL_ID_ENCAP_TYPE: &str = "ovn-encap-type";
    /// `external_ids` key: Node UID the published lease belongs to.
    pub const EXTERNAL_ID_PROTECTION_NODE_UID: &str = "ovn-ipsec-protection-node-uid";
    /// `external_ids` key: the lease id.
    pub const EXTERNAL_ID_PROTECTION_LEASE: &str = "ovn-ipsec-protection-lease";
    /// `external_ids` key: the lease's output mark (decimal or 0x hex).
    pub const EXTERNAL_ID_PROTECTION_MARK: &str = "ovn-ipsec-protection-mark";
    /// `external_ids` key: the lease's reqid.
    pub const EXTERNAL_ID_PROTECTION_REQID: &str = "ovn-ipsec-protection-reqid";
    /// The four lease keys, published and withdrawn together.
    pub const PROTECTION_KEYS: [&str; 4] = [
        EXTERNAL_ID_PROTECTION_NODE_UID,
        EXTERNAL_ID_PROTECTION_LEASE,
        EXTERNAL_ID_PROTECTION_MARK,
        EXTERNAL_ID_PROTECTION_REQID,
    ];

    /// Tunnel `Interface . options` key: skb mark set on egress tunnel
    /// packets. ovs-vswitchd parses it in base 10 only: a `0x` value reads
    /// as 0, which leaves the tunnel's packets unmarked (plaintext).
    pub const OPTION_EGRESS_PKT_MARK: &str = "egress_pkt_mark";
    /// Tunnel option: `<mark>/0xffffffff` for the IPsec output policy.
    pub const OPTION_IPSEC_MARK_OUT: &str = "ipsec_mark_out";
    /// Tunnel option: the reqid of this node's IPsec policies and SAs.
    pub const OPTION_IPSEC_REQID: &str = "ipsec_reqid";
    /// Tunnel option: peer's certificate name; present iff IPsec is on.
    pub const OPTION_REMOTE_NAME: &str = "remote_name";
    /// The four tunnel options of IPsec intent, set and removed together.
    pub const TUNNEL_PROTECTION_OPTIONS: [&str; 4] = [
        OPTION_REMOTE_NAME,
        OPTION_EGRESS_PKT_MARK,
        OPTION_IPSEC_MARK_OUT,
        OPTION_IPSEC_REQID,
    ];
}

/// Host-side names: directories, environment, capability marker.
pub mod host {
    /// Default key directory (SPEC §2).
    pub const DEFAULT_KEY_DIR: &str = "/etc/origin/ovs_ipsec_keys";
    /// Key directory for hosts with read-only `/etc` (Talos).
    pub const READ_ONLY_ETC_KEY_DIR: &str = "/var/lib/ovs_ipsec_keys";
    /// Environment variable that overrides [`DEFAULT_KEY_DIR`].
    pub const ENV_KEY_DIR: &str = "OVN_IPSEC_KEY_DIR";
    /// Marker the patched ovn-controller prints in `--version` and its
    /// unixctl version reply (SPEC §4 capability gate).
    pub const CAPABILITY_MARKER: &str = "IPsec output protection version 1";
}

/// Numeric defaults and limits.
pub mod defaults {
    /// kube-proxy's mark bits, never used for a lease mark by default.
    pub const RESERVED_MARK_BITS: u32 = 0x4000 | 0x8000;
    /// Mask of the output mark in policies and tunnel options (exact match).
    pub const MARK_MASK: u32 = 0xffff_ffff;
    /// Lowest possible XFRM precedence: the guards lose to every real policy.
    pub const GUARD_PRIORITY: u32 = (1 << 31) - 1;
    /// Smallest allocatable reqid.
    pub const REQID_MIN: u32 = 1;
    /// Largest allocatable reqid (2^31 - 1).
    pub const REQID_MAX: u32 = (1 << 31) - 1;
    /// Default requested leaf lifetime, CSR `expirationSeconds` (7 days).
    pub const CERTIFICATE_LIFETIME_SECS: u32 = 7 * 24 * 60 * 60;
    /// Window over which nodes renew onto a newly announced signing CA
    /// (5 minutes: a thousand nodes are ~3 CSRs per second).
    pub const ROTATION_SPREAD_SECS: u64 = 5 * 60;
    /// Leaf `NotBefore` backdating (5 minutes) for clock skew.
    pub const NOT_BEFORE_BACKDATE_SECS: u32 = 5 * 60;
    /// Renewal window start, as a fraction of the leaf lifetime.
    pub const RENEWAL_WINDOW_START: f64 = 0.4;
    /// Renewal window end, as a fraction of the leaf lifetime.
    pub const RENEWAL_WINDOW_END: f64 = 0.6;
    /// Restart backoff: first delay in seconds.
    pub const BACKOFF_INITIAL_SECS: u64 = 1;
    /// Restart backoff: cap in seconds.
    pub const BACKOFF_MAX_SECS: u64 = 30;
    /// Restart backoff resets after this many seconds of healthy running.
    pub const BACKOFF_RESET_AFTER_SECS: u64 = 60;
    /// A receipt older than this does not satisfy a barrier (SPEC §7).
    pub const RECEIPT_MAX_AGE_SECS: i64 = 120;
    /// Cap on a signed receipt annotation value, in bytes. A receipt is
    /// ~1 KiB; the cap keeps a hostile Node object from costing the
    /// controller more than a few KiB per decode.
    pub const RECEIPT_MAX_BYTES: usize = 8 * 1024;
    /// Cap on the coordination record (`state` key). ConfigMaps are limited
    /// to 1 MiB; 512 KiB leaves room for ~5000 targets.
    pub const COORDINATION_MAX_BYTES: usize = 512 * 1024;
}

/// Process exit codes with a meaning other components rely on.
pub mod exit_code {
    /// Success.
    pub const OK: i32 = 0;
    /// Generic failure; the caller retries.
    pub const FAILURE: i32 = 1;
    /// The capability gate failed (SPEC §4): the image or the running
    /// ovn-controller lacks [`super::host::CAPABILITY_MARKER`]. Distinct so
    /// the operator sees it in `kubectl get pod` without reading logs.
    pub const CAPABILITY_MISSING: i32 = 3;
    /// `cleanup` refused: evidence missing, foreign owner or drain not
    /// complete. Guards stay armed and the node retries later (SPEC §8).
    pub const CLEANUP_NOT_SAFE: i32 = 4;
}
