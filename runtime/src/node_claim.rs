//! One owner per node (SPEC §2): the claim an agent or a cleanup takes on
//! the node itself, whatever key directory it was given.
//!
//! The key directory's `flock` keeps two processes off one directory, but
//! two agents given different key directories (a changed
//! `OVN_IPSEC_KEY_DIR` while the old container still runs) share the node's
//! OVSDB row and kernel, and would overwrite each other's lease and leave
//! guards no one owns. So before it writes anything, a process also claims
//! the node where that state is shared:
//!
//! - **In the kernel**: an abstract unix socket bound in the node's network
//!   namespace — the namespace its XFRM state lives in — named after the
//!   node's `Open_vSwitch` row UUID. Abstract names belong to the network
//!   namespace, not to a filesystem, so a holder in another mount namespace
//!   (another container, another key directory) is seen all the same; and
//!   the kernel releases the name when the holder's last descriptor closes,
//!   so a dead agent's claim is gone with it — no stale file to judge, no
//!   PID to guess about. The descriptor is close-on-exec: the IKE daemon
//!   and the monitor the agent starts do not inherit the claim.
//! - **Keyed by the OVSDB row**: several simulated nodes of the tests and
//!   the lab share one network namespace but never one row.
//!
//! The holder answers each connection with one line saying who it is
//! (role, PID, key directory), which the refused process puts in its
//! reason; if the holder does not answer within a second, the socket's
//! peer credentials still name its PID.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The prefix of the abstract socket name; the row UUID follows it.
pub const NAME_PREFIX: &str = "kube-ovn-ipsec/node-owner/";

/// How long a refused process waits for the holder to say who it is.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest self-description read from a holder.
const MAX_ANSWER: u64 = 512;

/// Why the node could not be claimed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// Another process holds the node.
    #[error(
        "this node (OVSDB row {row}) is already owned by {holder}: one agent or cleanup per \
         node, whatever its key directory"
    )]
    Held {
        /// The node's `Open_vSwitch` row UUID.
        row: String,
        /// Who holds it, as it described itself.
        holder: String,
    },
    /// The claim socket could not be created or probed.
    #[error("claiming the node (OVSDB row {row}): {what}: {source}")]
    Io {
        /// The node's `Open_vSwitch` row UUID.
        row: String,
        /// The step that failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Who a claimant is, as a refused process is told.
#[derive(Debug, Clone)]
pub struct Claimant {
    /// `agent` or `cleanup`.
    pub role: &'static str,
    /// Its key directory.
    pub key_dir: std::path::PathBuf,
}

impl Claimant {
    fn describe(&self) -> String {
        format!(
            "the {} (PID {}) with key directory {}",
            self.role,
            std::process::id(),
            self.key_dir.display()
        )
    }
}

/// A held claim: released when dropped (or when the process exits).
#[derive(Debug)]
pub struct NodeClaim {
    listener: Arc<UnixListener>,
    answerer: Option<std::thread::JoinHandle<()>>,
    row: String,
}

impl NodeClaim {
    /// The `Open_vSwitch` row this claim is for.
    pub fn row(&self) -> &str {
        &self.row
    }
}

impl Drop for NodeClaim {
    fn drop(&mut self) {
        // shutdown(2) wakes the answerer's accept (EINVAL), so the listener
        // is closed — and the name released — before drop returns: an
        // in-process successor can claim at once.
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        if let Some(t) = self.answerer.take() {
            let _ = t.join();
        }
    }
}

/// Claims the node whose `Open_vSwitch` row is `row`, in network namespace
/// `netns` (`/run/netns/<name>`; `None`: this process's own). Blocking: call
/// it off the executor.
pub fn claim(netns: Option<&str>, row: &str, me: &Claimant) -> Result<NodeClaim, ClaimError> {
    let name = format!("{NAME_PREFIX}{row}");
    let row_owned = row.to_owned();
    let bound = match netns {
        None => bind_or_describe(&name, &row_owned),
        Some(ns) => {
            let (name, row2) = (name.clone(), row_owned.clone());
            xfrm::netns::run_in(ns, move || Ok(bind_or_describe(&name, &row2))).map_err(|e| {
                ClaimError::Io {
                    row: row_owned.clone(),
                    what: "entering the node's network namespace",
                    source: std::io::Error::other(e.to_string()),
                }
            })?
        }
    }?;
    let listener = Arc::new(bound);
    let serving = Arc::clone(&listener);
    let description = me.describe();
    let answerer = std::thread::Builder::new()
        .name("node-claim".into())
        .spawn(move || answer(&serving, &description))
        .map_err(|source| ClaimError::Io {
            row: row_owned.clone(),
            what: "starting the claim's answerer",
            source,
        })?;
    Ok(NodeClaim {
        listener,
        answerer: Some(answerer),
        row: row_owned,
    })
}

/// [`claim`] off the async executor (binding may enter a namespace on a
/// helper thread): the one way the agent and the cleanup take the claim.
pub async fn claim_blocking(
    netns: Option<String>,
    row: String,
    me: Claimant,
) -> Result<NodeClaim, ClaimError> {
    let row_for_error = row.clone();
    tokio::task::spawn_blocking(move || claim(netns.as_deref(), &row, &me))
        .await
        .map_err(|e| ClaimError::Io {
            row: row_for_error,
            what: "claiming the node off the executor",
            source: std::io::Error::other(e.to_string()),
        })?
}

/// Binds the name, or says who holds it. A holder that exits between the
/// failed bind and the probe leaves the name free: bind again.
fn bind_or_describe(name: &str, row: &str) -> Result<UnixListener, ClaimError> {
    let io = |what| {
        let row = row.to_owned();
        move |source| ClaimError::Io { row, what, source }
    };
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(io("naming the claim"))?;
    for _ in 0..3 {
        match UnixListener::bind_addr(&addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => return Err(io("binding the claim")(e)),
        }
        match UnixStream::connect_addr(&addr) {
            Ok(stream) => {
                return Err(ClaimError::Held {
                    row: row.to_owned(),
                    holder: describe_holder(stream),
                });
            }
            // Gone between the two calls: the claim is free again.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
            Err(e) => return Err(io("asking the claim's holder")(e)),
        }
    }
    Err(ClaimError::Held {
        row: row.to_owned(),
        holder: "a process that keeps claiming and releasing it".into(),
    })
}

/// The holder's own line, else its PID from the peer credentials.
fn describe_holder(mut stream: UnixStream) -> String {
    let pid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map(|c| c.pid())
        .ok()
        .filter(|p| *p > 0);
    let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
    let mut line = String::new();
    let answered = (&mut stream)
        .take(MAX_ANSWER)
        .read_to_string(&mut line)
        .is_ok();
    let line = line.trim();
    if answered && !line.is_empty() && line.chars().all(|c| !c.is_control()) {
        return line.to_owned();
    }
    match pid {
        Some(pid) => format!("a process (PID {pid}) that did not say who it is"),
        None => "a process in another PID namespace that did not say who it is".into(),
    }
}

/// Answers every connection with `description` until the listener is shut
/// down.
fn answer(listener: &UnixListener, description: &str) {
    loop {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_write_timeout(Some(ANSWER_TIMEOUT));
                let _ = writeln!(s, "{description}");
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Shut down (EINVAL) or the descriptor is gone: the claim ends.
            Err(_) => return,
        }
    }
}

/// A [`Claimant`] in `role` with key directory `key_dir`.
pub fn claimant(role: &'static str, key_dir: &Path) -> Claimant {
    Claimant {
        role,
        key_dir: key_dir.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> String {
        format!("test-{}", uuid::Uuid::new_v4())
    }

    #[test]
    fn a_second_claim_is_refused_naming_the_holder_and_free_once_released() {
        let row = row();
        let first = claim(None, &row, &claimant("agent", Path::new("/keys/a"))).unwrap();
        let err = claim(None, &row, &claimant("agent", Path::new("/keys/b"))).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("(PID {})", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("/keys/a"), "{msg}");
        assert!(msg.contains(&row), "{msg}");
        drop(first);
        // Released synchronously: claimable again at once.
        let again = claim(None, &row, &claimant("cleanup", Path::new("/keys/b"))).unwrap();
        assert_eq!(again.row(), row);
    }

    #[test]
    fn claims_of_other_rows_do_not_collide() {
        let a = claim(None, &row(), &claimant("agent", Path::new("/a"))).unwrap();
        let b = claim(None, &row(), &claimant("agent", Path::new("/b"))).unwrap();
        assert_ne!(a.row(), b.row());
    }
}
