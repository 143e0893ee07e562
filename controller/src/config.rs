//! Command-line flags (each with an environment fallback).

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::policy::Policy;
use crate::signer::CaKeyAlgorithm;

/// Parses `90d`, `12h`, `30m`, `45s` or plain seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'd')) => (&s[..i], 86_400),
        Some((i, 'h')) => (&s[..i], 3_600),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 's')) => (&s[..i], 1),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90d, 12h or 3600"))?;
    n.checked_mul(mult)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// [`parse_duration`], but zero is refused: a period of nothing would relist
/// without pause.
pub fn parse_period(s: &str) -> std::result::Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: the period must be above zero")),
        d => Ok(d),
    }
}

/// How the controller runs.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// The controller's namespace: CA Secret, trust ConfigMap, CertificateRequests.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub namespace: String,
    /// Namespace of the kube-ovn-cni DaemonSet and ServiceAccount.
    #[arg(long, env = "KUBE_OVN_CNI_NAMESPACE", default_value = "kube-system")]
    pub cni_namespace: String,
    /// Name of the kube-ovn-cni DaemonSet.
    #[arg(long, env = "KUBE_OVN_CNI_DAEMONSET", default_value = "kube-ovn-cni")]
    pub cni_daemonset: String,
    /// Name of the kube-ovn-cni ServiceAccount (the only allowed requester).
    #[arg(
        long,
        env = "KUBE_OVN_CNI_SERVICE_ACCOUNT",
        default_value = "kube-ovn-cni"
    )]
    pub cni_service_account: String,
    /// The controller's own ServiceAccount (cert-manager requester check);
    /// the chart's by default.
    #[arg(
        long,
        env = "KUBE_OVN_CONTROLLER_SERVICE_ACCOUNT",
        default_value = "kube-ovn-ipsec-controller"
    )]
    pub controller_service_account: String,
    /// Lifetime of a newly generated built-in CA.
    #[arg(long, env = "OVN_IPSEC_CA_LIFETIME", default_value = "3650d", value_parser = parse_duration)]
    pub ca_lifetime: Duration,
    /// Key algorithm of a newly generated built-in CA.
    #[arg(
        long,
        env = "OVN_IPSEC_CA_KEY_ALGORITHM",
        value_enum,
        default_value = "ecdsa-p256"
    )]
    pub ca_key_algorithm: CaKeyAlgorithm,
    /// Shortest leaf lifetime (`expirationSeconds`) accepted.
    #[arg(long, env = "OVN_IPSEC_MIN_CERT_LIFETIME", default_value = "1h", value_parser = parse_duration)]
    pub min_cert_lifetime: Duration,
    /// Longest leaf lifetime (`expirationSeconds`) accepted.
    #[arg(long, env = "OVN_IPSEC_MAX_CERT_LIFETIME", default_value = "30d", value_parser = parse_duration)]
    pub max_cert_lifetime: Duration,
    /// Forward validated CSRs to cert-manager instead of the built-in CA.
    #[arg(long = "cert-manager-ipsec-cert", env = "CERT_MANAGER_IPSEC_CERT", default_value_t = false,
          action = clap::ArgAction::Set)]
    pub cert_manager: bool,
    /// The dedicated cert-manager ClusterIssuer.
    #[arg(long, env = "CERT_MANAGER_ISSUER_NAME", default_value = "kube-ovn")]
    pub cert_manager_issuer_name: String,
    /// Address of the /metrics endpoint.
    #[arg(long, env = "OVN_IPSEC_METRICS_ADDR", default_value = "0.0.0.0:10665")]
    pub metrics_addr: SocketAddr,
    /// How often the CA Secret and trust bundle are re-read (rotation pick-up).
    #[arg(long, env = "OVN_IPSEC_CA_RELOAD", default_value = "30s", value_parser = parse_duration)]
    pub ca_reload: Duration,
    /// Validate against watch-fed caches of the CNI Pods, Nodes, DaemonSet
    /// and ControllerRevisions (denials are still decided on direct reads);
    /// `false` reads everything with direct GETs per CSR.
    #[arg(long, env = "OVN_IPSEC_LIVE_CACHE", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub live_cache: bool,
    /// Every watch (CSRs and the live-state caches) starts over with a fresh
    /// LIST at least this often, and at once after a watch error. Bounds how
    /// long a CSR can go unreconciled when a watch silently misses events, as
    /// after an API server whose etcd was restored from an older backup.
    #[arg(long, env = "OVN_IPSEC_RESYNC_PERIOD", default_value = "60s", value_parser = parse_period)]
    pub resync_period: Duration,
    /// CSRs reconciled at once (0: unbounded).
    #[arg(long, env = "OVN_IPSEC_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// This replica's name in events.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Whether IPsec is wanted across the cluster: the coordinator drives
    /// the record towards `Enabled` (true) or `Disabled` (false).
    #[arg(long, env = "ENABLE_IPSEC", default_value_t = false, action = clap::ArgAction::Set)]
    pub enable_ipsec: bool,
    /// OVN northbound database (e.g. `tcp:10.0.0.1:6641`). Without it the
    /// coordinator does not run (CSR signing only).
    #[arg(long, env = "OVN_NB_ADDR")]
    pub ovn_nb: Option<String>,
    /// OVN southbound database (e.g. `tcp:10.0.0.1:6642`).
    #[arg(long, env = "OVN_SB_ADDR")]
    pub ovn_sb: Option<String>,
    /// For `ssl:` NB/SB remotes: this client's private key (PEM), as
    /// Kube-OVN mounts it for `ENABLE_SSL` (`/var/run/tls/key`).
    #[arg(long, env = "OVN_SSL_PRIVATE_KEY", default_value = "/var/run/tls/key")]
    pub ovn_ssl_private_key: std::path::PathBuf,
    /// For `ssl:` remotes: this client's certificate (`/var/run/tls/cert`).
    #[arg(long, env = "OVN_SSL_CERTIFICATE", default_value = "/var/run/tls/cert")]
    pub ovn_ssl_certificate: std::path::PathBuf,
    /// For `ssl:` remotes: the CA the databases' certificates chain to
    /// (`/var/run/tls/cacert`).
    #[arg(long, env = "OVN_SSL_CA_CERT", default_value = "/var/run/tls/cacert")]
    pub ovn_ssl_ca_cert: std::path::PathBuf,
    /// How often the coordinator observes and acts.
    #[arg(long, env = "OVN_IPSEC_COORDINATION_PERIOD", default_value = "2s", value_parser = parse_period)]
    pub coordination_period: Duration,
    /// The coordination Lease's duration: a replica takes over once the
    /// leader has not renewed for this long.
    #[arg(long, env = "OVN_IPSEC_LEASE_DURATION", default_value = "15s", value_parser = parse_period)]
    pub lease_duration: Duration,
}

impl Config {
    /// The validation policy these flags describe.
    pub fn policy(&self) -> Result<Policy> {
        if self.min_cert_lifetime > self.max_cert_lifetime {
            return Err(Error::Config(
                "min certificate lifetime exceeds the maximum".into(),
            ));
        }
        if self.min_cert_lifetime < Duration::from_secs(600) {
            return Err(Error::Config(
                "min certificate lifetime below Kubernetes' 600 s".into(),
            ));
        }
        Ok(Policy {
            cni_namespace: self.cni_namespace.clone(),
            service_account: self.cni_service_account.clone(),
            min_lifetime: self.min_cert_lifetime,
            max_lifetime: self.max_cert_lifetime,
            ..Policy::default()
        })
    }

    /// The controller's own `spec.username`.
    pub fn controller_username(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.controller_service_account
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Config;
    use apiserver::chart::{self, PodFields, Rendered};
    use apiserver::kube_ovn::Shape;
    use clap::Args;

    /// The chart's controller container against this command line: every
    /// variable it sets is read by a flag, every flag exists, and together
    /// they parse into a valid policy.
    #[test]
    fn the_charts_controller_container_is_what_the_binary_reads() {
        let cmd = Config::augment_args(clap::Command::new("kube-ovn-ipsec-controller"));
        for shape in [Shape::Ipsec, Shape::Cleanup] {
            let c = Rendered::of(shape)
                .and_then(|r| r.container(chart::CONTAINER_CONTROLLER))
                .unwrap();
            let pod = PodFields {
                node_name: "control-plane",
                pod_name: "kube-ovn-ipsec-controller-0",
                namespace: "kube-system",
                pod_uid: "",
                template_hash: "",
            };
            let p = chart::Process::of(&c, &pod).unwrap();
            assert_eq!(p.program, "/kube-ovn/kube-ovn-ipsec-controller");
            let flag_of = |env: &str| {
                cmd.get_arguments()
                    .find(|a| a.get_env().is_some_and(|e| e == env))
                    .and_then(|a| a.get_long())
                    .map(str::to_owned)
            };
            let line = p.as_arguments(flag_of).unwrap();
            let matches = cmd
                .clone()
                .no_binary_name(true)
                .try_get_matches_from(&line)
                .unwrap_or_else(|e| panic!("{line:?}: {e}"));
            let config = <Config as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
            config.policy().unwrap();
            assert_eq!(
                config.controller_username(),
                format!(
                    "system:serviceaccount:kube-system:{}",
                    apiserver::kube_ovn::CONTROLLER_SA
                )
            );
        }
    }
}
