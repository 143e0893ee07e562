//! strongSwan's text output, parsed: `ipsec statusall` (IKE_SAs, CHILD_SAs)
//! and `ipsec listcerts` / `listcacerts` (loaded certificates).
//!
//! The agent probes its IKE daemon with these and the testbed waits on them;
//! one parser keeps the two from disagreeing on what "established" means.
//! Pure text in, public data out: strongSwan never prints key material in
//! these listings, and nothing here would keep it.

/// An IKE_SA line of `ipsec statusall`: `<conn>[<n>]: <STATE> ...`, with
/// its SPIs from the `<conn>[<n>]: IKEv2 SPIs: ...` line when shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkeSa {
    /// Connection name, e.g. `ovn-chassb-0-out-1`.
    pub conn: String,
    /// charon's unique id (the `[n]`).
    pub unique_id: u32,
    /// State word, e.g. `ESTABLISHED`, `CONNECTING`.
    pub state: String,
    /// Initiator SPI (hex), when shown.
    pub spi_i: Option<String>,
    /// Responder SPI (hex), when shown.
    pub spi_r: Option<String>,
}

/// A CHILD_SA (or routed connection) line of `ipsec statusall`:
/// `<conn>{<n>}:  <STATE>, ..., reqid <r>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSa {
    /// Connection name.
    pub conn: String,
    /// State word (`INSTALLED`, `ROUTED`, ...).
    pub state: String,
    /// The reqid shown, if any.
    pub reqid: Option<u32>,
}

/// What `ipsec statusall` (or `status`) says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// IKE_SAs, in the order shown, one per (connection, unique id).
    pub ike_sas: Vec<IkeSa>,
    /// CHILD_SAs and routed (trap) connections.
    pub child_sas: Vec<ChildSa>,
}

/// The first word of `rest` when it is a state word (`ESTABLISHED`, but
/// also `CONNECTING,` before an address).
fn state_word(rest: &str) -> Option<&str> {
    let word = rest
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_end_matches(',');
    (!word.is_empty() && word.chars().all(|c| c.is_ascii_uppercase() || c == '_')).then_some(word)
}

/// Parses `ipsec statusall` / `ipsec status`. Lines that are not IKE_SA,
/// SPI or CHILD_SA lines are skipped.
pub fn parse_status(text: &str) -> Status {
    let mut out = Status::default();
    for line in text.lines() {
        let line = line.trim();
        let Some((head, rest)) = line.split_once(": ") else {
            continue;
        };
        let rest = rest.trim();
        if let Some((conn, id)) = head.strip_suffix(']').and_then(|h| h.rsplit_once('[')) {
            let Ok(unique_id) = id.parse::<u32>() else {
                continue;
            };
            let existing = out
                .ike_sas
                .iter_mut()
                .find(|s| s.unique_id == unique_id && s.conn == conn);
            if let Some(spis) = rest
                .strip_prefix("IKEv2 SPIs: ")
                .or_else(|| rest.strip_prefix("IKEv1 SPIs: "))
            {
                let mut words = spis.split([' ', ',']).filter(|w| !w.is_empty());
                let spi_i = words
                    .next()
                    .map(|w| w.trim_end_matches('*').trim_end_matches("_i").to_string());
                let spi_r = words
                    .next()
                    .map(|w| w.trim_end_matches('*').trim_end_matches("_r").to_string());
                if let Some(sa) = existing {
                    sa.spi_i = spi_i;
                    sa.spi_r = spi_r;
                }
                continue;
            }
            // Later lines of the same SA ("IKE proposal: ...") are not states.
            if existing.is_some() {
                continue;
            }
            if let Some(state) = state_word(rest) {
                out.ike_sas.push(IkeSa {
                    conn: conn.to_string(),
                    unique_id,
                    state: state.to_string(),
                    spi_i: None,
                    spi_r: None,
                });
            }
        } else if let Some((conn, _)) = head.strip_suffix('}').and_then(|h| h.rsplit_once('{')) {
            let Some(state) = state_word(rest) else {
                continue;
            };
            let reqid = rest
                .split(", ")
                .find_map(|part| part.trim().strip_prefix("reqid "))
                .and_then(|r| r.trim().parse().ok());
            out.child_sas.push(ChildSa {
                conn: conn.to_string(),
                state: state.to_string(),
                reqid,
            });
        }
    }
    out
}

/// A certificate strongSwan has loaded (`ipsec listcerts` /
/// `listcacerts`): public data only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedCert {
    /// `subject:` as strongSwan prints it (`"CN=chass-a, O=kube-ovn"`).
    pub subject: String,
    /// `serial:` as colon-separated lowercase hex.
    pub serial: String,
    /// Whether strongSwan has the matching private key (`pubkey: ... , has
    /// private key`).
    pub has_private_key: bool,
}

/// Parses `ipsec listcerts` / `ipsec listcacerts` output.
pub fn parse_listcerts(text: &str) -> Vec<LoadedCert> {
    let mut out: Vec<LoadedCert> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix("subject:") {
            out.push(LoadedCert {
                subject: s.trim().trim_matches('"').to_string(),
                serial: String::new(),
                has_private_key: false,
            });
        } else if let Some(last) = out.last_mut() {
            if let Some(s) = line.strip_prefix("serial:") {
                last.serial = s.trim().to_ascii_lowercase();
            } else if line.starts_with("pubkey:") && line.contains("has private key") {
                last.has_private_key = true;
            }
        }
    }
    out
}

/// Which of a tunnel's connections ovs-monitor-ipsec named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnDirection {
    /// `<tunnel>-in-<v>`.
    In,
    /// `<tunnel>-out-<v>`.
    Out,
    /// `<tunnel>-<v>` (gre: one connection both ways).
    Both,
}

/// A connection name as ovs-monitor-ipsec writes it, split: the tunnel
/// (the OVS interface), the direction and the version the monitor counts
/// up on each reload. The one parser of these names: the agent's initiator
/// and the lab's negotiation step both read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorConn<'a> {
    /// The OVS interface, e.g. `ovn-chassb-0`.
    pub tunnel: &'a str,
    /// Which connection of the tunnel.
    pub direction: ConnDirection,
    /// The version suffix.
    pub version: u64,
}

impl<'a> MonitorConn<'a> {
    /// Parses `conn`; `None` when it is not one of the monitor's names.
    pub fn parse(conn: &'a str) -> Option<MonitorConn<'a>> {
        let (rest, version) = conn.rsplit_once('-')?;
        if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let version = version.parse().ok()?;
        let (tunnel, direction) = if let Some(t) = rest.strip_suffix("-out") {
            (t, ConnDirection::Out)
        } else if let Some(t) = rest.strip_suffix("-in") {
            (t, ConnDirection::In)
        } else {
            (rest, ConnDirection::Both)
        };
        (!tunnel.is_empty()).then_some(MonitorConn {
            tunnel,
            direction,
            version,
        })
    }
}

#[cfg(test)]
mod tests;
