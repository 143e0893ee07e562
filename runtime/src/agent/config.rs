//! Flags of `kube-ovn-ipsec run`. Every flag has an environment fallback so
//! the chart can feed the downward API (`NODE_NAME`, `POD_NAME`,
//! `POD_NAMESPACE`, `POD_UID`) and `OVN_IPSEC_KEY_DIR` without a wrapper
//! script.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use actors::pki::KeyType;
use kube_ovn_ipsec_api::names::{defaults, k8s};
use kube_ovn_ipsec_api::rekeying::{Rekeying, RekeyingError};

/// Key algorithm of the node identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyAlgorithm {
    /// RSA-2048: the default.
    Rsa2048,
    /// ECDSA P-256. Needs the monitor patch v4 or later: an older
    /// ovs-monitor-ipsec loads its key as `: RSA`, which refuses it.
    EcdsaP256,
}

impl From<KeyAlgorithm> for KeyType {
    fn from(a: KeyAlgorithm) -> Self {
        match a {
            KeyAlgorithm::Rsa2048 => KeyType::Rsa2048,
            KeyAlgorithm::EcdsaP256 => KeyType::EcdsaP256,
        }
    }
}

/// The IKE daemon the monitor drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IkeDaemonKind {
    /// strongSwan (`ipsec start --nofork`): the default and the only one
    /// supported so far.
    Strongswan,
    /// libreswan: accepted by the flag, refused at start-up as not yet
    /// supported.
    Libreswan,
}

/// Whether the agent follows the cluster's coordination record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CoordinationMode {
    /// Follow ConfigMap `ovn-ipsec-coordination` (SPEC §7): arm only when
    /// the record asks this node to, publish signed receipts. The default.
    Cluster,
    /// Arm at start and publish nothing: a single node driven by hand or
    /// by a test, where no controller coordinates. Never what a cluster
    /// deployment wants: nothing then stops `NB_Global.ipsec` from being
    /// set before every node is armed.
    Off,
}

pub use crate::node::NodeArgs;

/// `kube-ovn-ipsec run` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Who and where this node is.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Where `/status`, `/readyz`, `/healthz` and `/metrics` are served.
    #[arg(long, env = "OVN_IPSEC_STATUS_ADDR", default_value = "0.0.0.0:10667")]
    pub status_addr: SocketAddr,
    /// Requested certificate lifetime (`expirationSeconds`), in seconds.
    #[arg(long, env = "OVN_IPSEC_CERT_LIFETIME", default_value_t = defaults::CERTIFICATE_LIFETIME_SECS)]
    pub certificate_lifetime: u32,
    /// Key algorithm.
    #[arg(
        long,
        env = "OVN_IPSEC_KEY_ALGORITHM",
        value_enum,
        default_value = "rsa2048"
    )]
    pub key_algorithm: KeyAlgorithm,
    /// How long one wait for the CSR may take before it counts as timed out,
    /// in seconds.
    #[arg(long, env = "OVN_IPSEC_REQUEST_TIMEOUT", default_value_t = 300)]
    pub request_timeout: u64,
    /// Window, in seconds, over which nodes renew onto a CA the controller
    /// announces as its new signer (a CA rotation): each node's point in it
    /// is derived from its Node UID, so the CSRs spread out.
    #[arg(long, env = "OVN_IPSEC_ROTATION_SPREAD", default_value_t = defaults::ROTATION_SPREAD_SECS)]
    pub rotation_spread: u64,
    /// Name of the trust ConfigMap.
    #[arg(long, default_value = k8s::TRUST_CONFIGMAP)]
    pub trust_configmap: String,
    /// Follow the cluster's coordination (`cluster`) or arm at start
    /// (`off`).
    #[arg(long, env = "OVN_IPSEC_COORDINATION", value_enum, default_value_t = CoordinationMode::Cluster)]
    pub coordination: CoordinationMode,
    /// Republish an owed coordination receipt this often (seconds); the
    /// controller accepts receipts observed within the last 120 s.
    #[arg(long, default_value_t = 45, value_parser = clap::value_parser!(u64).range(5..=100))]
    pub receipt_refresh: u64,
    /// skb mark bits an IPsec lease never uses (hex `0x…` or decimal):
    /// kube-proxy's `0xc000` by default and always (the ovn-controller
    /// patch refuses a lease mark that uses them); add the bits of anything
    /// else on the node that marks packets.
    #[arg(
        long,
        env = "OVN_IPSEC_RESERVED_MARK_BITS",
        default_value = "0xc000",
        value_parser = parse_mark_bits
    )]
    pub reserved_mark_bits: u32,
    /// How long the chassis (`external_ids:system-id`) may be missing from
    /// OVSDB before start-up gives up, in seconds.
    #[arg(long, default_value_t = 120)]
    pub chassis_timeout: u64,

    // --- Capability gate (SPEC §4) ---
    /// The image's ovn-controller program (probed with `--version`).
    #[arg(
        long,
        env = "OVN_IPSEC_OVN_CONTROLLER",
        default_value = "ovn-controller"
    )]
    pub ovn_controller: std::ffi::OsString,
    /// `ovs-appctl` (capability probe, monitor `tunnels/show`): OVS's own,
    /// not the image's `ovs-appctl` link to this binary (`appctl`), which
    /// would only pass these targeted calls on to it.
    #[arg(long, env = "OVN_IPSEC_OVS_APPCTL", default_value = crate::appctl::REAL_OVS_APPCTL)]
    pub ovs_appctl: std::ffi::OsString,
    /// The running ovn-controller's unixctl socket. Default: discovered
    /// from `--ovn-controller-pidfile` as `<its dir>/ovn-controller.<pid>.ctl`.
    #[arg(long, env = "OVN_IPSEC_OVN_CONTROLLER_CTL")]
    pub ovn_controller_ctl: Option<std::ffi::OsString>,
    /// The running ovn-controller's pidfile (kube-ovn-cni Pod layout).
    #[arg(long, default_value = "/var/run/ovn/ovn-controller.pid")]
    pub ovn_controller_pidfile: PathBuf,

    // --- IKE daemon (SPEC §3) ---
    /// The IKE daemon.
    #[arg(
        long,
        env = "OVN_IPSEC_IKE_DAEMON",
        value_enum,
        default_value = "strongswan"
    )]
    pub ike_daemon: IkeDaemonKind,
    /// strongSwan's `ipsec` script.
    #[arg(long, env = "OVN_IPSEC_IPSEC", default_value = "ipsec")]
    pub ipsec: std::ffi::OsString,
    /// strongSwan's CA directory: the agent installs the trust bundle there,
    /// one file per CA (strongSwan reads only a file's first certificate).
    #[arg(long, default_value = "/etc/ipsec.d/cacerts")]
    pub ipsec_cacerts_dir: PathBuf,
    /// File receiving the IKE daemon's output (default: inherited).
    #[arg(long)]
    pub ike_log_file: Option<PathBuf>,

    // --- ovs-monitor-ipsec ---
    /// The monitor script (its patch marker decides the CA workaround).
    #[arg(long, env = "OVN_IPSEC_MONITOR_SCRIPT", default_value = crate::monitor_patch::DEFAULT_MONITOR_SCRIPT)]
    pub monitor_script: PathBuf,
    /// Interpreter for the script (default: execute the script itself).
    #[arg(long)]
    pub monitor_python: Option<std::ffi::OsString>,
    /// The monitor's run directory (pidfile, control socket).
    #[arg(long, default_value = "/var/run/openvswitch")]
    pub monitor_rundir: PathBuf,
    /// The database the monitor watches (default: `--ovsdb`).
    #[arg(long)]
    pub monitor_database: Option<String>,
    /// The monitor's `--log-file`.
    #[arg(long)]
    pub monitor_log_file: Option<PathBuf>,
    /// File receiving the monitor's output (default: inherited).
    #[arg(long)]
    pub monitor_output_file: Option<PathBuf>,

    // --- Rekeying (patched monitor v4 and later) ---
    /// IKE_SA lifetime in seconds. IKE_SAs are rekeyed before it ends,
    /// never reauthenticated: a rekey keeps the CHILD_SAs, a
    /// reauthentication rebuilds them.
    #[arg(long, env = "OVN_IPSEC_IKE_LIFETIME", default_value_t = Rekeying::DEFAULT.ike_lifetime().as_secs())]
    pub ike_lifetime: u64,
    /// CHILD_SA lifetime in seconds.
    #[arg(long, env = "OVN_IPSEC_CHILD_LIFETIME", default_value_t = Rekeying::DEFAULT.child_lifetime().as_secs())]
    pub child_lifetime: u64,
    /// Seconds before a lifetime ends at which rekeying starts.
    #[arg(long, env = "OVN_IPSEC_REKEY_MARGIN", default_value_t = 540)]
    pub rekey_margin: u64,
    /// Random extra margin, in percent of `--rekey-margin`, so that the two
    /// ends of a pair seldom rekey the same SA at once.
    #[arg(long, env = "OVN_IPSEC_REKEY_FUZZ", default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub rekey_fuzz: u32,

    // --- Supervision of the runtime ---
    /// Seconds the agent keeps serving `/status` (phase
    /// `CapabilityMissing`) and a failing `/readyz` after the capability
    /// gate failed, before it exits with the distinct code; SIGTERM ends
    /// the wait.
    #[arg(long, default_value_t = 30)]
    pub capability_exit_delay: u64,
    /// Milliseconds between guard read-backs. `/readyz` answers only from
    /// a read-back at most 1 s old, so keep this well below 1000.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=900))]
    pub guard_readback_ms: u64,
    /// Seconds between SA observation passes (a full XFRM dump; the record
    /// in the key directory is rewritten only when what it shows changes).
    /// The record's tunnels are what cleanup may drain after a crash, so a
    /// tunnel's SAs are attributable once one pass has seen the tunnel:
    /// short, while a dump stays milliseconds even with thousands of
    /// policies.
    #[arg(long, default_value_t = 5)]
    pub sa_observe_period: u64,
    /// Seconds between health probes of the IKE daemon and the monitor.
    #[arg(long, default_value_t = 5)]
    pub probe_period: u64,
    /// Seconds one control command of the IKE daemon or the monitor
    /// (`ipsec statusall`, `ovs-appctl tunnels/show`, a CA reload) may
    /// take; a health probe that runs over it counts as failed. Raise it
    /// on nodes so loaded (or emulated) that a live daemon answers late,
    /// rather than have the agent restart it.
    #[arg(long, default_value_t = crate::ike::DEFAULT_COMMAND_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=300))]
    pub command_timeout: u64,
    /// Failed health probes in a row (once the process has passed one)
    /// after which the agent restarts the IKE daemon or the monitor.
    #[arg(long, default_value_t = actors::process_watch::ProcessConfig::default().probe_failures, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub probe_failures: u32,
    /// Seconds the IKE daemon and the monitor may take to pass their first
    /// probe; it doubles after each start in a row that did not make it,
    /// up to eight times this (a slow node gets more time rather than a
    /// restart storm), and is never less than `--stop-grace`.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(5..=600))]
    pub process_start_timeout: u64,
    /// Seconds between SIGTERM and SIGKILL when stopping a process group.
    #[arg(long, default_value_t = 10)]
    pub stop_grace: u64,

    // --- Data-path health (SPEC §10) ---
    /// Milliseconds between data-path samples (SA counters, xfrm_stat;
    /// MTUs every 30th sample).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(250..=60_000))]
    pub datapath_period_ms: u64,
    /// Milliseconds between data-path samples while a tunnel's enable
    /// window is open (what the window's resolution is).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub datapath_fast_period_ms: u64,
    /// Seconds inbound may stay flat under outbound traffic before a peer
    /// is `InboundMissing`, and a peer may stay without SAs before it
    /// counts against `datapathHealthy`.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub datapath_window: u64,
    /// The tunnel (Pod) MTU for the MTU check, as kube-ovn-cni's `--mtu`
    /// sets it; without it, the MTU of `--tunnel-mtu-interface`.
    #[arg(long, env = "OVN_IPSEC_TUNNEL_MTU", value_parser = clap::value_parser!(u32).range(576..=65_535))]
    pub tunnel_mtu: Option<u32>,
    /// The interface whose MTU is the tunnel (Pod) MTU: Kube-OVN's node
    /// port `ovn0` carries the MTU kube-ovn-cni gives Pods.
    #[arg(long, default_value = "ovn0")]
    pub tunnel_mtu_interface: String,
    /// The OVS-style control socket of the agent (`ovs-appctl -t <path>
    /// ipsec/show`, `ipsec/refresh`).
    #[arg(
        long,
        env = "OVN_IPSEC_CTL",
        default_value = "/var/run/openvswitch/kube-ovn-ipsec.ctl"
    )]
    pub ctl_socket: PathBuf,

    // --- Lab and tests: a simulated node's namespaces ---
    /// Run every program (probes, IKE daemon, monitor) in the network and
    /// mount namespaces of this process (`nsenter -t <pid> -m -n`). Lab and
    /// tests.
    #[arg(long)]
    pub node_netns_pid: Option<u32>,
}

/// Parses a 32-bit mark mask written as `0x…` hex or decimal. It must keep
/// kube-proxy's bits ([`defaults::RESERVED_MARK_BITS`]): the patched ovn-controller
/// builds no tunnel with a lease mark that uses them, so a mask without
/// them could allocate a lease no tunnel would ever carry.
pub fn parse_mark_bits(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse(),
    };
    let bits = parsed.map_err(|_| format!("{s:?} is not a 32-bit mark mask like 0xc000"))?;
    xfrm::alloc::check_reserved_bits(bits)?;
    if bits & defaults::RESERVED_MARK_BITS != defaults::RESERVED_MARK_BITS {
        return Err(format!(
            "{s:?} must include kube-proxy's mark bits {:#x}: the \
             ovn-controller patch builds no tunnel with a lease mark that uses them",
            defaults::RESERVED_MARK_BITS
        ));
    }
    Ok(bits)
}

impl RunArgs {
    /// [`RunArgs::request_timeout`] as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout)
    }

    /// The rekeying flags, checked: a margin that (with its fuzz) reaches
    /// a lifetime is refused with the numbers.
    pub fn rekeying(&self) -> Result<Rekeying, RekeyingError> {
        Rekeying::new(
            Duration::from_secs(self.ike_lifetime),
            Duration::from_secs(self.child_lifetime),
            Duration::from_secs(self.rekey_margin),
            self.rekey_fuzz,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{RunArgs, parse_mark_bits};
    use crate::cleanup::CleanupArgs;
    use apiserver::chart::{self, PodFields, Rendered};
    use apiserver::kube_ovn::Shape;
    use clap::Args;

    /// The chart's `container` (in `shape`) against the command line of
    /// `kube-ovn-ipsec <mode>`: every variable it sets is read by a flag,
    /// every flag exists, and together they parse.
    fn chart_container_parses(shape: Shape, container: &str, mode: &str, cmd: clap::Command) {
        let c = Rendered::of(shape)
            .and_then(|r| r.container(container))
            .unwrap();
        let pod = PodFields {
            node_name: "node-0",
            pod_name: "kube-ovn-cni-x",
            namespace: "kube-system",
            pod_uid: "0c3a1a6e-0000-4000-8000-000000000000",
            template_hash: "6d8f9c7b5",
        };
        let p = chart::Process::of(&c, &pod).unwrap();
        assert_eq!(p.program, "/kube-ovn/kube-ovn-ipsec");
        assert_eq!(p.args.first().map(String::as_str), Some(mode));
        let flag_of = |env: &str| {
            cmd.get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == env))
                .and_then(|a| a.get_long())
                .map(str::to_owned)
        };
        let line = p
            .as_arguments(flag_of)
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        cmd.clone()
            .no_binary_name(true)
            .try_get_matches_from(&line[1..])
            .unwrap_or_else(|e| panic!("{mode} {line:?}: {e}"));
    }

    #[test]
    fn the_charts_agent_and_cleanup_containers_are_what_the_binary_reads() {
        let bare = || clap::Command::new("kube-ovn-ipsec");
        chart_container_parses(
            Shape::Ipsec,
            chart::CONTAINER_AGENT,
            "run",
            RunArgs::augment_args(bare()),
        );
        chart_container_parses(
            Shape::Cleanup,
            chart::CONTAINER_CLEANUP,
            "cleanup",
            CleanupArgs::augment_args(bare()),
        );
    }

    #[test]
    fn mark_bits_parse_hex_and_decimal_and_refuse_the_rest() {
        assert_eq!(parse_mark_bits("0xc000"), Ok(0xc000));
        assert_eq!(parse_mark_bits("0XC0FF"), Ok(0xc0ff));
        assert_eq!(parse_mark_bits("49152"), Ok(0xc000));
        for bad in ["", "0x", "-1", "0x1ffffffff", "c000", "0xzz"] {
            let e = parse_mark_bits(bad).unwrap_err();
            assert!(e.contains("mark mask"), "{bad}: {e}");
        }
        // A mask that leaves no bit for the lease is refused at start,
        // not retried by the allocator for ever.
        for none_left in ["0xffffffff", "4294967295"] {
            let e = parse_mark_bits(none_left).unwrap_err();
            assert!(e.contains("leave no bit"), "{none_left}: {e}");
        }
        assert_eq!(parse_mark_bits("0xfffffffe"), Ok(0xffff_fffe));
        // kube-proxy's bits cannot be given back: the ovn-controller patch
        // refuses a lease mark that uses them.
        for without in ["0xff", "0x4000", "0x8000", "0", "0x10000"] {
            let e = parse_mark_bits(without).unwrap_err();
            assert!(
                e.contains("must include kube-proxy's mark bits 0xc000"),
                "{without}: {e}"
            );
        }
    }
}
