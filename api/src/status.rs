//! The agent's `/status` document (SPEC §5) with its phase and reason.
//!
//! The document holds only booleans, validated identifiers, timestamps and
//! SHA-256 digests: it has no field that could carry PEM, a private key or
//! an SA key, and the identifier types reject the characters PEM needs.
//! `message` is not stored: it is derived from `reason` on serialisation, so
//! no free text reaches the endpoint.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::datapath::{MtuReport, PeerHealth};
use crate::digest::Sha256Digest;
use crate::ident::{Chassis, Uid};
use crate::time::Timestamp;

/// Where the agent is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Phase {
    /// Process started; identity, lease and runtime not evaluated yet.
    Starting,
    /// IPsec is not enabled for this node (coordination `Disabled`, or the
    /// node is not a target); the agent holds nothing.
    Disabled,
    /// A CSR is submitted (or about to be) and not yet issued.
    Pending,
    /// Coordination `Prepare`: identity ready and capability verified;
    /// nothing published or armed.
    Prepare,
    /// Coordination `Arm`: lease published, guards being armed, runtime
    /// starting, waiting for the monitor acknowledgement.
    Arming,
    /// Armed, applied, healthy: ready.
    Active,
    /// Running with a problem named by `reason`; protection stays armed.
    Degraded,
    /// The active certificate has expired and no renewal succeeded.
    Expired,
    /// The capability gate failed; the agent stops with a distinct exit
    /// code ([`crate::names::exit_code::CAPABILITY_MISSING`]).
    CapabilityMissing,
    /// A configuration or host problem the agent cannot fix itself
    /// (`reason` says which); it will not proceed until it is fixed.
    Failed,
    /// A phase from a newer agent that this build does not know.
    #[serde(other)]
    Unknown,
}

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
    /// The trust bundle does not parse or has no CA.
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
                 certificates; fix the bundle at the controller"
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

/// The `/status` document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "StatusWire", from = "StatusWire")]
pub struct Status {
    /// Lifecycle phase.
    pub phase: Phase,
    /// Why the phase is not `Active`, or a warning while `Active`.
    pub reason: Option<Reason>,
    /// The active generation is in OVSDB and the monitor read-back matched
    /// (certificate, CA and trust digest).
    pub configuration_applied: bool,
    /// IKE daemon and monitor healthy.
    pub runtime_healthy: bool,
    /// Guards read back from the kernel.
    pub protection_armed: bool,
    /// notAfter of the active certificate.
    pub expires: Option<Timestamp>,
    /// The Node's UID.
    pub node_uid: Option<Uid>,
    /// The chassis name.
    pub chassis: Option<Chassis>,
    /// The active identity generation.
    pub generation: Option<u64>,
    /// SHA-256 of the active certificate's DER.
    pub certificate_digest: Option<Sha256Digest>,
    /// The trust digest the monitor acknowledged.
    pub trust_digest: Option<Sha256Digest>,
    /// Datapath health from SA counters (SPEC §10); absent until measured.
    pub datapath_healthy: Option<bool>,
    /// Per peer: state, reason, since, SA counters, enable window.
    pub peers: Vec<PeerHealth>,
    /// The MTU check, when measured.
    pub mtu: Option<MtuReport>,
}

impl Status {
    /// The document at process start.
    pub fn starting() -> Self {
        Status {
            phase: Phase::Starting,
            reason: None,
            configuration_applied: false,
            runtime_healthy: false,
            protection_armed: false,
            expires: None,
            node_uid: None,
            chassis: None,
            generation: None,
            certificate_digest: None,
            trust_digest: None,
            datapath_healthy: None,
            peers: Vec::new(),
            mtu: None,
        }
    }

    /// The `/readyz` rule (SPEC §5): an unexpired certificate, and either
    /// `Prepare` with the identity ready, or runtime healthy, guards read
    /// back and the current trust digest acknowledged.
    ///
    /// `current_trust` is the digest of the trust bundle the agent holds now;
    /// an acknowledgement of an older bundle does not count.
    pub fn is_ready(&self, now: Timestamp, current_trust: &Sha256Digest) -> bool {
        let unexpired = self.expires.is_some_and(|e| now < e);
        if !unexpired || self.certificate_digest.is_none() {
            return false;
        }
        if self.phase == Phase::Prepare {
            return true;
        }
        self.runtime_healthy
            && self.protection_armed
            && self.configuration_applied
            && self.trust_digest.as_ref() == Some(current_trust)
    }

    /// The derived operator message, if there is a reason.
    pub fn message(&self) -> Option<&'static str> {
        self.reason.map(Reason::message)
    }
}

/// Wire form: the field names of SPEC §5 plus the derived `message`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusWire {
    phase: Phase,
    reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    configuration_applied: bool,
    runtime_healthy: bool,
    protection_armed: bool,
    expires: Option<Timestamp>,
    #[serde(rename = "nodeUID")]
    node_uid: Option<Uid>,
    chassis: Option<Chassis>,
    generation: Option<u64>,
    certificate_digest: Option<Sha256Digest>,
    trust_digest: Option<Sha256Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    datapath_healthy: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    peers: Vec<PeerHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mtu: Option<MtuReport>,
}

impl From<Status> for StatusWire {
    fn from(s: Status) -> Self {
        StatusWire {
            phase: s.phase,
            reason: s.reason,
            message: s.message().map(str::to_owned),
            configuration_applied: s.configuration_applied,
            runtime_healthy: s.runtime_healthy,
            protection_armed: s.protection_armed,
            expires: s.expires,
            node_uid: s.node_uid,
            chassis: s.chassis,
            generation: s.generation,
            certificate_digest: s.certificate_digest,
            trust_digest: s.trust_digest,
            datapath_healthy: s.datapath_healthy,
            peers: s.peers,
            mtu: s.mtu,
        }
    }
}

impl From<StatusWire> for Status {
    fn from(w: StatusWire) -> Self {
        // `message` is dropped: it is always re-derived from `reason`.
        Status {
            phase: w.phase,
            reason: w.reason,
            configuration_applied: w.configuration_applied,
            runtime_healthy: w.runtime_healthy,
            protection_armed: w.protection_armed,
            expires: w.expires,
            node_uid: w.node_uid,
            chassis: w.chassis,
            generation: w.generation,
            certificate_digest: w.certificate_digest,
            trust_digest: w.trust_digest,
            datapath_healthy: w.datapath_healthy,
            peers: w.peers,
            mtu: w.mtu,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PHASES: [Phase; 10] = [
        Phase::Starting,
        Phase::Disabled,
        Phase::Pending,
        Phase::Prepare,
        Phase::Arming,
        Phase::Active,
        Phase::Degraded,
        Phase::Expired,
        Phase::CapabilityMissing,
        Phase::Failed,
    ];

    const REASONS: [Reason; 37] = [
        Reason::KeyDirReadOnly,
        Reason::KeyDirLocked,
        Reason::KeyDirFull,
        Reason::CapabilityMissing,
        Reason::CapabilityMismatch,
        Reason::ChassisUnknown,
        Reason::NodeUidMismatch,
        Reason::CsrPending,
        Reason::CsrDenied,
        Reason::CsrFailed,
        Reason::CsrTimeout,
        Reason::CsrApiError,
        Reason::CertificateMismatch,
        Reason::TrustBundleMissing,
        Reason::TrustBundleInvalid,
        Reason::IdentityUntrusted,
        Reason::Expired,
        Reason::RenewalFailing,
        Reason::ActivationFailed,
        Reason::OvsdbUnavailable,
        Reason::MonitorNotAcknowledged,
        Reason::IkeDaemonUnhealthy,
        Reason::MonitorUnhealthy,
        Reason::BypassPolicyPresent,
        Reason::LeaseAllocationFailed,
        Reason::GuardMissing,
        Reason::LeaseFileInvalid,
        Reason::GuardConflict,
        Reason::GuardReadbackStale,
        Reason::OvsdbDrift,
        Reason::InboundMissing,
        Reason::GuardDrop,
        Reason::NoSa,
        Reason::MtuTooSmall,
        Reason::DatapathUnmeasured,
        Reason::WaitingForCoordination,
        Reason::CoordinationInvalid,
    ];

    fn opt<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
        prop::option::of(s)
    }

    prop_compose! {
        fn arb_status()(
            phase in prop::sample::select(PHASES.to_vec()),
            reason in opt(prop::sample::select(REASONS.to_vec())),
            flags in any::<[bool; 3]>(),
            expires in opt((0i64..4_000_000_000).prop_map(|s| Timestamp::from_unix(s).unwrap())),
            node_uid in opt("[a-z0-9-]{1,36}".prop_map(|s| Uid::new(s).unwrap())),
            chassis in opt("[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?".prop_map(|s| Chassis::new(s).unwrap())),
            generation in opt(0u64..1_000_000),
            cert in opt(any::<[u8; 32]>().prop_map(Sha256Digest::from_bytes)),
            trust in opt(any::<[u8; 32]>().prop_map(Sha256Digest::from_bytes)),
            datapath_healthy in opt(any::<bool>()),
        ) -> Status {
            Status {
                phase, reason,
                configuration_applied: flags[0], runtime_healthy: flags[1],
                protection_armed: flags[2], expires, node_uid, chassis, generation,
                certificate_digest: cert, trust_digest: trust, datapath_healthy,
                peers: Vec::new(), mtu: None,
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn status_round_trip(s in arb_status()) {
            let text = serde_json::to_string(&s).unwrap();
            prop_assert!(!text.contains("BEGIN"));
            prop_assert_eq!(serde_json::from_str::<Status>(&text).unwrap(), s);
        }

        #[test]
        fn status_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = serde_json::from_slice::<Status>(&bytes);
        }
    }

    #[test]
    fn every_reason_has_a_message() {
        for r in REASONS {
            assert!(r.message().len() > 20, "{r}");
            assert_ne!(r.to_string(), "Unknown");
        }
    }

    #[test]
    fn field_names_are_the_contract() {
        let mut s = Status::starting();
        s.reason = Some(Reason::InboundMissing);
        s.datapath_healthy = Some(false);
        let v = serde_json::to_value(&s).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "certificateDigest",
                "chassis",
                "configurationApplied",
                "datapathHealthy",
                "expires",
                "generation",
                "message",
                "nodeUID",
                "phase",
                "protectionArmed",
                "reason",
                "runtimeHealthy",
                "trustDigest"
            ]
        );
        assert_eq!(v["reason"], "InboundMissing");
        assert_eq!(v["phase"], "Starting");
        assert!(v["message"].as_str().unwrap().contains("UDP 4500"));
        // datapathHealthy is omitted until measured.
        let v = serde_json::to_value(Status::starting()).unwrap();
        assert!(v.get("datapathHealthy").is_none());
        assert!(v.get("message").is_none());
    }

    #[test]
    fn unknown_reason_decodes() {
        let mut v = serde_json::to_value(Status::starting()).unwrap();
        v["reason"] = "SomethingNew".into();
        let s: Status = serde_json::from_value(v).unwrap();
        assert_eq!(s.reason, Some(Reason::Unknown));
        assert_eq!(Reason::CsrDenied.to_string(), "CsrDenied");
    }

    #[test]
    fn cannot_carry_pem() {
        let mut v = serde_json::to_value(Status::starting()).unwrap();
        v["chassis"] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----".into();
        assert!(serde_json::from_value::<Status>(v.clone()).is_err());
        v["chassis"] = serde_json::Value::Null;
        v["certificateDigest"] = "-----BEGIN PRIVATE KEY-----".into();
        assert!(serde_json::from_value::<Status>(v).is_err());
    }

    #[test]
    fn readiness_rule() {
        let trust = Sha256Digest::of(b"trust");
        let now = Timestamp::from_unix(1_000).unwrap();
        let mut s = Status::starting();
        s.phase = Phase::Prepare;
        s.certificate_digest = Some(Sha256Digest::of(b"cert"));
        s.expires = Some(Timestamp::from_unix(2_000).unwrap());
        assert!(s.is_ready(now, &trust));
        s.phase = Phase::Active;
        assert!(!s.is_ready(now, &trust));
        s.runtime_healthy = true;
        s.protection_armed = true;
        s.configuration_applied = true;
        s.trust_digest = Some(Sha256Digest::of(b"old trust"));
        assert!(!s.is_ready(now, &trust));
        s.trust_digest = Some(trust);
        assert!(s.is_ready(now, &trust));
        assert!(!s.is_ready(Timestamp::from_unix(2_000).unwrap(), &trust));
    }
}
