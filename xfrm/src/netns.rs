//! Opening kernel handles in another network namespace: a netlink socket
//! and a `/proc/net` file belong to the namespace they were opened in, for
//! their whole life, so a short-lived helper thread enters the namespace,
//! opens them and exits; the caller keeps using them from any thread.

use std::fs::File;
use std::io;

use crate::Error;

/// Runs `open` on a helper thread inside the named network namespace
/// (`/run/netns/<name>`, as `ip netns add` creates them).
pub fn run_in<T: Send + 'static>(
    name: &str,
    open: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let path = std::path::Path::new("/run/netns").join(name);
    let file = File::open(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
            Error::Netlink {
                what: "setns into the network namespace",
                source: e.into(),
            }
        })?;
        open()
    })
    .join()
    .map_err(|_| Error::Netlink {
        what: "namespace helper thread",
        source: io::Error::other("panicked"),
    })?
}
