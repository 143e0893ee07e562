//! One lab at a time, and `down` after the lab crashed: a process standing
//! in for the lab (it holds the lock, as a lab does, from another process)
//! with a namespace of the lab's prefix and a directory, then SIGKILLed;
//! `down` finds and removes what it left, and a second `down` finds
//! nothing.

// Real processes in real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lab::state::{LabLock, LabState, NETNS_PREFIX, Process, StateError, down, read_state};

fn lab_netns() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{NETNS_PREFIX}-")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_second_lab_is_refused_and_down_removes_a_crashed_labs_leftovers() {
    let run = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let made = scratch.path().join("koi-lab-node-0");
    std::fs::create_dir_all(made.join("etc")).unwrap();

    // The "lab": one process holding the lock (flock(1) on an inherited
    // descriptor) and a namespace named as testbed names them,
    // `<prefix>-<pid>-<n>`.
    let lock = run.path().join("lock");
    let script = format!(
        "exec 9>'{}' && flock -n 9 && ip netns add koi-lab-$$-0 && echo up && exec sleep 600",
        lock.display()
    );
    let mut lab = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(lab.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "up");
    let pid = lab.id();
    let state = LabState {
        process: Process::of(pid).unwrap(),
        started: 1_800_000_000,
        kernel: "host".into(),
        guest: None,
        dirs: vec![made.clone()],
    };
    std::fs::write(run.path().join("state.json"), state.encode().unwrap()).unwrap();
    assert!(lab_netns().contains(&format!("{NETNS_PREFIX}-{pid}-0")));

    // A second lab is refused, naming the running one.
    let mine = LabState {
        process: Process::current().unwrap(),
        ..state.clone()
    };
    let e = LabLock::acquire(run.path(), &mine).unwrap_err();
    assert!(matches!(e, StateError::AlreadyRunning(Some(ref s)) if s.process.pid == pid));
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("PID {pid}")) && msg.contains("kube-ovn-ipsec-lab down"),
        "{msg}"
    );
    assert_eq!(read_state(run.path()).unwrap(), Some(state.clone()));

    // The lab crashes (SIGKILL: no cleanup of its own); down removes what
    // it left.
    lab.kill().unwrap();
    lab.wait().unwrap();
    let t = Instant::now();
    let report = down(run.path()).unwrap();
    println!("down in {:?}: {report:?}", t.elapsed());
    assert!(report.stopped.is_empty(), "the lab was already dead");
    assert_eq!(report.dirs, std::slice::from_ref(&made));
    assert!(!made.exists());
    assert!(
        !lab_netns().contains(&format!("{NETNS_PREFIX}-{pid}-0")),
        "{:?}",
        lab_netns()
    );
    assert_eq!(read_state(run.path()).unwrap(), None);
    // Nothing left to do, and a new lab may start.
    assert_eq!(down(run.path()).unwrap(), Default::default());
    let held = LabLock::acquire(run.path(), &mine).unwrap();
    assert_eq!(read_state(run.path()).unwrap(), Some(mine));
    drop(held);
}

#[test]
fn down_stops_a_running_lab() {
    let run = tempfile::tempdir().unwrap();
    let mut lab = Command::new("sleep").arg("600").spawn().unwrap();
    let running = Process::of(lab.id()).unwrap();
    // A recorded process whose PID now names another one (its start time
    // differs) is never signalled.
    let reused = LabState {
        process: Process {
            start: running.start + 1,
            ..running
        },
        started: 1_800_000_000,
        kernel: "host".into(),
        guest: None,
        dirs: vec![],
    };
    std::fs::write(run.path().join("state.json"), reused.encode().unwrap()).unwrap();
    assert!(down(run.path()).unwrap().stopped.is_empty());
    assert!(
        lab.try_wait().unwrap().is_none(),
        "a reused PID was signalled"
    );
    let state = LabState {
        process: running,
        ..reused
    };
    std::fs::write(run.path().join("state.json"), state.encode().unwrap()).unwrap();
    let report = down(run.path()).unwrap();
    assert_eq!(report.stopped, [lab.id()]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "still running after down");
        std::thread::sleep(Duration::from_millis(20));
    }
    // An unusable state file: said, and the prefix is still cleaned.
    std::fs::write(run.path().join("state.json"), "{garbage").unwrap();
    let report = down(run.path()).unwrap();
    assert!(report.unusable_state.is_some(), "{report:?}");
    assert_eq!(read_state(run.path()).unwrap(), None);
}
