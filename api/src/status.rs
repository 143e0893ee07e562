//! The agent's `/status` document (SPEC §5) with its phase and reason.
//!
//! The document holds only booleans, validated identifiers, timestamps and
//! SHA-256 digests: it has no field that could carry PEM, a private key or
//! an SA key, and the identifier types reject the characters PEM needs.
//! `message` is not stored: it is derived from `reason` on serialisation, so
//! no free text reaches the endpoint.

use serde::{Deserialize, Serialize};

use crate::datapath::{MtuReport, PeerHealth};
use crate::digest::Sha256Digest;
use crate::ident::{Chassis, Uid};
pub use crate::reason::Reason;
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
