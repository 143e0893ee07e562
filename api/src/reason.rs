//! Why an agent is not simply `Active` ([`Reason`]): the machine-readable
//! reasons of `/status`, `/readyz`, the data path's peers and the actors'
//! errors, each with the message an operator acts on. Its own module so
//! the status document and the data-path health both use it without
//! depending on each other.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why the agent is not simply `Active`: machine-readable, with an
/// operator-actionable [`Reason::message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Reason {
    /// The key directory cannot be written.
    KeyDirReadOnly,
    /// Another process holds the key directory's owner lock.
    KeyDirLocked,
    /// The key directory's filesystem is full.
    KeyDirFull,
    /// The image's ovn-controller does not advertise the capability.
    CapabilityMissing,
    /// The running ovn-controller's capability differs from the image's.
    CapabilityMismatch,
    /// OVS `system-id` is missing or disagrees with the Node's chassis
    /// annotation.
    ChassisUnknown,
    /// Persisted state (lease, identity) belongs to a different Node UID.
    NodeUidMismatch,
    /// The CSR awaits the controller.
    CsrPending,
    /// The controller denied the CSR.
    CsrDenied,
    /// The signer reported a failure on the CSR.
    CsrFailed,
    /// The CSR was not issued within the request timeout.
    CsrTimeout,
    /// A Kubernetes API call for the CSR failed (refused, forbidden,
    /// invalid, or the CSR vanished).
    CsrApiError,
    /// The issued certificate does not match the pending key or chassis.
    CertificateMismatch,
    /// The trust ConfigMap is missing.
    TrustBundleMissing,
    /// The trust bundle does not parse, has no CA, or holds a CA the IKE
    /// daemon would refuse to load.
    TrustBundleInvalid,
    /// The active identity does not verify against the current trust.
    IdentityUntrusted,
    /// The active certificate has expired.
    Expired,
    /// Renewal keeps failing; the current identity is still valid.
    RenewalFailing,
    /// The OVSDB activation transaction failed.
    ActivationFailed,
    /// OVSDB is unreachable.
    OvsdbUnavailable,
    /// The monitor's read-back does not match the active generation.
    MonitorNotAcknowledged,
    /// The IKE daemon is down or failing its probe.
    IkeDaemonUnhealthy,
    /// ovs-monitor-ipsec is down or failing its probe.
    MonitorUnhealthy,
    /// An outbound ALLOW policy without ESP would let marked traffic bypass
    /// the guard; lease allocation refused.
    BypassPolicyPresent,
    /// No mark/reqid candidate avoids existing policies and reserved bits.
    LeaseAllocationFailed,
    /// A guard was missing from the kernel (re-added).
    GuardMissing,
    /// The key directory's lease file does not decode or cannot be read:
    /// the guards it names cannot be attributed.
    LeaseFileInvalid,
    /// A foreign policy occupies a guard's place; not overwritten.
    GuardConflict,
    /// The last read-back of the guards is older than `/readyz` accepts.
    GuardReadbackStale,
    /// Keys the agent publishes in OVSDB (the lease, the identity paths)
    /// were changed by someone else and are not restored yet.
    OvsdbDrift,
    /// SAs up, outbound bytes grow, inbound stay flat.
    InboundMissing,
    /// No outbound SA to a peer and the guards drop its marked traffic.
    GuardDrop,
    /// A tunnel with IPsec intent has no SA (in one direction or both).
    #[serde(rename = "NoSA")]
    NoSa,
    /// Tunnel MTU too small for ESP overhead.
    MtuTooSmall,
    /// The data path cannot be measured (the datapath actor keeps failing).
    DatapathUnmeasured,
    /// Waiting for the controller's next coordination phase.
    WaitingForCoordination,
    /// The coordination record is unreadable or inconsistent.
    CoordinationInvalid,
    /// A reason from a newer agent that this build does not know.
    #[serde(other)]
    Unknown,
}

impl Reason {
    /// The message an operator acts on. Static text: no values, so nothing
    /// secret can leak through it.
    pub fn message(self) -> &'static str {
        use Reason::*;
        match self {
            KeyDirReadOnly => {
                "the IPsec key directory is not writable; on hosts with a read-only /etc (Talos) \
                 set OVN_IPSEC_KEY_DIR / the chart's ipsec key directory to /var/lib/ovs_ipsec_keys"
            }
            KeyDirLocked => {
                "another kube-ovn-ipsec process holds the key directory lock; check for a second \
                 ipsec container or a leftover process on the host"
            }
            KeyDirFull => {
                "the filesystem of the IPsec key directory is full; free space on it (the agent \
                 needs a few KiB per identity generation) — the active identity stays in use"
            }
            CapabilityMissing => {
                "the image's ovn-controller lacks the 'IPsec output protection version 1' patch; \
                 use an image built with the OVN/OVS output protection patch"
            }
            CapabilityMismatch => {
                "the running ovn-controller does not advertise 'IPsec output protection version \
                 1'; restart or upgrade ovn-controller on this node to the patched image"
            }
            ChassisUnknown => {
                "OVS external_ids:system-id is missing or differs from the Node's \
                 ovn.kubernetes.io/chassis annotation; wait for kube-ovn-cni to register the chassis"
            }
            NodeUidMismatch => {
                "persisted IPsec state belongs to a different Node UID (node re-created); it is \
                 not inherited — the controller must retire the old node"
            }
            CsrPending => "waiting for the controller to sign the IPsec CSR (kubectl get csr)",
            CsrDenied => {
                "the controller denied the IPsec CSR; see the CSR's Denied condition for the \
                 failed check (kubectl describe csr)"
            }
            CsrFailed => {
                "the signer failed the IPsec CSR; check the controller and, in cert-manager \
                 mode, the CertificateRequest and ClusterIssuer"
            }
            CsrTimeout => {
                "the IPsec CSR was not issued within the request timeout; check that the \
                 controller is running and the API server is reachable"
            }
            CsrApiError => {
                "a Kubernetes API call for the IPsec CSR failed (refused, forbidden, invalid, or \
                 the CSR was deleted); the agent retries — its log has the API's answer; check \
                 the kube-ovn-cni ServiceAccount's RBAC for certificatesigningrequests"
            }
            CertificateMismatch => {
                "the issued certificate does not match the pending key or chassis; the agent \
                 will request a new one — check the signer configuration if this repeats"
            }
            TrustBundleMissing => {
                "ConfigMap ovn-ipsec-trust (key ca.crt) is missing; check the controller"
            }
            TrustBundleInvalid => {
                "ConfigMap ovn-ipsec-trust key ca.crt is not a valid PEM bundle of CA \
                 certificates the IKE daemon loads (the agent's log names the certificate and \
                 why); fix the bundle at the controller"
            }
            IdentityUntrusted => {
                "the active certificate does not verify against the current trust bundle (CA \
                 rotation?); renewing now"
            }
            Expired => {
                "the IPsec certificate has expired and renewal has not succeeded; check CSR \
                 approval (kubectl get csr) and the controller"
            }
            RenewalFailing => {
                "certificate renewal keeps failing; the current identity stays active until it \
                 expires — check CSR approval and the controller"
            }
            ActivationFailed => {
                "writing the identity to OVSDB failed; check ovsdb-server on this node"
            }
            OvsdbUnavailable => {
                "cannot reach the local OVSDB server, or its Open_vSwitch row is missing; check \
                 ovsdb-server (openvswitch) on this node — the guards stay armed meanwhile"
            }
            MonitorNotAcknowledged => {
                "ovs-monitor-ipsec has not loaded the active certificate and trust bundle; see \
                 'ovs-appctl ipsec/show' and the monitor log"
            }
            IkeDaemonUnhealthy => {
                "the IKE daemon is down or not answering; it is being restarted with backoff — \
                 see the ipsec container log"
            }
            MonitorUnhealthy => {
                "ovs-monitor-ipsec is down or not answering; it is being restarted with backoff"
            }
            BypassPolicyPresent => {
                "an outbound XFRM allow policy without ESP would let IPsec traffic leave in \
                 plaintext; remove it ('ip xfrm policy') before protection can be armed"
            }
            LeaseAllocationFailed => {
                "no output mark/reqid avoids the existing XFRM policies and reserved mark bits; \
                 review the reserved mark configuration and foreign XFRM state"
            }
            GuardMissing => {
                "an output protection guard was missing from the kernel and has been re-added; \
                 check for tools that flush XFRM policies"
            }
            LeaseFileInvalid => {
                "the key directory's lease file (protection-lease.json) does not decode or cannot \
                 be read — the ipsec container log names the defect; the agent will not allocate \
                 a new lease over it (the old guards would stay in the kernel unowned): restore \
                 the file, and never delete it while OVSDB publishes its lease"
            }
            GuardConflict => {
                "a foreign XFRM policy occupies the guard's selector and priority; it is not \
                 overwritten — remove the foreign policy"
            }
            GuardReadbackStale => {
                "the output-protection guards were not read back from the kernel within the last \
                 second: the protection actor is stalled or restarting; readiness returns once it \
                 reads them back"
            }
            OvsdbDrift => {
                "someone removed or changed the agent's keys in the Open_vSwitch table (the \
                 ovn-ipsec-protection-* external_ids or other_config private_key/certificate/\
                 ca_cert); the agent restores them — find what edits them (ovs-vsctl, a \
                 replaced conf.db)"
            }
            InboundMissing => {
                "SAs are up but no inbound encrypted traffic arrives: ESP (IP proto 50) or UDP \
                 4500 dropped on the underlay, or MTU"
            }
            GuardDrop => {
                "marked overlay traffic to a peer is dropped by the output-protection guards: no \
                 outbound SA — the IKE daemon is down or has no CHILD_SA for the tunnel; see \
                 'ipsec statusall' and the ipsec container log (traffic is dropped, never sent \
                 in plaintext)"
            }
            NoSa => {
                "a tunnel with IPsec intent has no SA: IKE negotiation with the peer is pending \
                 or failing — check UDP 500/4500 between the nodes, both nodes' certificate \
                 digests (/status) and 'ipsec statusall'"
            }
            MtuTooSmall => {
                "the tunnel MTU does not leave room for ESP overhead: large packets between Pods \
                 are dropped; /status 'mtu' (or ovs-appctl ipsec/show) gives the numbers and the \
                 largest tunnel MTU that fits — lower the Pod MTU to it or raise the underlay MTU"
            }
            DatapathUnmeasured => {
                "the agent cannot read the data path's counters (XFRM SAs, /proc/net/xfrm_stat); \
                 encryption is unaffected — see the ipsec container log"
            }
            WaitingForCoordination => {
                "waiting for the controller to advance IPsec coordination (ConfigMap \
                 ovn-ipsec-coordination)"
            }
            CoordinationInvalid => {
                "ConfigMap ovn-ipsec-coordination is unreadable or inconsistent; do not edit it \
                 by hand — check the controller"
            }
            Unknown => "unknown reason reported by a newer agent",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The serde name, so logs and JSON agree.
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(s)) => f.write_str(&s),
            _ => write!(f, "{self:?}"),
        }
    }
}
