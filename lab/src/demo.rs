//! `kube-ovn-ipsec-lab demo`: what the lab can show before the full lifecycle
//! lands — the real OVN and OVS databases driven by this project's OVSDB
//! client.
//!
//! It starts an Open_vSwitch database, OVN Northbound and Southbound databases
//! and `ovn-northd` (all real, in a temporary directory), then:
//! 1. lets "another writer" (`ovs-vsctl`) set an unrelated `other_config` key;
//! 2. activates an identity generation: `private_key`, `certificate` and
//!    `ca_cert` in one guarded transaction, and shows the unrelated key
//!    survived;
//! 3. flips `NB_Global.ipsec` to `true` and waits (through a monitor) until
//!    `ovn-northd` has carried it into `SB_Global.ipsec`;
//! 4. flips it back to `false` the same way.
//!
//! Every step prints what happened and how long it took.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use kube_ovn_ipsec_api::names::ovs as ovs_keys;
use ovsdb::{Client, MapChanges, MapColumn, MapWriter};
use testbed::ovs::{OvnCentral, OvsdbServer};

/// How long `ovn-northd` may take to mirror the NB switch into SB before the
/// demo calls it a failure (measured: ~12 ms; the margin is for loaded CI).
const SB_MIRROR_TIMEOUT: Duration = Duration::from_secs(20);

/// Errors of the demo, each naming the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A daemon could not be started (the message names the program).
    #[error("starting {what}: {source}")]
    Start {
        /// Which component.
        what: &'static str,
        /// Why.
        source: testbed::ovs::Error,
    },
    /// An OVSDB operation failed.
    #[error("{step}: {source}")]
    Ovsdb {
        /// Which step.
        step: &'static str,
        /// Why.
        source: ovsdb::Error,
    },
    /// A post-condition of a step did not hold.
    #[error("{step}: {detail}")]
    Check {
        /// Which step.
        step: &'static str,
        /// What was wrong.
        detail: String,
    },
}

fn ovsdb_err(step: &'static str) -> impl FnOnce(ovsdb::Error) -> DemoError {
    move |source| DemoError::Ovsdb { step, source }
}

/// Runs the demo in `dir` (which must exist and be writable), printing each
/// step to stdout.
pub async fn run(dir: &Path) -> Result<(), DemoError> {
    println!(
        "lab demo: real ovsdb-server (Open_vSwitch, OVN_Northbound, OVN_Southbound) and ovn-northd in {}",
        dir.display()
    );
    let started = Instant::now();
    let vswitch = OvsdbServer::start_vswitch(dir).map_err(|source| DemoError::Start {
        what: "Open_vSwitch ovsdb-server",
        source,
    })?;
    let central = OvnCentral::start(dir).map_err(|source| DemoError::Start {
        what: "OVN NB/SB and ovn-northd",
        source,
    })?;
    println!("  started in {:.0?}", started.elapsed());

    // Step 1: another writer owns a key the agent must never touch.
    vswitch
        .vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            "other_config:owned-by-someone-else=keep-me",
        ])
        .map_err(|source| DemoError::Start {
            what: "ovs-vsctl",
            source,
        })?;
    println!("  ovs-vsctl set other_config:owned-by-someone-else=keep-me");

    // Step 2: activate generation 1 in one guarded transaction.
    let ovs = Client::connect_str(&vswitch.address())
        .await
        .map_err(ovsdb_err("connect Open_vSwitch"))?;
    let generation = dir.join("keys/generation-1");
    let changes: MapChanges = BTreeMap::from([
        (
            ovs_keys::OTHER_CONFIG_PRIVATE_KEY.to_string(),
            Some(path(&generation, "key.pem")),
        ),
        (
            ovs_keys::OTHER_CONFIG_CERTIFICATE.to_string(),
            Some(path(&generation, "cert.pem")),
        ),
        (
            ovs_keys::OTHER_CONFIG_CA_CERT.to_string(),
            Some(path(&generation, "ca.pem")),
        ),
    ]);
    let t = Instant::now();
    let written = MapWriter::new(ovs.clone())
        .update_map(&MapColumn::ovs_other_config(), &changes, 5)
        .await
        .map_err(ovsdb_err("activate generation 1"))?;
    let took = t.elapsed();
    let after = ovs
        .read_map(&MapColumn::ovs_other_config())
        .await
        .map_err(ovsdb_err("read other_config back"))?;
    if after.entries != written.entries
        || after
            .entries
            .get("owned-by-someone-else")
            .map(String::as_str)
            != Some("keep-me")
    {
        return Err(DemoError::Check {
            step: "activate generation 1",
            detail: format!(
                "other_config after activation has keys {:?}",
                after.entries.keys()
            ),
        });
    }
    println!(
        "  activated generation 1 (private_key, certificate, ca_cert) in one guarded transaction: {took:.2?}; other_config keys now {:?}",
        after.entries.keys().collect::<Vec<_>>()
    );

    // Steps 3 and 4: the global switch, NB → northd → SB, both ways.
    let nb = Client::connect_str(&central.nb.address())
        .await
        .map_err(ovsdb_err("connect OVN_Northbound"))?;
    let sb = Client::connect_str(&central.sb.address())
        .await
        .map_err(ovsdb_err("connect OVN_Southbound"))?;
    for enabled in [true, false] {
        let t = Instant::now();
        nb.set_nb_ipsec(enabled)
            .await
            .map_err(ovsdb_err("set NB_Global.ipsec"))?;
        sb.wait_sb_ipsec(enabled, SB_MIRROR_TIMEOUT)
            .await
            .map_err(ovsdb_err("wait for SB_Global.ipsec"))?;
        let nb_now = nb
            .read_nb_ipsec()
            .await
            .map_err(ovsdb_err("read NB_Global.ipsec"))?;
        let sb_now = sb
            .read_sb_ipsec()
            .await
            .map_err(ovsdb_err("read SB_Global.ipsec"))?;
        if (nb_now, sb_now) != (enabled, enabled) {
            return Err(DemoError::Check {
                step: "NB/SB ipsec flip",
                detail: format!("expected NB={enabled} SB={enabled}, read NB={nb_now} SB={sb_now}"),
            });
        }
        println!(
            "  NB_Global.ipsec={enabled} → SB_Global.ipsec={sb_now} via ovn-northd in {:.2?} (synchronous reads: NB={nb_now}, SB={sb_now})",
            t.elapsed()
        );
    }
    println!(
        "lab demo: done; daemons stopped. The full lifecycle (simulated nodes, agents, controller) arrives with the lab issue."
    );
    Ok(())
}

fn path(dir: &Path, file: &str) -> String {
    dir.join(file).display().to_string()
}
