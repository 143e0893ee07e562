//! `ovs-appctl` as the design's troubleshooting line writes it: in the
//! `ipsec` container, a bare `ovs-appctl ipsec/show` reaches the agent,
//! while every other command still reaches ovs-vswitchd.
//!
//! A bare `ovs-appctl` talks to the target `ovs-vswitchd`; only `-t <the
//! agent's socket>` reaches the agent. The image links
//! `/usr/local/bin/ovs-appctl` (ahead of `/usr/bin` on the container's
//! `PATH`) to the agent binary; started under that name, the binary routes
//! an `ipsec/…` command given without a target to the agent's control
//! socket ([`CTL_ENV`], the same variable the agent's `--ctl-socket`
//! reads) and hands every command line to the real `ovs-appctl`
//! ([`REAL_OVS_APPCTL`]), so replies, errors and exit codes are that
//! tool's own. A command line that names a target is passed through
//! unchanged.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// The name under which the agent binary acts as `ovs-appctl`.
pub const PROGRAM: &str = "ovs-appctl";

/// Open vSwitch's own `ovs-appctl`, which every command line goes to.
pub const REAL_OVS_APPCTL: &str = "/usr/bin/ovs-appctl";

/// Where the image links the agent binary as `ovs-appctl`.
pub const IMAGE_LINK: &str = "/usr/local/bin/ovs-appctl";

/// The environment variable naming the agent's control socket (the
/// agent's `--ctl-socket`).
pub const CTL_ENV: &str = "OVN_IPSEC_CTL";

/// The agent's control socket when [`CTL_ENV`] is not set (the agent's
/// `--ctl-socket` default).
pub const DEFAULT_CTL: &str = "/var/run/openvswitch/kube-ovn-ipsec.ctl";

/// The agent's commands: what a bare `ovs-appctl` routes to its socket.
const AGENT_PREFIX: &str = "ipsec/";

/// Options of `ovs-appctl` (3.1) whose value may be the next argument.
const WITH_VALUE: [&str; 6] = [
    "-t",
    "--target",
    "-T",
    "--timeout",
    "--syslog-method",
    "--syslog-target",
];

/// Whether `program` (a path, as `argv[0]`) names `ovs-appctl`.
pub fn invoked_as_appctl(program: &OsStr) -> bool {
    Path::new(program)
        .file_name()
        .is_some_and(|n| n == OsStr::new(PROGRAM))
}

/// The arguments to give the real `ovs-appctl` for `args` (without
/// `argv[0]`): `--target=<ctl>` in front when no target is named and the
/// command is one of the agent's; otherwise `args` unchanged.
pub fn route(args: &[OsString], ctl: &Path) -> Vec<OsString> {
    let mut command = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if a == "--" {
            command = args.get(i + 1);
            break;
        }
        if !a.starts_with('-') || a == "-" {
            command = Some(&args[i]);
            break;
        }
        if names_target(&a) {
            return args.to_vec();
        }
        // A value in the next argument is skipped, not taken for the
        // command.
        if WITH_VALUE.contains(&a.as_ref()) {
            i += 1;
        }
        i += 1;
    }
    let ours = command.is_some_and(|c| c.to_string_lossy().starts_with(AGENT_PREFIX));
    if !ours {
        return args.to_vec();
    }
    let mut target = OsString::from("--target=");
    target.push(ctl.as_os_str());
    std::iter::once(target)
        .chain(args.iter().cloned())
        .collect()
}

/// Whether option `a` names a target: `-t`, `-tX`, `--target[=X]`, or a
/// prefix of `--target` that getopt would take for it.
fn names_target(a: &str) -> bool {
    if a.starts_with("-t") && !a.starts_with("--") {
        return true;
    }
    let name = a.split('=').next().unwrap_or(a);
    name.len() >= 4 && "--target".starts_with(name)
}

/// Runs the real `ovs-appctl` with `args` routed: replaces this process,
/// so what the operator sees is the tool's own output and exit code.
/// Returns only when it could not be started.
pub fn exec(args: &[OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let ctl = std::env::var_os(CTL_ENV).unwrap_or_else(|| DEFAULT_CTL.into());
    let err = std::process::Command::new(REAL_OVS_APPCTL)
        .args(route(args, Path::new(&ctl)))
        .exec();
    eprintln!("ovs-appctl: cannot run {REAL_OVS_APPCTL}: {err}");
    std::process::ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(args: &[&str]) -> Vec<String> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        route(&args, Path::new("/run/x/agent.ctl"))
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn an_agent_command_without_a_target_goes_to_the_agent() {
        assert_eq!(
            routed(&["ipsec/show"]),
            ["--target=/run/x/agent.ctl", "ipsec/show"]
        );
        assert_eq!(
            routed(&["-T", "5", "ipsec/refresh"]),
            ["--target=/run/x/agent.ctl", "-T", "5", "ipsec/refresh"]
        );
        assert_eq!(
            routed(&["--", "ipsec/show"]),
            ["--target=/run/x/agent.ctl", "--", "ipsec/show"]
        );
    }

    #[test]
    fn everything_else_is_passed_through() {
        for args in [
            &["dpif/show"][..],
            &["version"],
            &["-t", "ovsdb-server", "ipsec/show"],
            &["-tovs-monitor-ipsec", "ipsec/show"],
            &["--target=/tmp/a.ctl", "ipsec/show"],
            &["--targ", "a", "ipsec/show"],
            &["-T", "ipsec/show", "list-commands"],
            &["--help"],
            &[],
        ] {
            assert_eq!(routed(args), args, "{args:?}");
        }
    }

    #[test]
    fn the_image_links_the_binary_as_ovs_appctl() {
        let dockerfile = include_str!("../../image/Dockerfile");
        let link = format!("ln -s /kube-ovn/kube-ovn-ipsec {IMAGE_LINK}");
        assert!(
            dockerfile.contains(&link),
            "image/Dockerfile lacks `{link}`"
        );
    }

    #[test]
    fn only_the_name_ovs_appctl_makes_the_binary_one() {
        assert!(invoked_as_appctl(OsStr::new("/usr/local/bin/ovs-appctl")));
        assert!(invoked_as_appctl(OsStr::new("ovs-appctl")));
        assert!(!invoked_as_appctl(OsStr::new("/kube-ovn/kube-ovn-ipsec")));
        assert!(!invoked_as_appctl(OsStr::new("ovs-appctl2")));
    }
}
